#!/usr/bin/env bash
# Trains whole cells on an accelerator image that has jax but no TensorFlow, several at once on one device,
# inside one device lease (a command of <= 10 minutes): the numpy input pipeline (--set data.pipeline=numpy),
# the data generated on the machine (ListOps and the recall tasks need no download), every cell's record in
# one results.jsonl. What a lease could not finish is packed (its run directories, with their last
# checkpoints) so that the next lease continues it exactly.
#
#   bash scripts/gpu_train.sh                      # the Xiong et al. ListOps column (5 cells), budget 480 s
#   GPU_TRAIN_SMOKE=1 bash scripts/gpu_train.sh    # CPU smoke: tiny ListOps, 2 smoke cells, seconds
#
# Needs: jax with its accelerator plugin, this repository's core dependencies (ml-collections and submitit
# may have to travel as wheels: see reports/gpu_nvidia-h200/README.md) and the tensorboard package for the
# validation curves (without it the records carry none). No TensorFlow.
#
# Settings (environment):
#   GPU_TRAIN_CELLS     protocol:task:attention[:seed],... (default: xiong:listops: vanilla, nystromformer,
#                       linformer, performer, reformer; seed 0)
#   GPU_TRAIN_BUDGET_S  wall seconds for data and training together (480); a cell still running then gets
#                       SIGINT (it stops at a step boundary) and is packed for the next lease
#   GPU_TRAIN_PARALLEL  cells at once (5); each gets XLA_PYTHON_CLIENT_MEM_FRACTION = 0.9 / GPU_TRAIN_PARALLEL
#   GPU_TRAIN_OUT       where results/, train_logs.txt, device.txt and unfinished.tar.gz go
#                       (reports/gpu_<device>_train; $OUT on the device tool)
#   GPU_TRAIN_RESUME    a tar.gz of run directories from an earlier lease (its unfinished.tar.gz) to continue
#   GPU_TRAIN_DATA_DIR  (/tmp/lra_data)   GPU_TRAIN_WORK (/tmp/lra_runs)   PYTHON (python3)
#   GPU_TRAIN_SETS      more --set items for every cell, space-separated (e.g. checkpoint_every=250)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
START=$(date +%s)
SMOKE="${GPU_TRAIN_SMOKE:-0}"
say() { echo "[gpu_train +$(( $(date +%s) - START ))s] $*"; }

DEVICE_INFO="$("$PY" - <<'EOF'
import re
import jax
kind = jax.devices()[0].device_kind
print(re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-"))
print(f"backend {jax.default_backend()}: {jax.device_count()} x {kind}; jax {jax.__version__}")
EOF
)" || { echo "error: jax does not start with $PY" >&2; exit 2; }
say "$(sed -n 2p <<<"$DEVICE_INFO")"

DATA="${GPU_TRAIN_DATA_DIR:-/tmp/lra_data}"
WORK="${GPU_TRAIN_WORK:-/tmp/lra_runs}"
if [ "$SMOKE" = "1" ]; then
  CELLS="${GPU_TRAIN_CELLS:-smoke:listops:vanilla,smoke:listops:local}"
  SETS=(data.options.name=tiny data.max_length=48 batch_size=4 num_train_steps=8 eval_every=4 checkpoint_every=4
        log_every=4 model.num_layers=1 model.emb_dim=16 model.qkv_dim=16 model.mlp_dim=32)
  PREPARE=(--name tiny --num_train 40 --num_val 8 --num_test 8 --min_length 10 --max_expression_length 40)
  DEFAULT_OUT="reports/gpu_train_smoke_$(sed -n 1p <<<"$DEVICE_INFO")"
else
  CELLS="${GPU_TRAIN_CELLS:-xiong:listops:vanilla,xiong:listops:nystromformer,xiong:listops:linformer,xiong:listops:performer,xiong:listops:reformer}"
  SETS=()
  PREPARE=()
  DEFAULT_OUT="reports/gpu_$(sed -n 1p <<<"$DEVICE_INFO")_train"
fi
read -r -a EXTRA <<<"${GPU_TRAIN_SETS:-}"
SETS+=(data.pipeline=numpy "${EXTRA[@]}")
OUT="${GPU_TRAIN_OUT:-$DEFAULT_OUT}"
BUDGET="${GPU_TRAIN_BUDGET_S:-480}"
PARALLEL="${GPU_TRAIN_PARALLEL:-5}"
mkdir -p "$OUT/results" "$WORK" "$DATA"
{ echo "== run of $(date -u +%Y-%m-%dT%H:%MZ)"; sed -n 2p <<<"$DEVICE_INFO"
  echo "cells: $CELLS; sets: ${SETS[*]}"; echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"; } >> "$OUT/device.txt"
if [ -n "${GPU_TRAIN_RESUME:-}" ]; then
  tar xzf "$GPU_TRAIN_RESUME" -C "$WORK" && say "unpacked $GPU_TRAIN_RESUME into $WORK"
fi

# Data: each (protocol, task) once, generated here (seconds for the smoke, ~2-3 min for LRA-size ListOps).
declare -A PREPARED=()
IFS=',' read -r -a CELL_LIST <<<"$CELLS"
for cell in "${CELL_LIST[@]}"; do
  IFS=':' read -r protocol task _ _ <<<"$cell"
  [ -n "${PREPARED[$protocol:$task]:-}" ] && continue
  say "data prepare $task --protocol $protocol"
  "$PY" -m lra_bench data prepare "$task" --protocol "$protocol" --data_dir "$DATA" "${PREPARE[@]}" \
    > "$WORK/prepare.log" 2>&1 || { tail -n 5 "$WORK/prepare.log" >&2; echo "error: data prepare $task failed" >&2; exit 1; }
  PREPARED[$protocol:$task]=1
done

# Cells, PARALLEL at a time; at the deadline the running ones get SIGINT (a second one 60 s later).
FRACTION="$("$PY" -c "print(round(0.9 / $PARALLEL, 3))")"
DEADLINE=$(( START + BUDGET ))
declare -A PIDS=()
run_cell() {  # protocol task attention seed; in a subshell that becomes the run (its PID gets the SIGINT)
  local name="$1_$2_$3_s$4"
  export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION="$FRACTION"
  exec "$PY" -m lra_bench train --protocol "$1" --task "$2" --attention "$3" --seed "$4" --workdir "$WORK/$name" \
    --data_dir "$DATA" --results_dir "$OUT/results" "${SETS[@]/#/--set=}" > "$WORK/$name.log" 2>&1
}
stop_all() {  # SIGINT; those still running 60 s later get a second one (stop at once)
  for name in "${!PIDS[@]}"; do kill -INT "${PIDS[$name]}" 2>/dev/null; done
  for _ in $(seq 60); do [ "$(jobs -rp | wc -l)" -gt 0 ] || return 0; sleep 1; done
  for name in "${!PIDS[@]}"; do kill -INT "${PIDS[$name]}" 2>/dev/null; done
}
NOT_STARTED=()
for cell in "${CELL_LIST[@]}"; do
  IFS=':' read -r protocol task attention seed <<<"$cell"
  seed="${seed:-0}"
  while [ "$(jobs -rp | wc -l)" -ge "$PARALLEL" ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 2; done
  if [ "$(date +%s)" -ge "$DEADLINE" ]; then NOT_STARTED+=("$cell"); continue; fi
  ( run_cell "$protocol" "$task" "$attention" "$seed" ) &
  PIDS["${protocol}_${task}_${attention}_s${seed}"]=$!
  say "started $cell"
done
while [ "$(jobs -rp | wc -l)" -gt 0 ] && [ "$(date +%s)" -lt "$DEADLINE" ]; do sleep 2; done
if [ "$(jobs -rp | wc -l)" -gt 0 ]; then
  say "budget reached: SIGINT to the $(jobs -rp | wc -l) running cell(s)"
  stop_all
fi
wait

# What came of each cell; the unfinished ones packed (run directory: last checkpoint, iterator, events).
UNFINISHED=()
: > "$OUT/train_logs.txt"
for name in "${!PIDS[@]}"; do
  log="$WORK/$name.log"
  { echo "== $name"; grep -v -e "^ *$" "$log" | tail -n 40; } >> "$OUT/train_logs.txt"
  if grep -q "record written\|test accuracy" "$log" && ! grep -q "^error:" "$log"; then
    say "$name: done ($(grep -o 'test accuracy [0-9.]*' "$log" | tail -n 1))"
  else
    UNFINISHED+=("$name")
    say "$name: not finished ($(grep '^error:' "$log" | tail -n 1))"
  fi
done
if [ "${#UNFINISHED[@]}" -gt 0 ]; then
  tar czf "$OUT/unfinished.tar.gz" --exclude=.lock -C "$WORK" "${UNFINISHED[@]}" 2>/dev/null
  say "packed ${UNFINISHED[*]} into $OUT/unfinished.tar.gz ($(du -h "$OUT/unfinished.tar.gz" | cut -f1)); continue with GPU_TRAIN_RESUME=<that file>"
fi
[ "${#NOT_STARTED[@]}" -gt 0 ] && say "not started within the budget: ${NOT_STARTED[*]}"
say "done in $(( $(date +%s) - START )) s: $(grep -c '"status": "ok"' "$OUT/results/results.jsonl" 2>/dev/null || echo 0) ok record(s) in $OUT/results/results.jsonl"
