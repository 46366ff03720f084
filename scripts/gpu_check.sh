#!/usr/bin/env bash
# One lease, one script: spends a 15-minute device lease (one command of <= 10 minutes, start-up included) on
# the accelerator checklist, in this order, each phase skipping what an earlier lease finished:
#   0. prints the device (jax.devices()) and the versions of jax, jaxlib, flax, optax, orbax;
#   1. the conformance kit (lra_bench.testing) on one layer per family of the registry (the sequence mixers'
#      families too), every check under jax.default_matmul_precision("highest") (true float32 products: the
#      kit's tolerances are float32 round-off, and a GPU's default TF32 failed them on an H100); one line per
#      layer in results/kit.jsonl, and a layer already there is not run again;
#   2. the LRA Table 2 benchmark in bfloat16 (--set precision=bfloat16; Text model, batch 32, lengths
#      1024-4096, --mode train, every registered attention, the baselines and LRA Table 1's models first),
#      then the check that flash ran a fused kernel (its records' attention_implementation: cudnn or pallas),
#      with a loud line when it did not; a point an earlier lease measured is not measured again;
#  2b. exact attention alone (vanilla, flash) in bench modes core (forward + backward) and core_forward (forward),
#      lengths 1K-16K, batch 8, bfloat16: the rows the report sets beside FlashAttention-2's Fig. 4 (attention
#      FLOP/s with FA2's count, "Published anchors");
#   3. if the lease has time left: one `lra` ListOps cell of vanilla trained to completion (`lra-bench suite
#      --protocol lra --tasks listops --attentions vanilla`; data generated on the machine, numpy pipeline). At
#      the deadline the cell stops at a step boundary with its checkpoint, packed into train_unfinished.tar.gz
#      beside results/ (run directories are not committed: reports/**/runs/ is ignored), which the next lease
#      unpacks and continues; a cell with a record is not trained again;
#   4. writes the report (lra-bench report) into reports/gpu_<device>/report.
# Everything goes to reports/gpu_<device>/ (the layout of every study in reports/, docs/results.md): results/
# holds the records and the run's other output (device.txt, kit.jsonl, kit.txt, train_log.txt). Commit the
# folder after a lease and run the same command on the next one: it continues where this one stopped.
#
# Needs: Python >= 3.11 with this repository's core dependencies and a GPU build of jax, e.g.
#     pip install -e '.[gpu]'          # jax[cuda12]; '.[gpu-cuda13]' for CUDA 13; '.[tpu]' on a TPU VM
# or, on an image that already ships jax/flax/optax/orbax:
#     pip install --no-deps -e . && pip install ml-collections absl-py pandas matplotlib pillow tqdm pytest pytest-timeout pytest-xdist
# TensorFlow is not needed. Invoke from anywhere:
#     bash scripts/gpu_check.sh                   # the full check (a GPU must be visible to jax)
#     GPU_CHECK_SMOKE=1 bash scripts/gpu_check.sh # CPU smoke: the same phases, tiny (1 length, vanilla and flash,
#                                                 # a 1-layer model, the kit on vanilla, a smoke ListOps cell)
#
# Timing (one H100, 2026-11-27, reports/gpu_nvidia-h100-80gb-hbm3/README.md): a point of the Text model compiles
# in 8-20 s alone on the device; a timed attention costs 25-65 s (start-up, one compile per length, 1 warm-up + 3
# timed steps): 45 attentions x 3 lengths need about three leases. Generating LRA's ListOps takes 2-3 minutes
# (scripts/gpu_train.sh), so the training phase starts only with GPU_CHECK_TRAIN_MIN_S left.
# Budgets (seconds, environment): GPU_CHECK_KIT_BUDGET_S (120), GPU_CHECK_BENCH_BUDGET_S (300),
#   GPU_CHECK_CORE_BUDGET_S (90), GPU_CHECK_TOTAL_BUDGET_S (540: the training phase stops by then),
#   GPU_CHECK_TRAIN_MIN_S (150).
# Settings (environment): PYTHON (python3), GPU_CHECK_OUT (reports/gpu_<device>), GPU_CHECK_KIT_LAYERS
#   ("families": one layer per family; or a comma list), GPU_CHECK_SKIP_KIT=1 (or GPU_CHECK_SKIP_TESTS=1),
#   GPU_CHECK_LENGTHS (1024,2048,4096), GPU_CHECK_CORE_LENGTHS (1024,...,16384), GPU_CHECK_CORE_BATCH (8),
#   GPU_CHECK_ATTENTIONS (all, LRA Table 1 first; a list keeps its order),
#   GPU_CHECK_BATCH (32), GPU_CHECK_REPEATS (3), GPU_CHECK_PRECISION (bfloat16), GPU_CHECK_SKIP_TRAIN=1,
#   GPU_CHECK_TRAIN_SETS (more --set items for the cell, space-separated), GPU_CHECK_DATA_DIR (/tmp/lra_data), GPU_CHECK_SKIP_REPORT=1 (write the report elsewhere),
#   JAX_COMPILATION_CACHE_DIR (~/.cache/lra-bench/jax).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # the phases' processes follow one another on the device
export TF_CPP_MIN_LOG_LEVEL=3
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$HOME/.cache/lra-bench/jax}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
START=$(date +%s)
SMOKE="${GPU_CHECK_SMOKE:-0}"

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[gpu_check +$(elapsed)s] $*"; }

# 0. Device and versions -----------------------------------------------------------------------------
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
  LENGTHS="${GPU_CHECK_LENGTHS:-64}"; ATTENTIONS="${GPU_CHECK_ATTENTIONS:-vanilla,flash}"
  BATCH="${GPU_CHECK_BATCH:-2}"; REPEATS="${GPU_CHECK_REPEATS:-2}"
  CORE_LENGTHS="${GPU_CHECK_CORE_LENGTHS:-64}"; CORE_BATCH="${GPU_CHECK_CORE_BATCH:-2}"
  # A one-layer, 16-wide Text model: the same code path, seconds to compile on a CPU.
  SETS=(--set model.num_layers=1 --set model.emb_dim=16 --set model.qkv_dim=16 --set model.mlp_dim=32
        --set model.num_heads=2)
  KIT_LAYERS="${GPU_CHECK_KIT_LAYERS:-vanilla}"; KIT_QUICK=1
  # The smoke protocol's ListOps cell on a tiny generated set (scripts/gpu_train.sh's smoke): seconds.
  TRAIN_PROTOCOL=smoke
  TRAIN_SETS=(data.options.name=tiny data.max_length=48 batch_size=4 num_train_steps=8 eval_every=4
              checkpoint_every=4 log_every=4 model.num_layers=1 model.emb_dim=16 model.qkv_dim=16 model.mlp_dim=32)
  PREPARE=(--name tiny --num_train 40 --num_val 8 --num_test 8 --min_length 10 --max_expression_length 40)
  DEFAULT_OUT="reports/gpu_check_smoke_${DEVICE_SLUG}_$(date +%Y-%m-%d)"
else
  LENGTHS="${GPU_CHECK_LENGTHS:-1024,2048,4096}"; ATTENTIONS="${GPU_CHECK_ATTENTIONS:-all}"
  BATCH="${GPU_CHECK_BATCH:-32}"; REPEATS="${GPU_CHECK_REPEATS:-3}"
  # phase 2b: FA2's Fig. 4 runs 512-16K; batch 8 of the Text model's 4 heads x 64 (the H200 modern-layers study's)
  CORE_LENGTHS="${GPU_CHECK_CORE_LENGTHS:-1024,2048,4096,8192,16384}"; CORE_BATCH="${GPU_CHECK_CORE_BATCH:-8}"
  SETS=()
  KIT_LAYERS="${GPU_CHECK_KIT_LAYERS:-families}"; KIT_QUICK=0
  TRAIN_PROTOCOL=lra
  TRAIN_SETS=()
  PREPARE=()
  DEFAULT_OUT="reports/gpu_${DEVICE_SLUG}"
fi
PRECISION="${GPU_CHECK_PRECISION:-bfloat16}"
read -r -a EXTRA_TRAIN_SETS <<<"${GPU_CHECK_TRAIN_SETS:-}"  # more --set items for the training cell
TRAIN_SETS+=("${EXTRA_TRAIN_SETS[@]}")
OUT="${GPU_CHECK_OUT:-$DEFAULT_OUT}"
RESULTS="$OUT/results"
mkdir -p "$RESULTS" "$JAX_COMPILATION_CACHE_DIR"
TOTAL_DEADLINE=$(( START + ${GPU_CHECK_TOTAL_BUDGET_S:-540} ))
say "output: $OUT; lengths $LENGTHS, batch $BATCH, precision $PRECISION, attentions $ATTENTIONS"
{ echo "== run of $(date -u +%Y-%m-%dT%H:%MZ)"; echo "$(sed -n 2,3p <<<"$DEVICE_INFO")"
  echo "command: GPU_CHECK_SMOKE=$SMOKE bash scripts/gpu_check.sh"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"; } >> "$RESULTS/device.txt"  # one entry per run
phase() { say "phase $1: $2"; echo "phase $1: $2 ($(date -u +%H:%M:%SZ))" >> "$RESULTS/device.txt"; }

# 1. The kit on one layer per family, at the highest matmul precision ---------------------------------------
KIT_STATUS="skipped"
if [ "${GPU_CHECK_SKIP_KIT:-${GPU_CHECK_SKIP_TESTS:-0}}" != "1" ]; then
  phase 1 "conformance kit, one layer per family, matmul precision highest (budget ${GPU_CHECK_KIT_BUDGET_S:-120} s)"
  timeout "${GPU_CHECK_KIT_BUDGET_S:-120}" "$PY" - "$KIT_LAYERS" "$RESULTS/kit.jsonl" "$KIT_QUICK" <<'EOF' \
    2>&1 | tee -a "$RESULTS/kit.txt"
import json
import os
import sys

import jax

import attention_zoo
from attention_zoo.registry import FAMILIES, layer_family
from lra_bench import testing

wanted, log, quick = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
# One representative per family (the mixers' families too): a family's best-known layer where it has one of
# these, else its first registered name; families in the registry's order, a plugin's after them.
PREFERRED = ("vanilla", "local", "linformer", "performer", "reformer", "combiner_fixed", "fnet", "s4d", "mega",
             "gla", "mamba2")
if wanted == "families":
  by_family = {}
  for name in sorted(attention_zoo.list_layers(), key=lambda n: (n not in PREFERRED, n)):
    by_family.setdefault(layer_family(name), name)
  layers = [by_family[f] for f in FAMILIES if f in by_family]
  layers += [by_family[f] for f in sorted(by_family) if f not in FAMILIES]
else:
  layers = [n for n in wanted.split(",") if n]
done = set()
if os.path.exists(log):
  with open(log) as f:
    done = {json.loads(line)["layer"] for line in f if line.strip()}
print(f"kit on {', '.join(layers)} ({jax.default_backend()}); done by an earlier run: "
      f"{', '.join(n for n in layers if n in done) or 'none'}", flush=True)
failed = 0
for name in layers:
  if name in done:
    continue
  with jax.default_matmul_precision("highest"):  # testing.run_guarded sets it around each check too
    checks = testing.run_conformance(name, quick=quick)
  bad = [c for c in checks if c.passed is False]
  failed += bool(bad)
  print(f"{name} ({layer_family(name)}): {len(checks) - len(bad)}/{len(checks)} passed"
        + "".join(f"\n  FAILED {c.name}: {c.measured} {c.detail}" for c in bad), flush=True)
  with open(log, "a") as f:
    f.write(json.dumps({"layer": name, "family": layer_family(name), "backend": jax.default_backend(),
                        "matmul_precision": "highest", "quick": quick,
                        "checks": [{"check": c.name, "passed": c.passed, "measured": c.measured} for c in checks]})
            + "\n")
sys.exit(1 if failed else 0)
EOF
  rc=${PIPESTATUS[0]}
  case "$rc" in
    0) KIT_STATUS="passed" ;;
    124) KIT_STATUS="stopped at its time budget (the next run continues; see $RESULTS/kit.txt)" ;;
    *) KIT_STATUS="FAILED (exit $rc; see $RESULTS/kit.txt)" ;;
  esac
  say "kit: $KIT_STATUS"
fi

# 2. LRA Table 2 benchmark in bfloat16, one attention at a time alone on the device ---------------------------
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
BENCH_ARGS=(--lengths "$LENGTHS" --batch_size "$BATCH" --mode train --set "precision=$PRECISION" "${SETS[@]}")
phase 2 "LRA Table 2 bench, precision $PRECISION (budget ${GPU_CHECK_BENCH_BUDGET_S:-300} s)"
BENCH_DEADLINE=$(( $(date +%s) + ${GPU_CHECK_BENCH_BUDGET_S:-300} ))
NOT_RUN=()
for name in $NAMES; do
  left=$(( BENCH_DEADLINE - $(date +%s) ))
  if [ "$left" -le 10 ]; then NOT_RUN+=("$name"); continue; fi
  timeout "$left" "$PY" -m lra_bench bench --attentions "$name" "${BENCH_ARGS[@]}" --repeats "$REPEATS" \
    --warmup_steps 1 --noisolate --results_dir "$RESULTS" 2>&1 | tr '\r' '\n' | grep -v -e "^bench train" -e "^$" | tail -n 3
  [ "${PIPESTATUS[0]}" = 124 ] && NOT_RUN+=("$name (stopped at the budget)")
done
# Did flash run fused? Its ok records at this precision: attention_implementation cudnn / pallas = fused.
FUSED_STATUS="$("$PY" - "$RESULTS" "$PRECISION" <<'EOF'
import sys

from lra_bench.experiments import results

records, _ = results.read_records(sys.argv[1])
flash = [r for r in results.latest_records(x for x in records if x.get("kind") == "bench")
         if r.get("attention") == "flash" and r.get("status") == "ok" and r.get("mode") == "train"
         and sys.argv[2] in (r.get("compute_dtype"), (r.get("config") or {}).get("precision"))]
if not flash:
  print(f"not measured (no ok flash record in {sys.argv[2]})")
else:
  ran = sorted({str(r.get("attention_implementation") or "not recorded") for r in flash})
  fused = all(name in ("cudnn", "pallas") for name in ran)
  print(("fused: " if fused else "NOT FUSED: ") + ", ".join(ran)
        + f" (lengths {', '.join(str(r['max_length']) for r in flash)})")
EOF
)" || FUSED_STATUS="not checked (the records could not be read)"
case "$FUSED_STATUS" in
  fused*) say "flash: $FUSED_STATUS" ;;
  *) say "!!!!!!!! flash: $FUSED_STATUS: no fused kernel compiled (or none was recorded), so flash's numbers" \
         "are NOT a fused attention's !!!!!!!!" ;;
esac
echo "flash: $FUSED_STATUS" >> "$RESULTS/device.txt"

# 2b. Exact attention alone (vanilla, flash), forward + backward and forward, the rows FA2's figure sits beside --
# (the report's "attention FLOP/s (FA2 count)" and "Published anchors" read mode core / core_forward records)
phase 2b "exact attention alone, modes core and core_forward, lengths $CORE_LENGTHS, batch $CORE_BATCH, precision \
$PRECISION (budget ${GPU_CHECK_CORE_BUDGET_S:-90} s)"
CORE_DEADLINE=$(( $(date +%s) + ${GPU_CHECK_CORE_BUDGET_S:-90} ))
for mode in core core_forward; do
  left=$(( CORE_DEADLINE - $(date +%s) ))
  if [ "$left" -le 10 ]; then NOT_RUN+=("vanilla,flash --mode $mode"); continue; fi
  timeout "$left" "$PY" -m lra_bench bench --attentions vanilla,flash --lengths "$CORE_LENGTHS" \
    --batch_size "$CORE_BATCH" --mode "$mode" --set "precision=$PRECISION" "${SETS[@]}" --repeats "$REPEATS" \
    --warmup_steps 1 --noisolate --results_dir "$RESULTS" 2>&1 | tr '\r' '\n' | grep -v -e "^bench core" -e "^$" | tail -n 3
  [ "${PIPESTATUS[0]}" = 124 ] && NOT_RUN+=("vanilla,flash --mode $mode (stopped at the budget)")
done

# 3. One ListOps cell of vanilla to completion, if the lease has time left ----------------------------------
TRAIN_STATUS="skipped (GPU_CHECK_SKIP_TRAIN=1)"
TRAIN_PACK="$OUT/train_unfinished.tar.gz"
TRAIN_LEFT=$(( TOTAL_DEADLINE - $(date +%s) ))
if [ "${GPU_CHECK_SKIP_TRAIN:-0}" = "1" ]; then
  :
elif [ "$TRAIN_LEFT" -lt "${GPU_CHECK_TRAIN_MIN_S:-150}" ]; then
  TRAIN_STATUS="not started: ${TRAIN_LEFT} s left, fewer than GPU_CHECK_TRAIN_MIN_S=${GPU_CHECK_TRAIN_MIN_S:-150}"
  say "training: $TRAIN_STATUS"
else
  phase 3 "one $TRAIN_PROTOCOL ListOps cell of vanilla to completion (${TRAIN_LEFT} s left)"
  DATA="${GPU_CHECK_DATA_DIR:-/tmp/lra_data}"
  mkdir -p "$DATA"
  if [ -f "$TRAIN_PACK" ]; then
    tar xzf "$TRAIN_PACK" -C "$RESULTS" && say "unpacked the last lease's unfinished cell ($TRAIN_PACK)"
  fi
  if ! "$PY" -m lra_bench data prepare listops --protocol "$TRAIN_PROTOCOL" --data_dir "$DATA" "${PREPARE[@]}" \
      > "$RESULTS/train_prepare.log" 2>&1; then
    tail -n 5 "$RESULTS/train_prepare.log"
    TRAIN_STATUS="FAILED (data prepare; see $RESULTS/train_prepare.log)"
  else
    left=$(( TOTAL_DEADLINE - $(date +%s) ))
    # SIGINT at the deadline: the cell stops at a step boundary with its checkpoint (SIGKILL 60 s later)
    timeout -s INT -k 60 "$(( left > 1 ? left : 1 ))" "$PY" -m lra_bench suite --protocol "$TRAIN_PROTOCOL" \
      --tasks listops --attentions vanilla --results_dir "$RESULTS" --data_dir "$DATA" --set data.pipeline=numpy \
      "${TRAIN_SETS[@]/#/--set=}" > "$RESULTS/train_log.txt" 2>&1
    rc=$?
    tail -n 3 "$RESULTS/train_log.txt"
    RUNS="$(cd "$RESULTS" && find "runs/$TRAIN_PROTOCOL/listops/vanilla" -mindepth 1 -maxdepth 1 -type d 2>/dev/null)"
    if [ "$rc" = 0 ]; then
      TRAIN_STATUS="done (record in $RESULTS/results.jsonl)"
      rm -f "$TRAIN_PACK"
    else
      TRAIN_STATUS="not finished (exit $rc)"
      if [ -n "$RUNS" ]; then
        # shellcheck disable=SC2086  # one path per word
        tar czf "$TRAIN_PACK" --exclude=.lock -C "$RESULTS" $RUNS 2>/dev/null \
          && TRAIN_STATUS+="; its checkpoint packed into $TRAIN_PACK, which the next run continues"
      fi
    fi
  fi
  say "training: $TRAIN_STATUS"
fi

# 4. Report (needs no accelerator: GPU_CHECK_SKIP_REPORT=1 leaves it to `lra-bench report` elsewhere) -------
REPORT_RC=0
REPORT_STATUS="skipped (GPU_CHECK_SKIP_REPORT=1)"
if [ "${GPU_CHECK_SKIP_REPORT:-0}" != "1" ]; then
  phase 4 "report"
  "$PY" -m lra_bench report --results_dir "$RESULTS" --out "$OUT/report" 2>&1 | tail -n 3
  REPORT_RC=${PIPESTATUS[0]}
  REPORT_STATUS="$OUT/report/index.md"
  [ "$REPORT_RC" = 0 ] || REPORT_STATUS="FAILED (exit $REPORT_RC)"
fi

say "done in $(elapsed) s: kit $KIT_STATUS; flash $FUSED_STATUS; training $TRAIN_STATUS; report $REPORT_STATUS"
if [ "${#NOT_RUN[@]}" -gt 0 ]; then
  say "not measured within the budget (rerun the same command to continue): ${NOT_RUN[*]}"
fi
[ "$REPORT_RC" = 0 ] && [[ "$KIT_STATUS" != FAILED* ]] && [[ "$TRAIN_STATUS" != FAILED* ]]
