"""lra-bench: the Long-Range Arena harness, in three wings that follow the data (docs/ARCHITECTURE.md).

- ``lra_bench.training``: train one config (config, parallel, models, optim, steps, checkpoints,
  xla_stats, loop); knows nothing about records or suites.
- ``lra_bench.experiments``: many runs, one record each (cell, suite, bench; ``results`` builds every
  record).
- ``lra_bench.report``: reads records and the published references (reference, accuracy, efficiency,
  index, tables, plots, viz).

``lra_bench.cli`` sits on top. Imports go one way: report -> experiments -> training, never back.
"""

import os as _os

__version__ = "0.1.0"

REPO_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))

