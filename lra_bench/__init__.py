"""lra-bench: the Long-Range Arena harness, in three wings that follow the data: ``training`` (one config),
``experiments`` (many runs, one record each) and ``report`` (records -> tables and figures), with the command
modules on top. Imports go one way: report -> experiments -> training, never back. The module map, the
data flow and the contracts are in docs/ARCHITECTURE.md (the one map, checked by tests/test_docs.py).
"""

import os as _os

__version__ = "0.1.0"

REPO_ROOT = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))

