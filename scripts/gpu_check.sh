#!/usr/bin/env bash
# The accelerator checklist: on a machine with a GPU (and jax, possibly without TensorFlow), in about
# 9 minutes of device time (one lease of 15 minutes, start-up included):
#   1. prints the device (jax.devices()) and the versions of jax, jaxlib, flax, optax, orbax;
#   2. runs the attention cores' tests on the GPU (tests/test_attention_registry.py, the kernel and
#      combiner tests and every tests/test_<core>.py; none of them needs TensorFlow);
#   3. runs the LRA Table 2 benchmark: Text model, batch 32, lengths 1024-4096, every registered attention
#      (flash included), --mode train, into reports/gpu_<device>/results, as many as the budget allows;
#   4. writes the report (lra-bench report) into reports/gpu_<device>/report.
# The folder has the layout of every study in reports/ (docs/results.md): results/ holds the records and the
# run's other output too (device.txt, core_tests.txt, compile_warmup/), report/ what lra-bench report writes.
#
# Needs: Python >= 3.11 with this repository's core dependencies and a GPU build of jax, e.g.
#     pip install -e '.[gpu]'          # jax[cuda12]; '.[gpu-cuda13]' for CUDA 13; '.[tpu]' on a TPU VM
# or, on an image that already ships jax/flax/optax/orbax:
#     pip install --no-deps -e . && pip install ml-collections absl-py pandas matplotlib pillow tqdm pytest pytest-timeout pytest-xdist
# TensorFlow is not needed (nothing here reads data). Invoke from anywhere:
#     bash scripts/gpu_check.sh                   # the full check (a GPU must be visible to jax)
#     GPU_CHECK_SMOKE=1 bash scripts/gpu_check.sh # CPU smoke: 1 length, 2 attentions, tiny model
#
# How it fits a 15-minute device lease (one command of <= 10 minutes): measured on one H100 (2026-11-27,
# reports/gpu_nvidia-h100-80gb-hbm3/README.md), a point of the Text model compiles in 8-20 s when its
# process is alone, and in 130-155 s when 11 processes compile at once beside the tests (XLA's GPU
# autotuning does not parallelise): compiling ahead in parallel is a net loss, so it is off by default
# (GPU_CHECK_COMPILERS=0; N > 0 compiles ahead with N processes). A timed attention then costs 25-65 s
# (start-up, one compile per length, 1 warm-up + 3 timed steps): 45 attentions x 3 lengths need about
# three leases. The output folder has no date and its measured points are kept, so the next lease's run
# (after committing the folder) continues where this one stopped; the LRA Table 1 models go first.
# Core tests: the registry-wide conformance kit (tests/test_attention_registry.py, every core x 15
# checks, ~690 tests) by default; GPU_CHECK_ALL_TESTS=1 adds every core's own test file (measured: 7 % of
# them in 190 s on 4 workers, so only with a longer lease).
# Budgets (default, ~9 minutes): core tests 150 s, compile-ahead 0, timing 300 s, report ~1 min.
# Settings (environment): PYTHON (python3), GPU_CHECK_OUT (reports/gpu_<device>),
#   GPU_CHECK_LENGTHS (1024,2048,4096), GPU_CHECK_ATTENTIONS (all, LRA Table 1 first; a list keeps its order), GPU_CHECK_BATCH (32),
#   GPU_CHECK_REPEATS (3), GPU_CHECK_TEST_BUDGET_S (150), GPU_CHECK_COMPILE_BUDGET_S (300),
#   GPU_CHECK_BENCH_BUDGET_S (300), GPU_CHECK_COMPILERS (0), GPU_CHECK_SKIP_TESTS=1, GPU_CHECK_ALL_TESTS=1,
#   GPU_CHECK_TEST_WORKERS (8, pytest-xdist workers), GPU_CHECK_SKIP_REPORT=1 (write the report elsewhere),
#   JAX_COMPILATION_CACHE_DIR (~/.cache/lra-bench/jax).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # several processes share the GPU while compiling
export TF_CPP_MIN_LOG_LEVEL=3
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/lra-bench/jax}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
START=$(date +%s)
SMOKE="${GPU_CHECK_SMOKE:-0}"

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[gpu_check +$(elapsed)s] $*"; }

# 1. Device and versions -----------------------------------------------------------------------------
DEVICE_INFO="$("$PY" - <<'EOF'
import importlib.metadata as md
import re
import jax
devices = jax.devices()
kind = devices[0].device_kind
print(re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-"))
print(f"backend {jax.default_backend()}: {len(devices)} x {kind} ({devices})")
versions = []
for dist in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu"):
  try:
    versions.append(f"{dist} {md.version(dist)}")
  except md.PackageNotFoundError:
    pass
print(", ".join(versions))
print(jax.default_backend())
EOF
)" || { echo "error: jax does not start with $PY (see above); install it: pip install -e '.[gpu]'" >&2; exit 2; }
DEVICE_SLUG="$(sed -n 1p <<<"$DEVICE_INFO")"
BACKEND="$(sed -n 4p <<<"$DEVICE_INFO")"
say "$(sed -n 2p <<<"$DEVICE_INFO")"
say "$(sed -n 3p <<<"$DEVICE_INFO")"
if [ "$BACKEND" = "cpu" ] && [ "$SMOKE" != "1" ]; then
  echo "error: jax sees no accelerator (backend cpu). Install a GPU build (pip install -e '.[gpu]'), or run the" \
       "CPU smoke with GPU_CHECK_SMOKE=1." >&2
  exit 2
fi

if [ "$SMOKE" = "1" ]; then
  LENGTHS="${GPU_CHECK_LENGTHS:-64}"; ATTENTIONS="${GPU_CHECK_ATTENTIONS:-vanilla,local}"
  BATCH="${GPU_CHECK_BATCH:-2}"; REPEATS="${GPU_CHECK_REPEATS:-2}"
  # A one-layer, 16-wide Text model: the same code path, seconds to compile on a CPU.
  SETS=(--set model.num_layers=1 --set model.emb_dim=16 --set model.qkv_dim=16 --set model.mlp_dim=32
        --set model.num_heads=2)
  TESTS=(tests/test_vanilla.py tests/test_local.py)
  DEFAULT_OUT="reports/gpu_check_smoke_${DEVICE_SLUG}_$(date +%Y-%m-%d)"
else
  LENGTHS="${GPU_CHECK_LENGTHS:-1024,2048,4096}"; ATTENTIONS="${GPU_CHECK_ATTENTIONS:-all}"
  BATCH="${GPU_CHECK_BATCH:-32}"; REPEATS="${GPU_CHECK_REPEATS:-3}"
  SETS=()
  TESTS=(tests/test_attention_registry.py)
  if [ "${GPU_CHECK_ALL_TESTS:-0}" = "1" ]; then
    for name in test_attention_kernels test_combiner; do
      [ -f "tests/$name.py" ] && TESTS+=("tests/$name.py")
    done
    for module in attention_zoo/*.py; do  # the cores' own tests are named after their module (_x.py: test_x.py)
      base="$(basename "$module")"; test="tests/test_${base#_}"
      [ -f "$test" ] && TESTS+=("$test")
    done
  fi
  DEFAULT_OUT="reports/gpu_${DEVICE_SLUG}"
fi
OUT="${GPU_CHECK_OUT:-$DEFAULT_OUT}"
RESULTS="$OUT/results"
mkdir -p "$RESULTS" "$JAX_COMPILATION_CACHE_DIR"
say "output: $OUT; lengths $LENGTHS, batch $BATCH, attentions $ATTENTIONS"
{ echo "== run of $(date -u +%Y-%m-%dT%H:%MZ)"; echo "$(sed -n 2,3p <<<"$DEVICE_INFO")"
  echo "command: GPU_CHECK_SMOKE=$SMOKE bash scripts/gpu_check.sh"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"; } >> "$RESULTS/device.txt"  # one entry per run

# 2. Compile the benchmark's points (background, CPU work) ---------------------------------------------
if [ "$ATTENTIONS" = "all" ]; then
  NAMES="$("$PY" -m lra_bench list attentions 2>/dev/null)" || { echo "error: lra-bench list failed" >&2; exit 1; }
else
  NAMES="$(tr ',' '\n' <<<"$ATTENTIONS")"
fi
# With "all": baselines first (every other attention's ratios are against them), then LRA Table 1's models,
# then the rest. A list given in GPU_CHECK_ATTENTIONS is timed in the order given.
if [ "$ATTENTIONS" = "all" ]; then
  FIRST=(vanilla flash local sparse_fixed longformer linformer reformer sinkhorn synthesizer bigbird
         linear_transformer performer)
  NAMES="$( (for n in "${FIRST[@]}"; do grep -x -e "$n" <<<"$NAMES"; done
             grep -v -x "${FIRST[@]/#/-e}" <<<"$NAMES") | sed '/^$/d')"
fi
BENCH_ARGS=(--lengths "$LENGTHS" --batch_size "$BATCH" --mode train "${SETS[@]}")

COMPILERS="${GPU_CHECK_COMPILERS:-0}"
compile_all() {
  [ "$COMPILERS" -gt 0 ] || return 0
  say "compiling every point into the cache in the background ($(wc -l <<<"$NAMES") attentions, $COMPILERS at once, budget ${GPU_CHECK_COMPILE_BUDGET_S:-300} s)"
  COMPILE_DEADLINE=$(( $(date +%s) + ${GPU_CHECK_COMPILE_BUDGET_S:-300} ))
  running=0
  for name in $NAMES; do
    [ "$(date +%s)" -ge "$COMPILE_DEADLINE" ] && break
    left=$(( COMPILE_DEADLINE - $(date +%s) ))
    timeout "$left" "$PY" -m lra_bench bench --attentions "$name" "${BENCH_ARGS[@]}" --compile_only --noisolate \
      --results_dir "$RESULTS/compile_warmup" >/dev/null 2>&1 &
    running=$((running + 1))
    if [ "$running" -ge "$COMPILERS" ]; then wait -n; running=$((running - 1)); fi
  done
  wait
}
compile_all &
COMPILE_PID=$!

# 3. The cores' tests on the device (while the points compile) ---------------------------------------
TEST_STATUS="skipped"
if [ "${GPU_CHECK_SKIP_TESTS:-0}" != "1" ]; then
  XDIST=()
  "$PY" -c "import xdist" 2>/dev/null && [ "$SMOKE" != "1" ] && XDIST=(-n "${GPU_CHECK_TEST_WORKERS:-8}")
  say "pytest on ${#TESTS[@]} files (budget ${GPU_CHECK_TEST_BUDGET_S:-150} s)"
  timeout "${GPU_CHECK_TEST_BUDGET_S:-150}" "$PY" -m pytest -v --tb=line -p no:cacheprovider -p no:benchmark "${XDIST[@]}" "${TESTS[@]}" \
    2>&1 | tee "$RESULTS/core_tests.txt" | tail -n 25
  rc=${PIPESTATUS[0]}
  case "$rc" in
    0) TEST_STATUS="passed" ;;
    124) TEST_STATUS="stopped at its time budget (see $RESULTS/core_tests.txt)" ;;
    *) TEST_STATUS="FAILED (exit $rc; see $RESULTS/core_tests.txt)" ;;
  esac
  say "core tests: $TEST_STATUS"
fi

wait "$COMPILE_PID"
[ "$COMPILERS" -gt 0 ] && say "compiled $(cat "$RESULTS/compile_warmup/results.jsonl" 2>/dev/null | wc -l) points ahead"

# 4. LRA Table 2 benchmark, timed, one attention at a time alone on the device --------------------------
say "timing (budget ${GPU_CHECK_BENCH_BUDGET_S:-300} s)"
BENCH_DEADLINE=$(( $(date +%s) + ${GPU_CHECK_BENCH_BUDGET_S:-300} ))
NOT_RUN=()
for name in $NAMES; do
  left=$(( BENCH_DEADLINE - $(date +%s) ))
  if [ "$left" -le 10 ]; then NOT_RUN+=("$name"); continue; fi
  timeout "$left" "$PY" -m lra_bench bench --attentions "$name" "${BENCH_ARGS[@]}" --repeats "$REPEATS" \
    --warmup_steps 1 --noisolate --results_dir "$RESULTS" 2>&1 | tr '\r' '\n' | grep -v -e "^bench train" -e "^$" | tail -n 3
  [ "${PIPESTATUS[0]}" = 124 ] && NOT_RUN+=("$name (stopped at the budget)")
done

# 5. Report (needs no accelerator: GPU_CHECK_SKIP_REPORT=1 leaves it to `lra-bench report` elsewhere) -------
REPORT_RC=0
REPORT_STATUS="skipped (GPU_CHECK_SKIP_REPORT=1)"
if [ "${GPU_CHECK_SKIP_REPORT:-0}" != "1" ]; then
  say "report"
  "$PY" -m lra_bench report --results_dir "$RESULTS" --out "$OUT/report" 2>&1 | tail -n 3
  REPORT_RC=${PIPESTATUS[0]}
  REPORT_STATUS="$OUT/report/index.md"
  [ "$REPORT_RC" = 0 ] || REPORT_STATUS="FAILED (exit $REPORT_RC)"
fi

say "done in $(elapsed) s: core tests $TEST_STATUS; report $REPORT_STATUS"
if [ "${#NOT_RUN[@]}" -gt 0 ]; then
  say "not measured within the budget (rerun the same command to continue): ${NOT_RUN[*]}"
fi
[ "$REPORT_RC" = 0 ] && [[ "$TEST_STATUS" != FAILED* ]]
