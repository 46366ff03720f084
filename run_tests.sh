#!/usr/bin/env bash
# Sets up ./.venv if needed and runs the test suite (extra arguments go to pytest); the log ends with the
# 30 slowest tests, where the CI time goes. `--quick` first runs the quick tier only (-m "not slow": the
# float64 references, the unit tests, the registry-wide kit on one layer per family, the architecture and
# docs checks); which tests are slow is decided by the collection hook in tests/conftest.py (docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")"
TIER=()
if [ "${1:-}" = "--quick" ]; then
  TIER=(-m "not slow")
  shift
fi
source scripts/setup_env.sh
exec python -m pytest -q -n "${LRA_TEST_WORKERS:-2}" --durations=30 "${TIER[@]}" "$@" tests
