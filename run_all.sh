#!/usr/bin/env bash
# The whole suite end to end: set up the environment, prepare the data that can be made here, train
# every registered attention on every task of the protocol that has data, run the efficiency benchmark,
# and write the report (tables, plots, index.md).
#
#   ./run_all.sh                       # smoke protocol + a small CPU benchmark (2-core CPU: minutes)
#   ./run_all.sh --protocol lra        # the real LRA configs and the LRA Table 2 benchmark (accelerators)
#
# Options: --protocol P (smoke), --data_dir DIR ($LRA_DATA_DIR or ./lra_data),
#          --results_dir DIR (results/<protocol>), --seeds "0,1,2" (0), --out DIR (<results_dir>/report),
#          --skip_bench. Rerunning resumes: finished cells and measured points are not redone.
#
# Benchmark defaults: on `smoke` the LRA Table 2 model is timed at length 256 with batch 1 (3 timed
# steps after 1 warm-up) and only compiled at 512 and 1024 (XLA FLOPs and memory), which fits a 2-core
# CPU; any other protocol sweeps 1K..16K with batch 32 and 10 timed steps, as LRA Table 2.
set -euo pipefail
cd "$(dirname "$0")"
PROTOCOL=smoke
DATA_DIR="${LRA_DATA_DIR:-$PWD/lra_data}"
RESULTS_DIR=""
OUT=""
SEEDS="0"
BENCH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) PROTOCOL="$2"; shift 2 ;;
    --data_dir) DATA_DIR="$2"; shift 2 ;;
    --results_dir) RESULTS_DIR="$2"; shift 2 ;;
    --seeds) SEEDS="${2// /,}"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --skip_bench) BENCH=0; shift ;;
    *) echo "error: unknown option $1 (see the header of run_all.sh)" >&2; exit 2 ;;
  esac
done
RESULTS_DIR="${RESULTS_DIR:-results/$PROTOCOL}"
OUT="${OUT:-$RESULTS_DIR/report}"
if [ -z "${LRA_BENCH_NO_SETUP:-}" ]; then
  source scripts/setup_env.sh
fi
LRA_BENCH="${LRA_BENCH:-lra-bench}"   # e.g. LRA_BENCH="python -m lra_bench" with LRA_BENCH_NO_SETUP=1
START=$SECONDS

# ---- data: prepare what can be made on this machine (one line per task) ---------------------------
$LRA_BENCH data prepare listops --protocol "$PROTOCOL" --data_dir "$DATA_DIR"
# ---- end of data --------------------------------------------------------------------------------------

echo "== suite ($PROTOCOL): every task with a config x every registered attention x seeds $SEEDS" >&2
$LRA_BENCH suite --protocol "$PROTOCOL" --tasks all --attentions all --seeds "$SEEDS" \
  --data_dir "$DATA_DIR" --results_dir "$RESULTS_DIR"

if [ "$BENCH" = 1 ]; then
  echo "== efficiency benchmark" >&2
  if [ "$PROTOCOL" = smoke ]; then
    $LRA_BENCH bench --attentions all --lengths 256,512,1024 --compile_only_from 512 \
      --batch_size 1 --repeats 3 --warmup_steps 1 --timeout 300 --results_dir "$RESULTS_DIR"
  else
    $LRA_BENCH bench --attentions all --lengths 1024,2048,3072,4096,8192,16384 --batch_size 32 \
      --repeats 10 --warmup_steps 2 --results_dir "$RESULTS_DIR"
  fi
fi

echo "== report" >&2
$LRA_BENCH report --results_dir "$RESULTS_DIR" --out "$OUT"
echo "done in $((SECONDS - START)) s; records: $RESULTS_DIR/results.jsonl; report: $OUT/index.md" >&2
