#!/usr/bin/env bash
# The whole suite end to end: set up the environment, prepare the data that can be made here, train
# every registered attention on every task of the protocol, and write one result record per run.
#
#   ./run_all.sh                       # smoke protocol: minutes on a laptop CPU
#   ./run_all.sh --protocol lra        # the real LRA configs (accelerators)
#
# Options: --protocol P (smoke), --data_dir DIR ($LRA_DATA_DIR or ./lra_data),
#          --results_dir DIR (results/<protocol>), --seeds "0 1 2" (0).
set -euo pipefail
cd "$(dirname "$0")"
PROTOCOL=smoke
DATA_DIR="${LRA_DATA_DIR:-$PWD/lra_data}"
RESULTS_DIR=""
SEEDS="0"
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) PROTOCOL="$2"; shift 2 ;;
    --data_dir) DATA_DIR="$2"; shift 2 ;;
    --results_dir) RESULTS_DIR="$2"; shift 2 ;;
    --seeds) SEEDS="$2"; shift 2 ;;
    *) echo "error: unknown option $1 (see the header of run_all.sh)" >&2; exit 2 ;;
  esac
done
RESULTS_DIR="${RESULTS_DIR:-results/$PROTOCOL}"
source scripts/setup_env.sh

lra-bench data prepare listops --protocol "$PROTOCOL" --data_dir "$DATA_DIR"

status=0
for attention in $(lra-bench list attentions); do
  for seed in $SEEDS; do
    echo "== listops / $attention / seed $seed" >&2
    lra-bench train --task listops --attention "$attention" --protocol "$PROTOCOL" --seed "$seed" \
      --data_dir "$DATA_DIR" --results_dir "$RESULTS_DIR" \
      --workdir "runs/$PROTOCOL/listops/${attention}_seed$seed" || status=1
  done
done
echo "records: $RESULTS_DIR/results.jsonl" >&2
exit $status
