"""The benchmark scripts, by purpose (docs/benchmarks.md lists each by the question it answers).

- ``harness/``: what the scripts share (ports, the training command line, results files, the
  workloads and baselines, the outside arms, shaped links, stragglers). It imports no script.
- ``races/``: hogwild against DDP, DDP's hooks, torchft's DiLoCo and mnist_hogwild.
- ``models/``: virtual-clock and in-process models of the sync and optimizer rules.
- ``measures/``: what a run costs on one machine (start-up, memory, streams, compile).
- ``chaos/``: faults (the elastic campaign, a lost replica).
- ``device/``: the runs of a lent GPU machine.

Every script runs from the repository root (``python scripts/races/link.py --help``): it puts the
root on ``sys.path`` and imports the others by their package path (``scripts.harness.common``);
no script imports one that imports it back (tests/test_scripts.py).
"""
