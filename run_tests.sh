#!/usr/bin/env bash
# Sets up ./.venv if needed and runs the test suite (extra arguments go to pytest; one that names a test file
# runs that file only); the log ends with the 30 slowest tests, where the CI time goes. `--quick` first runs the quick tier only (-m "not slow": the
# float64 references, the unit tests, the registry-wide kit on one layer per family, the architecture and
# docs checks); which tests are slow is decided by the collection hook in tests/conftest.py (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")"
TIER=()
if [ "${1:-}" = "--quick" ]; then
  TIER=(-m "not slow")
  shift
fi
# The whole tests/ folder unless an argument names a test path (tests/test_docs.py, tests/test_x.py::test_y).
WHERE=(tests)
for arg in "$@"; do
  if [ -e "${arg%%::*}" ]; then WHERE=(); break; fi
done
source scripts/setup_env.sh
exec python -m pytest -q -n "${LRA_TEST_WORKERS:-2}" --dist worksteal --durations=30 "${TIER[@]}" "$@" "${WHERE[@]}"
