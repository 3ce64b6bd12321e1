"""What the benchmark scripts share; it imports no script outside ``scripts/harness/``.

- :mod:`~scripts.harness.common`: a free port, a clean environment, the training command line,
  ``RESULT`` lines, the ``.json`` and ``.md`` files, a busy core, plots.
- :mod:`~scripts.harness.baselines`: the digits workloads and what hogwild is compared with on them
  (one process, DDP, mnist_hogwild), and the bare all_reduce a sync round is measured against.
- :mod:`~scripts.harness.arms`: the language-model race's outside arms (DDP, its fp16 and PowerSGD
  hooks, torchft's DiLoCo), the recipe and the evaluation every arm shares; run per rank.
- :mod:`~scripts.harness.links`: simulated machines in network namespaces on shaped links.
- :mod:`~scripts.harness.delay_router`: a link's one-way delay where the kernel has no ``netem``.
- :mod:`~scripts.harness.stragglers`: stragglers that behave alike in every arm (cgroup quota, stalls).
"""
