"""Races: hogwild against what a user would pick instead (DDP, its fp16 and PowerSGD hooks,
torchft's DiLoCo, mnist_hogwild), on one machine, across shaped links, with stragglers, on
embedding tables. Each races every arm in one invocation, evaluated alike (scripts/harness)."""
