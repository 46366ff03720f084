#!/usr/bin/env bash
# The whole suite end to end: set up the environment, prepare the data that can be made here, train
# every registered attention on every task of the protocol that has data, run the efficiency benchmark,
# and write the report (tables, plots, index.md).
#
#   ./run_all.sh                       # cpu protocol + the core scaling sweep (2-core CPU: 18-22 minutes)
#   ./run_all.sh --protocol smoke      # the plumbing check (every task, tiny, accuracies meaningless)
#   ./run_all.sh --protocol lra        # the real LRA configs and the LRA Table 2 benchmark (accelerators)
#
# Options: --protocol P (cpu), --data_dir DIR ($LRA_DATA_DIR or ./lra_data),
#          --results_dir DIR (results/<protocol>), --seeds "0,1,2" (0), --out DIR (<results_dir>/report),
#          --skip_bench, --workers N (processes side by side in the suite and in the benchmark: 2 on cpu and
#          smoke, 1 otherwise), --tasks LIST and --attentions LIST (all: a part of the grid),
#          --set KEY=VALUE (repeatable: every suite cell), --lengths LIST (the benchmark's lengths),
#          --bench_mode core|train|inference (core on cpu, else train: what one benchmark point times).
#          Rerunning resumes: finished cells and measured points are not redone.
#
# The terminal: one progress display per stage (a bar on a terminal, one line per finished unit when the
# output is a file or a pipe; the workers' own logs hold the detail), then the report's summary (the one
# index.md opens with), the paths of the report and the records, and the wall time of each stage.
#
# Stopping: Ctrl-C, or `kill` of this script's process, stops every process it started within seconds (each
# stage runs in a process group of its own: SIGTERM to the group, then SIGKILL to what is left) and waits for
# them; no lock stays held, and the next ./run_all.sh resumes where this one stopped (a cell cut short
# resumes from its checkpoint, a point cut short is measured again; nothing is recorded twice).
#
# Compiled programs are kept in JAX's persistent compilation cache ($JAX_COMPILATION_CACHE_DIR, default
# <results_dir>/../.jax_cache), shared by the suite's workers and the benchmark: a second run (another
# protocol's seeds, a fresh results folder) compiles little.
#
# Benchmark: on `cpu` every registered attention's core alone (forward + backward at the LRA Text
# model's 4 heads x 64, batch 1, attention dropout off as in the cpu protocol's training; a sequence mixer
# in the form the cpu protocol trains it, --kwargs_of cpu) is timed at 256 and 2048 tokens, so the
# report has a slope and a crossover length for every attention (the full curves of every core: the
# committed studies reports/cpu_bench_1k_16k and reports/cpu_modern_layers); on `smoke` the whole LRA Table 2 model at length 256
# (batch 1); any other protocol sweeps the whole model at 1K..16K with batch 32 and 10 timed steps,
# each point in a fresh process, as LRA Table 2. The benchmark runs after the suite, alone on the CPU.
set -euo pipefail
cd "$(dirname "$0")"
PROTOCOL=cpu
DATA_DIR="${LRA_DATA_DIR:-$PWD/lra_data}"
RESULTS_DIR=""
OUT=""
SEEDS="0"
BENCH=1
WORKERS=""
TASKS=all
ATTENTIONS=all
LENGTHS=""
BENCH_MODE=""
SETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) PROTOCOL="$2"; shift 2 ;;
    --data_dir) DATA_DIR="$2"; shift 2 ;;
    --results_dir) RESULTS_DIR="$2"; shift 2 ;;
    --seeds) SEEDS="${2// /,}"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --skip_bench) BENCH=0; shift ;;
    --workers) WORKERS="$2"; shift 2 ;;
    --tasks) TASKS="${2// /,}"; shift 2 ;;
    --attentions) ATTENTIONS="${2// /,}"; shift 2 ;;
    --lengths) LENGTHS="${2// /,}"; shift 2 ;;
    --bench_mode) BENCH_MODE="$2"; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    *) echo "error: unknown option $1 (see the header of run_all.sh)" >&2; exit 2 ;;
  esac
done
RESULTS_DIR="${RESULTS_DIR:-results/$PROTOCOL}"
# CPU cells are small: XLA compiles and runs them on about one core each, so two workers fill a 2-core CPU.
[ -n "$WORKERS" ] || { case "$PROTOCOL" in cpu|smoke) WORKERS=2 ;; *) WORKERS=1 ;; esac; }
case "$WORKERS" in ''|*[!0-9]*|0) echo "error: --workers must be a whole number >= 1, got '$WORKERS'" >&2; exit 2 ;; esac
OUT="${OUT:-$RESULTS_DIR/report}"
START=$SECONDS
STAGE_TIMES=()  # "name seconds" of each stage, printed at the end

# Stopping. Each stage runs in the background, in a session (and process group) of its own (setsid; a
# background job of a non-interactive shell is never a group leader, so setsid starts no extra process and
# $! is the group's id), and the script waits for it with `wait`, which a trapped signal interrupts at once
# (a foreground child would delay the trap until it ended). On SIGINT or SIGTERM the trap sends SIGTERM to
# that group, SIGKILL to whatever of it is left after STOP_GRACE_S, and waits.
STOP_GRACE_S=30
CHILD=""
group_alive() {  # group_alive PGID: some process of the group still runs (zombies do not count)
  ps -eo pgid=,stat= | awk -v g="$1" '$1 == g && $2 !~ /^Z/ { found = 1 } END { exit !found }'
}
stop_all() {  # stop_all NAME NUMBER: the trap
  trap '' INT TERM
  if [ -n "$CHILD" ]; then
    echo "== run_all.sh: got SIG$1; stopping every process it started (group $CHILD) ..." >&2
    kill -TERM -- "-$CHILD" 2>/dev/null || true
    for ((i = 0; i < STOP_GRACE_S * 10; i++)); do group_alive "$CHILD" || break; sleep 0.1; done
    if group_alive "$CHILD"; then kill -KILL -- "-$CHILD" 2>/dev/null || true; fi
    wait "$CHILD" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do group_alive "$CHILD" || break; sleep 0.1; done
  fi
  echo "== run_all.sh: stopped after $((SECONDS - START)) s; nothing of it runs any more. Rerun the same" \
    "command to resume (finished cells and measured points are kept; a cut-short cell resumes from its" \
    "checkpoint)." >&2
  exit $((128 + $2))
}
trap 'stop_all INT 2' INT
trap 'stop_all TERM 15' TERM
run() {  # run CMD...: runs CMD in its own process group and waits for it; returns its exit status
  setsid "$@" < /dev/null &
  CHILD=$!
  local status=0
  wait "$CHILD" || status=$?
  CHILD=""
  return "$status"
}
stage_done() {  # stage_done NAME STARTED_AT
  STAGE_TIMES+=("$1 $((SECONDS - $2)) s")
}

T=$SECONDS
if [ -z "${LRA_BENCH_NO_SETUP:-}" ]; then
  source scripts/setup_env.sh
fi
stage_done setup "$T"
LRA_BENCH="${LRA_BENCH:-lra-bench}"   # e.g. LRA_BENCH="python -m lra_bench" with LRA_BENCH_NO_SETUP=1
case "$RESULTS_DIR" in /*) ABS_RESULTS="$RESULTS_DIR" ;; *) ABS_RESULTS="$PWD/$RESULTS_DIR" ;; esac
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$(dirname "$ABS_RESULTS")/.jax_cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}"
# CPU protocols: LLVM's expensive optimisation passes off. XLA:CPU's matmuls and convolutions are library
# calls (Eigen/oneDNN), so the steps ran as fast without them (vanilla, cpu ListOps: 4.6 vs 4.9 and 4.3 vs
# 4.0 steps/s, back to back) and every number came out the same, while compiling took 8-55 % less
# (combiner_logsparse 62 -> 28 s on a loaded machine).
case "$PROTOCOL" in
  cpu|smoke) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_llvm_disable_expensive_passes=true" ;;
esac

# Data: generate what can be made here (ListOps, Pathfinder); check the others. A missing dataset is
# reported with the command that fixes it and its runs record status "no_data"; it never aborts the suite.
# A protocol without a config for a task (e.g. `cpu` has no Pathfinder) says so in one line and goes on.
wanted() { [ "$TASKS" = all ] || [[ ",$TASKS," == *",$1,"* ]]; }
T=$SECONDS
echo "== data ($PROTOCOL) in $DATA_DIR" >&2
for task in listops pathfinder; do
  wanted "$task" || continue
  run $LRA_BENCH data prepare "$task" --protocol "$PROTOCOL" --data_dir "$DATA_DIR" \
    || echo "== $task: not prepared (above); its cells are skipped or recorded as no_data" >&2
done
for task in text retrieval image; do
  wanted "$task" || continue
  run $LRA_BENCH data prepare "$task" --protocol "$PROTOCOL" --data_dir "$DATA_DIR" \
    || echo "== $task: no data here (fix above); its runs will be recorded as no_data" >&2
done
case "$PROTOCOL" in
  cpu|smoke) ;;  # no Path-X config: 16K tokens per example do not fit a CPU cell
  *) if wanted pathx; then
       echo "== pathx: not generated by run_all.sh (200k 128x128 images take ~13 CPU-hours); make it with:" >&2
       echo "   $LRA_BENCH data prepare pathx --protocol $PROTOCOL --data_dir $DATA_DIR" >&2
     fi ;;
esac
stage_done data "$T"

echo "== suite ($PROTOCOL): tasks $TASKS x attentions $ATTENTIONS x seeds $SEEDS, $WORKERS worker(s)" >&2
# Several workers share the grid through the suite's per-cell locks (no cell runs twice): the suite's local
# launcher starts them (their logs: <results_dir>/submitit/) and shows their progress from the records.
mkdir -p "$RESULTS_DIR"
SUITE=($LRA_BENCH suite --protocol "$PROTOCOL" --tasks "$TASKS" --attentions "$ATTENTIONS" --seeds "$SEEDS"
       --data_dir "$DATA_DIR" --results_dir "$RESULTS_DIR" ${SETS[@]+"${SETS[@]}"})
[ "$WORKERS" = 1 ] || SUITE+=(--launcher local --workers "$WORKERS")
# One XLA thread per worker when several share the CPU (as in the benchmark below): XLA's default, a thread
# per core in each worker, oversubscribes the cores. Measured on 8 cpu ListOps cells, two workers, idle
# (2026-12-04): 288 s against 304 s, every test accuracy the same.
ONE_THREAD="${XLA_FLAGS:+$XLA_FLAGS }--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
run_workers() {  # run_workers CMD...: `run`, with one XLA thread per process when $WORKERS share the CPU
  if [ "$WORKERS" = 1 ]; then run "$@"; else XLA_FLAGS="$ONE_THREAD" run "$@"; fi
}
T=$SECONDS
STATUS=0
run_workers "${SUITE[@]}" || STATUS=$?
stage_done suite "$T"
# Exit 1 = the grid ran but some cells ended `failed` (the report still shows them, with their errors);
# anything else (a usage error, a crash, a signal) stops here.
if [ "$STATUS" = 1 ]; then
  echo "== some cells failed (see the suite summary above and its workers' logs);" \
    "the report lists them; run_all.sh will exit 1" >&2
elif [ "$STATUS" != 0 ]; then
  echo "error: the suite failed (exit $STATUS); see above and $RESULTS_DIR/submitit/*_log.out" >&2
  exit "$STATUS"
fi

if [ "$BENCH" = 1 ]; then
  echo "== efficiency benchmark" >&2
  T=$SECONDS
  # One XLA thread per worker (ONE_THREAD, above): the workers run side by side, each point timed under the
  # same condition (one busy neighbour core), so the crossover table compares like with like.
  if [ "$PROTOCOL" = cpu ] || [ "$BENCH_MODE" = core ]; then
    # Compiling is most of this sweep, so the attentions are dealt to $WORKERS processes side by side. Attention
    # dropout is off: the method's arithmetic is what is timed. With LRA's 0.1 the mask's random bits
    # (JAX's threefry) doubled some cores' step and made half of the sweep's compiling (all 46 cores at
    # 1024 tokens, one process: 178 s with dropout, 108 s without; docs/cpu_protocol.md).
    # Two lengths a factor 8 apart, so that the run stays within 20 minutes with all 64 layers: 256,
    # 1024 and 4096 took 418 s of a 22 min 47 s run (2026-12-04, idle; compiling is 2 s of a point),
    # 256-4096 in five lengths 619 s of 27 min 18 s (docs/cpu_protocol.md).
    BENCH_CMD=($LRA_BENCH bench --mode "${BENCH_MODE:-core}" --lengths "${LENGTHS:-256,2048}" --noisolate
               --batch_size 1 --repeats 3 --warmup_steps 1 --set model.attention_dropout_rate=0.0)
    # each layer timed in the form the cpu suite trained it (configs/cpu.py RECURRENT_ON_CPU: eight modern
    # recurrences token by token), so the sweep's rows are the forms of the accuracy column; at this shape
    # the chunked form is the faster one for seven of them (reports/cpu_modern_layers)
    [ "$PROTOCOL" = cpu ] && BENCH_CMD+=(--kwargs_of cpu)
  elif [ "$PROTOCOL" = smoke ]; then
    BENCH_CMD=($LRA_BENCH bench --mode "${BENCH_MODE:-train}" --lengths "${LENGTHS:-256}" --noisolate --batch_size 1
               --repeats 3 --warmup_steps 1)
  else
    BENCH_CMD=($LRA_BENCH bench --mode "${BENCH_MODE:-train}" --lengths "${LENGTHS:-1024,2048,3072,4096,8192,16384}"
               --batch_size 32 --repeats 10 --warmup_steps 2)
  fi
  BENCH_CMD+=(--attentions "$ATTENTIONS" --workers "$WORKERS" --results_dir "$RESULTS_DIR")
  BENCH_STATUS=0
  run_workers "${BENCH_CMD[@]}" || BENCH_STATUS=$?
  [ "$BENCH_STATUS" = 0 ] || { echo "== the benchmark ended with exit $BENCH_STATUS (above)" >&2; STATUS=1; }
  stage_done bench "$T"
fi

echo "== report" >&2
T=$SECONDS
PATTERNS=all
if [ "$ATTENTIONS" != all ]; then  # the heatmaps of the attention cores run (a mixer has none)
  CORES=",$($LRA_BENCH list attentions 2>/dev/null | paste -sd, -),"
  PATTERNS=$(echo "$ATTENTIONS" | tr ',' '\n' | while read -r name; do
    [[ "$CORES" == *",$name,"* ]] && echo "$name"; done | paste -sd, -)
  PATTERNS="${PATTERNS:-none}"
fi
run $LRA_BENCH report --results_dir "$RESULTS_DIR" --out "$OUT" --patterns "$PATTERNS"
stage_done report "$T"
echo "records: $RESULTS_DIR/results.jsonl; report: $OUT/index.md"
echo "wall time: $(IFS=,; echo "${STAGE_TIMES[*]}" | sed 's/,/, /g'); total $((SECONDS - START)) s"
exit "$STATUS"
