#!/usr/bin/env bash
# A one-node SLURM on this machine: for the cluster path's tests (tests/test_slurm_real.py) and for trying
# `lra-bench suite --launcher slurm` or `srun -n 2 lra-bench train` on a laptop (docs/cluster.md, "SLURM on one machine").
#
#   scripts/slurm_local.sh start    install what is missing (apt-get, as root), write the config, start
#                                   munged, slurmctld and slurmd, wait until the node is idle
#   scripts/slurm_local.sh stop     cancel this cluster's jobs, stop the daemons this script started
#                                   (by their pid files; never another SLURM or munge)
#   scripts/slurm_local.sh status   the daemons and the node; exit 0 when the node answers, else 1
#   scripts/slurm_local.sh env      prints `export SLURM_CONF=...` (eval "$(scripts/slurm_local.sh env)")
#
# Everything lives in the state directory $LRA_SLURM_DIR (default /tmp/lra-bench-slurm-$USER):
# slurm.conf, a munge key and socket of its own (a system munged, if any, is left alone), the daemons'
# pid files and logs (log/). SLURM's client commands find this cluster through SLURM_CONF; the tests set
# it themselves when the default state directory holds a running cluster. Ports: $LRA_SLURM_PORT
# (slurmctld, default 6817) and the next one (slurmd).
# The daemons run as the invoking user (SlurmUser, SlurmdUser): as root, jobs may run as any user; as
# another user (tried as `nobody`, packages installed), jobs run as that user. No systemd, no cgroups:
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none; no accounting database (sacct has nothing:
# finished jobs stay visible to `scontrol show job` for MinJobAge seconds).
set -euo pipefail

DIR=${LRA_SLURM_DIR:-${TMPDIR:-/tmp}/lra-bench-slurm-$(id -un)}
CONF=$DIR/slurm.conf
PORT=${LRA_SLURM_PORT:-6817}
PACKAGES=(munge slurmctld slurmd slurm-client)
COMMANDS=(munged mungekey slurmctld slurmd sinfo scontrol srun sbatch squeue scancel)
START_TIMEOUT_S=60  # node idle within this (measured here: ~2 s)
export SLURM_CONF=$CONF

die() {  # die MESSAGE [EXIT_CODE]
  echo "error: slurm_local.sh: $1" >&2
  exit "${2:-1}"
}

usage() {
  die "usage: scripts/slurm_local.sh start|stop|status|env (got: ${1:-nothing})" 2
}

# --- installing -----------------------------------------------------------------------------------------

missing_commands() {
  local name out=()
  for name in "${COMMANDS[@]}"; do
    command -v "$name" >/dev/null 2>&1 || [[ -x /usr/sbin/$name ]] || out+=("$name")
  done
  echo "${out[*]:-}"
}

install_slurm() {
  local missing
  missing=$(missing_commands)
  [[ -z $missing ]] && return 0
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    die "SLURM is not installed (missing: $missing) and cannot be installed here (needs root and apt-get);\
 install the packages ${PACKAGES[*]}, or run this as root on Debian/Ubuntu"
  fi
  mkdir -p "$DIR/log"
  echo "slurm_local.sh: installing ${PACKAGES[*]} (apt-get; log: $DIR/log/apt.log)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" \
      >"$DIR/log/apt.log" 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update >>"$DIR/log/apt.log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" \
      >>"$DIR/log/apt.log" 2>&1 || die "apt-get install ${PACKAGES[*]} failed; see $DIR/log/apt.log"
  fi
  missing=$(missing_commands)
  [[ -z $missing ]] || die "installed ${PACKAGES[*]} but still missing: $missing"
}

# --- the configuration ----------------------------------------------------------------------------------

write_conf() {
  local host cpus user overrides=""
  host=$(hostname -s)
  cpus=$(nproc)
  user=$(id -un)
  if ((cpus < 2)); then  # `srun -n 2` (two processes, one per CPU) must fit: declare 2, let slurmd accept it
    cpus=2
    overrides="SlurmdParameters=config_overrides"
  fi
  mkdir -p "$DIR/log" "$DIR/ctld" "$DIR/spool" "$DIR/munge"
  chmod 755 "$DIR" "$DIR/munge"  # munged wants its socket's directory searchable by all
  cat >"$CONF.tmp" <<EOF
# Written by scripts/slurm_local.sh: one node ($host, $cpus CPUs), one partition, for tests and trials.
ClusterName=lra-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No systemd or cgroups: processes tracked by their parent pids, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
# One CPU per task, several jobs on the node at once (select/linear would give each job the whole node).
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# FIFO, scheduled on every event (submission, job end, requeue): no waiting for a backfill pass.
SchedulerType=sched/builtin
# Short timers: a cancelled or timed-out job gets SIGKILL 2 s after SIGTERM (default 30 s); a finished
# job stays visible to squeue/scontrol for 300 s (the default; the suite reads states of recent jobs).
KillWait=2
MinJobAge=300
InactiveLimit=0
MessageTimeout=10
SlurmdTimeout=60
ReturnToService=2
$overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

# --- the daemons ----------------------------------------------------------------------------------------

pid_file() {
  case $1 in
    munged) echo "$DIR/munge/munged.pid" ;;
    *) echo "$DIR/$1.pid" ;;
  esac
}

running_pid() {  # the pid of daemon $1 if its pid file names a live process of that name (else nothing)
  local file pid
  file=$(pid_file "$1")
  [[ -f $file ]] || return 0
  pid=$(tr -dc '0-9' 2>/dev/null <"$file" || true)  # the daemon may remove it meanwhile
  [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm" 2>/dev/null) == "$1" ]] && echo "$pid"
  return 0
}

start_munged() {
  [[ -n $(running_pid munged) ]] && return 0
  [[ -f $DIR/munge/munge.key ]] || mungekey --create --keyfile="$DIR/munge/munge.key" >/dev/null 2>&1 \
    || die "mungekey could not write $DIR/munge/munge.key"
  munged --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$(pid_file munged)" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || die "munged did not start: $(tail -n 1 "$DIR/log/munged.log" 2>/dev/null)"
}

start_daemon() {  # start_daemon slurmctld|slurmd: daemonizes itself and writes its pid file
  local name=$1 i
  [[ -n $(running_pid "$name") ]] && return 0
  if ! "$name" -f "$CONF" >>"$DIR/log/$name.out" 2>&1; then
    die "$name did not start: $(tail -n 1 "$DIR/log/$name.log" 2>/dev/null || tail -n 1 "$DIR/log/$name.out")"
  fi
  for i in $(seq 50); do
    [[ -n $(running_pid "$name") ]] && return 0
    sleep 0.1
  done
  die "$name exited at start: $(tail -n 1 "$DIR/log/$name.log" 2>/dev/null) (log: $DIR/log/$name.log)"
}

check_ports_free() {  # another SLURM (or anything) listening on our ports: say so before starting
  local port
  for port in "$PORT" "$((PORT + 1))"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port on this machine is in use (another slurmctld/slurmd?);\
 pick free ports with LRA_SLURM_PORT=<port> (it uses that one and the next)"
    fi
  done
}

node_state() {
  sinfo -h -N -o %T 2>/dev/null | head -n 1
}

wait_idle() {
  local deadline=$((SECONDS + START_TIMEOUT_S)) state=""
  while ((SECONDS < deadline)); do
    state=$(node_state)
    case $state in
      idle | mixed | allocated) return 0 ;;
      down* | drain*) scontrol update NodeName="$(hostname -s)" State=RESUME >/dev/null 2>&1 || true ;;
    esac
    sleep 0.5
  done
  die "the node is not idle after ${START_TIMEOUT_S} s (sinfo: ${state:-no answer}); logs: $DIR/log/"
}

stop_daemon() {  # SIGTERM, then SIGKILL after 10 s; only the process its pid file names
  local name=$1 pid i
  pid=$(running_pid "$name")
  if [[ -n $pid ]]; then
    kill "$pid" 2>/dev/null || true
    for i in $(seq 100); do
      [[ -n $(running_pid "$name") ]] || break
      sleep 0.1
    done
    [[ -z $(running_pid "$name") ]] || kill -9 "$pid" 2>/dev/null || true
    echo "slurm_local.sh: stopped $name (pid $pid)"
  fi
  rm -f "$(pid_file "$name")"
}

cancel_jobs() {  # this cluster's jobs (slurmd leaves running jobs' slurmstepd behind otherwise)
  local i
  [[ -n $(running_pid slurmctld) ]] || return 0
  [[ -n $(squeue -h -o %i 2>/dev/null) ]] || return 0
  scancel $(squeue -h -o %A 2>/dev/null | sort -u) >/dev/null 2>&1 || true
  for i in $(seq 100); do
    [[ -z $(squeue -h -t running,completing -o %i 2>/dev/null) ]] && return 0
    sleep 0.1
  done
}

# --- the commands ---------------------------------------------------------------------------------------

cmd_start() {
  mkdir -p "$DIR/log" 2>/dev/null && [[ -w $DIR ]] \
    || die "cannot write the state directory $DIR; set LRA_SLURM_DIR to a directory of yours"
  install_slurm
  if [[ -n $(running_pid slurmctld) && -n $(running_pid slurmd) && -n $(running_pid munged) ]]; then
    wait_idle
    echo "slurm_local.sh: already running ($DIR); export SLURM_CONF=$CONF"
    return 0
  fi
  [[ -n $(running_pid slurmctld)$(running_pid slurmd) ]] || check_ports_free
  trap 'cmd_stop >/dev/null 2>&1' EXIT  # a start that fails half-way leaves nothing of ours running
  write_conf
  start_munged
  start_daemon slurmctld
  start_daemon slurmd
  wait_idle
  trap - EXIT
  echo "slurm_local.sh: SLURM is up: node $(hostname -s), $(sinfo -h -N -o %c | head -n 1) CPUs, partition" \
    "debug ($DIR); for sinfo/srun/sbatch: export SLURM_CONF=$CONF"
}

cmd_stop() {
  if [[ -z $(running_pid slurmd)$(running_pid slurmctld)$(running_pid munged) ]]; then
    echo "slurm_local.sh: nothing of $DIR is running"
    return 0
  fi
  cancel_jobs
  stop_daemon slurmd
  stop_daemon slurmctld
  stop_daemon munged
}

cmd_status() {
  local name pid ok=0
  for name in munged slurmctld slurmd; do
    pid=$(running_pid "$name")
    if [[ -n $pid ]]; then echo "$name: running (pid $pid)"; else echo "$name: not running"; ok=1; fi
  done
  if [[ $ok -eq 0 ]] && sinfo -N >/dev/null 2>&1; then
    sinfo -h -N -o "node %N: %T, %c CPUs, partition %P"
  else
    echo "the cluster in $DIR is not up (scripts/slurm_local.sh start)"
    return 1
  fi
}

case ${1:-} in
  start) [[ $# -eq 1 ]] || usage "$*"; cmd_start ;;
  stop) [[ $# -eq 1 ]] || usage "$*"; cmd_stop ;;
  status) [[ $# -eq 1 ]] || usage "$*"; cmd_status ;;
  env) [[ $# -eq 1 ]] || usage "$*"; echo "export SLURM_CONF=$CONF" ;;
  *) usage "$*" ;;
esac
