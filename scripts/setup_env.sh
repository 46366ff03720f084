#!/usr/bin/env bash
# Creates ./.venv (Python >= 3.11) and installs lra-bench with its test extra and the example plugin
# examples/my_attention (an attention core from outside the package, exercised by the tests through its
# entry point); a no-op when the installed state already matches both pyproject.toml files. Sourced by
# run_all.sh and run_tests.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LRA_BENCH_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "error: lra-bench needs Python >= 3.11; '$PYTHON' is $("$PYTHON" --version 2>&1). Set PYTHON=/path/to/python3.11+." >&2
    exit 2
  fi
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.lra-bench-installed"
EXAMPLE="$ROOT/examples/my_attention"
WANT="$(cat "$ROOT/pyproject.toml" "$EXAMPLE/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "setting up $VENV (pip install -e '.[test]' and -e examples/my_attention) ..." >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  # Its dependencies are lra-bench's own: --no-deps keeps pip from looking for lra-bench on PyPI.
  "$VENV/bin/python" -m pip install -q --no-deps -e "$EXAMPLE"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"
