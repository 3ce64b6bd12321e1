"""Measures: what a run costs on one machine (start-up, memory, streams, token files,
torch.compile, the optimizer's update paths), hogwild against itself."""
