#!/usr/bin/env bash
# Sets up ./.venv if needed and runs the test suite (extra arguments go to pytest); the log ends with the
# 30 slowest tests, where the CI time goes.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/setup_env.sh
exec python -m pytest -q -n "${LRA_TEST_WORKERS:-2}" --durations=30 "$@" tests
