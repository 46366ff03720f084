"""The suite's grid on N workers started by submitit: local processes, or a SLURM job array.

Why submitit: it is what LRA-scale sweeps already use to reach SLURM (sbatch scripts, job arrays,
requeueing); the scheduler places the workers, and nothing here schedules. The workers share the grid
without a coordinator: each runs the in-process suite's loop (``suite.work``, handed over in ``Grid``;
this module imports nothing of the suite) over the planned cells,
claiming each with the per-cell lock on the shared results dir, and makes another pass while the last
one ran something (a cell whose worker died is claimable again), so a worker ends when nothing is left
that it can claim.

Preemption and time limits: SLURM sends USR2 ``signal_delay_s`` before it stops a job (``--signal``);
the worker asks its training loop to stop at the next step boundary (``_Preemption``), then hands over
to submitit, which calls ``Worker.checkpoint``, stores the ``DelayedSubmission`` it returns and requeues the
job. The interrupted cell has no record and its lock died with the process, so the requeued worker (or
another one) claims it again and it resumes from its orbax checkpoint. ``--launcher local`` runs exactly
this code through submitit's LocalExecutor (the tests kill and preempt its workers).

Each worker's log: ``<log_dir>/<job id>_0_log.out`` (default ``log_dir``: ``<results_dir>/submitit``).

What went wrong, under the real scheduler: ``--launcher slurm`` returns once the array is submitted, so
it is the next run of the same command that finds cells still without a record. For each of those whose
lock file names a worker of an earlier SLURM launch (its job has a ``<job>_submission.sh`` in the log
dir), the summary names that job, its state as the scheduler tells it (``squeue`` while it is queued or
running, ``scontrol show job`` for ``MinJobAge`` seconds after it ended, ``sacct`` where accounting is on),
the cell's recorded failure if any, and the worker's log (``history_notes``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from lra_bench import REPO_ROOT
from lra_bench.errors import ConfigError
from lra_bench.experiments import processes

if TYPE_CHECKING:  # submitit is imported where a launch needs it: the in-process suite runs without it
  import submitit

# This module imports only the standard library at its top: the CLI's parser reads ``LAUNCHERS`` and
# ``FLAGS`` (``--launcher``'s choices, the suite flag of each option) before any command runs.
LAUNCHERS = ("inprocess", "local", "slurm")
OPTION_KEYS = ("workers", "partition", "gpus_per_task", "time_limit_min", "array_size", "cpus_per_task",
               "log_dir")
# option -> its flag of ``lra-bench suite``
FLAGS = {"workers": "--workers", "partition": "--partition", "gpus_per_task": "--gpus_per_task",
         "time_limit_min": "--time_limit", "array_size": "--array_size", "cpus_per_task": "--cpus_per_task",
         "log_dir": "--log_dir"}
APPLIES = {"inprocess": (), "local": ("workers", "time_limit_min", "log_dir"), "slurm": OPTION_KEYS}
MINIMUM = {"workers": 1, "gpus_per_task": 0, "time_limit_min": 1, "array_size": 1, "cpus_per_task": 1}
DEFAULT_SLURM_TIME_LIMIT_MIN = 240  # submitit's own default is 5 minutes
LOCAL_TIME_LIMIT_MIN = 7 * 24 * 60  # local workers: no limit in practice (submitit's default is 2 minutes)
MAX_REQUEUES = 50  # requeues after a time limit (a long grid on short jobs needs many); preemptions are free
SIGNAL_DELAY_S = 120  # USR2 this long before the time limit: the worker checkpoints and requeues
POLL_S = 2.0
# A local job is done when its controller has exited, so its worker's result file is there or never will be;
# submitit would wait 15 s for it (``Job._results_timeout_s``: a shared file system may show it late), per dead
# worker, before the summary could name it.
LOCAL_RESULT_WAIT_S = 1
SCHEDULER_TIMEOUT_S = 10  # one squeue/scontrol/sacct query; a scheduler that does not answer is "unknown"


def check_options(launcher: str, options: dict[str, Any] | None) -> dict[str, Any]:
  """Every ``OPTION_KEYS`` entry (None: default), checked for this launcher; else a ``ConfigError``."""
  if launcher not in LAUNCHERS:
    raise ConfigError(f"--launcher {launcher!r} is not known; use one of: {', '.join(LAUNCHERS)}")
  options = dict(options or {})
  unknown = sorted(set(options) - set(OPTION_KEYS))
  if unknown:
    raise ConfigError(f"unknown launcher option(s) {', '.join(unknown)}; known: {', '.join(OPTION_KEYS)}")
  full = {key: options.get(key) for key in OPTION_KEYS}
  for key, value in full.items():
    if value is None:
      continue
    if key not in APPLIES[launcher]:
      users = [name for name in ("local", "slurm") if key in APPLIES[name]]
      raise ConfigError(f"{FLAGS[key]} applies to --launcher {' or '.join(users)} only (got --launcher {launcher})")
    if key in MINIMUM and (isinstance(value, bool) or not isinstance(value, int) or value < MINIMUM[key]):
      raise ConfigError(f"{FLAGS[key]} must be an integer >= {MINIMUM[key]}, got {value!r}")
    if key in ("partition", "log_dir") and (not isinstance(value, str) or not value.strip()):
      raise ConfigError(f"{FLAGS[key]} must be a non-empty string, got {value!r}")
  return full


@dataclasses.dataclass
class Grid:
  """What every worker needs: the planned cells and how to run them (pickled into each job)."""

  cells: list[Any]  # suite.Cell
  results_dir: str
  data_dir: str
  overrides: list[str]
  isolate: bool
  retry: tuple[str, ...]
  baseline: dict[tuple, int]  # records per cell when the suite was planned (``suite.record_counts``)
  work: Callable[..., Any]  # ``suite.work``: one pass over cells (pickled by reference)
  holder: Callable[[str, Any], dict | None] | None = None  # ``suite.lock_holder``: who ran a cell last


class Worker:
  """One worker of a launch: the suite loop until nothing is left to claim; checkpointable for submitit."""

  def __init__(self, grid: Grid, index: int):
    self.grid = grid
    self.index = index

  def __call__(self) -> dict[str, Any]:
    _load_plugins()
    _quiet_console()
    logging.getLogger("submitit").propagate = False  # its own handlers write the log; once is enough
    grid, ran, claimed_elsewhere = self.grid, {}, []
    print(f"worker {self.index} on {socket.gethostname()} (pid {os.getpid()}): {len(grid.cells)} planned cells",
          flush=True)
    with _Preemption().installed() as preemption:
      try:
        while preemption.pending is None:
          todo = [c for c in grid.cells if c.name not in ran]  # a worker never reruns its own cell
          summary = grid.work(todo, results_dir=grid.results_dir, data_dir=grid.data_dir,
                               overrides=grid.overrides, isolate=grid.isolate, retry=grid.retry,
                               baseline=grid.baseline, echo=lambda line: print(line, flush=True),
                               done=lambda name, record: self._done(ran, name, record))
          claimed_elsewhere = summary.claimed_elsewhere
          if not summary.ran:
            break
      except KeyboardInterrupt:  # the loop stopped as asked by ``_Preemption``
        if preemption.pending is None:
          raise
      if preemption.pending is not None:
        preemption.requeue()  # exits
    return {"worker": self.index, "host": socket.gethostname(), "ran": ran,
            "claimed_elsewhere": claimed_elsewhere}

  def _done(self, ran: dict[str, str], name: str, record: dict) -> None:
    ran[name] = record["status"]
    print(f"worker {self.index}: {record['status']}: {name}", flush=True)  # the log says who ran what

  def checkpoint(self) -> submitit.helpers.DelayedSubmission:
    """submitit's requeue protocol (preemption, time limit): the same worker again. Its state is on disk:
    the records, and the interrupted cell's checkpoint, from which that cell resumes."""
    import submitit

    print(f"worker {self.index}: preempted or out of time; requeued (the running cell resumes from its "
          "last checkpoint)", flush=True)
    return submitit.helpers.DelayedSubmission(Worker(self.grid, self.index))


class _Preemption:
  """submitit's preemption signal, acted on between training steps rather than inside the handler.

  submitit's handler checkpoints, requeues and raises ``SystemExit`` from wherever the main thread is
  when the signal lands. Inside a finaliser (seen: TensorFlow's ``Executor.__del__`` under load) Python
  swallows that exception ("Exception ignored in ..."), so the worker trained on and was never requeued.
  While a worker runs, the signal only asks every training loop of the process to stop at its next step
  boundary (``loop.request_stop``: the cell ends as after a Ctrl-C, not recorded, its checkpoint the
  resume point); the worker then calls submitit's handler from plain code. If no loop stopped within
  ``GRACE_S`` (a cell still loading its data, an ``--isolate`` cell's process), an alarm calls submitit's
  handler as before (SLURM sends the signal ``SIGNAL_DELAY_S`` before it kills the job)."""

  GRACE_S = SIGNAL_DELAY_S // 2

  def __init__(self) -> None:
    self.pending: int | None = None  # the signal received
    self.original: Callable[..., Any] | None = None  # submitit's handler

  @contextlib.contextmanager
  def installed(self) -> Iterator[_Preemption]:
    """Takes over submitit's handler while the block runs (only in the main thread, only where submitit
    installed one: a worker called outside a job is left alone)."""
    import threading

    import submitit

    from lra_bench.training import loop  # imported here, not in the handler

    self._request_stop = loop.request_stop
    # USR2 unless SUBMITIT_PREEMPT_SIGNAL names another
    signum = getattr(signal, f"SIG{submitit.JobEnvironment.USR_SIG}", signal.SIGUSR2)
    original = signal.getsignal(signum)
    if threading.current_thread() is not threading.main_thread() or not callable(original):
      yield self
      return
    self.original = original
    previous_alarm = signal.signal(signal.SIGALRM, self._grace_over)
    signal.signal(signum, self._defer)
    try:
      yield self
    finally:
      signal.alarm(0)
      signal.signal(signum, original)
      signal.signal(signal.SIGALRM, previous_alarm)

  def _defer(self, signum, frame) -> None:
    if self.pending is None:
      self.pending = signum
      self._request_stop()
      signal.alarm(self.GRACE_S)
      os.write(1, f"worker: got signal {signum}; the running cell stops at its next step, then the worker "
                  "is requeued\n".encode())

  def _grace_over(self, signum, frame) -> None:
    os.write(1, f"worker: no training loop stopped within {self.GRACE_S} s; requeued now\n".encode())
    self.requeue()

  def requeue(self) -> None:
    """submitit's handler: ``Worker.checkpoint``, the requeue, ``SystemExit``."""
    signal.alarm(0)
    assert self.original is not None and self.pending is not None
    self.original(self.pending, None)


def _load_plugins() -> None:
  """Attention plugins of the submitting process (``LRA_BENCH_PLUGINS``) must exist in the worker too."""
  import attention_zoo

  attention_zoo.load_plugins([])


def _quiet_console() -> None:
  """The worker's log (its stdout) keeps warnings and the per-cell lines; each cell's full log is its
  ``train.log`` already (``suite._cell_logging``)."""
  for handler in logging.getLogger().handlers:
    if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
      handler.setLevel(logging.WARNING)


def _pythonpath() -> str:
  entries = [REPO_ROOT, *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
  return os.pathsep.join(dict.fromkeys(e for e in entries if e))  # in order, once each


@contextlib.contextmanager
def _worker_env() -> Iterator[None]:
  """Workers import this checkout (as ``--isolate`` cells do): its root leads their PYTHONPATH."""
  old = os.environ.get("PYTHONPATH")
  os.environ["PYTHONPATH"] = _pythonpath()
  try:
    yield
  finally:
    if old is None:
      os.environ.pop("PYTHONPATH", None)
    else:
      os.environ["PYTHONPATH"] = old


def worker_count(launcher: str, options: dict[str, Any], pending: int) -> int:
  """local: ``workers`` processes (default: one per CPU); slurm: ``array_size`` array tasks (default:
  one per pending cell). Never more workers than pending cells."""
  if launcher == "local":
    return max(1, min(pending, options["workers"] or os.cpu_count() or 1))
  return max(1, min(pending, options["array_size"] or pending))


def make_executor(launcher: str, options: dict[str, Any], folder: str, count: int) -> submitit.AutoExecutor:
  """The submitit executor of a launch, with the scheduler parameters from ``options``."""
  import submitit

  cluster = "local" if launcher == "local" else "slurm"
  try:
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster, slurm_max_num_timeout=MAX_REQUEUES,
                                     local_max_num_timeout=MAX_REQUEUES)
  except RuntimeError as err:  # SlurmExecutor: no srun on PATH
    raise ConfigError(f"--launcher slurm needs SLURM on this machine ({err}); submit from a login node of "
                      "the cluster, or use --launcher local") from None
  if launcher == "local":
    executor.update_parameters(name="lra-bench-suite", timeout_min=options["time_limit_min"] or LOCAL_TIME_LIMIT_MIN,
                               stderr_to_stdout=True)
    return executor
  params: dict[str, Any] = dict(
      name="lra-bench-suite", nodes=1, tasks_per_node=1, stderr_to_stdout=True,
      timeout_min=options["time_limit_min"] or DEFAULT_SLURM_TIME_LIMIT_MIN,
      slurm_array_parallelism=min(count, options["workers"] or count), slurm_signal_delay_s=SIGNAL_DELAY_S,
      slurm_setup=[f"export PYTHONPATH={shlex.quote(_pythonpath())}"]
      + ([f"export LRA_BENCH_PLUGINS={shlex.quote(os.environ['LRA_BENCH_PLUGINS'])}"]
         if os.environ.get("LRA_BENCH_PLUGINS") else []))
  if options["gpus_per_task"] is not None:
    params["gpus_per_node"] = options["gpus_per_task"]  # one task per node: per node == per task
  if options["cpus_per_task"] is not None:
    params["cpus_per_task"] = options["cpus_per_task"]
  if options["partition"] is not None:
    params["slurm_partition"] = options["partition"]
  executor.update_parameters(**params)
  return executor


def submit(launcher: str, options: dict[str, Any], grid: Grid) -> tuple[list[submitit.Job], str]:
  """Submits the workers (one job each; one job array on SLURM); returns the jobs and the log dir."""
  from submitit.core import utils as submitit_utils

  folder = _log_folder(options, grid)
  count = worker_count(launcher, options, len(grid.cells))
  with _worker_env():
    executor = make_executor(launcher, options, folder, count)
    try:
      jobs = executor.submit_array([Worker(grid, i) for i in range(count)])
    except (submitit_utils.FailedSubmissionError, OSError, RuntimeError) as err:
      raise ConfigError(f"--launcher {launcher}: submitting {count} workers failed: "
                        f"{str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from None
  return jobs, folder


INTERRUPT_GRACE_S = 5.0  # a stopped worker's time to stop at its training step before it is killed


def stop(jobs: Sequence[submitit.Job], grace_s: float = processes.GRACE_S) -> list[int]:
  """Stops local workers and waits for them. Each job's controller (submitit's ``_local``: its pid is the job
  id) runs one worker: the workers get SIGINT (a training loop stops at its next step; the checkpoint before
  it is the cell's resume point) and SIGKILL after ``INTERRUPT_GRACE_S``; each controller then sees its worker
  gone and exits; whatever still runs after ``grace_s`` is killed. (Cancelling the controllers instead
  would print their KeyboardInterrupt tracebacks on the console.) The stopped cells have no record and their
  locks died with their workers: a rerun resumes them. Returns every pid stopped."""
  controllers = []
  for job in jobs:
    with contextlib.suppress(ValueError):
      controllers.append(int(str(job.job_id)))
  workers = [pid for controller in controllers for pid in processes.descendants(controller)]

  def reap() -> None:  # the controllers are this process's children
    for job in jobs:
      with contextlib.suppress(Exception):  # polls (and so reaps) its controller
        job.get_info()

  processes.stop(workers, signal.SIGINT, INTERRUPT_GRACE_S, reap)
  processes.stop(controllers + workers, None, grace_s, reap)
  return controllers + workers


def wait(jobs: Sequence[submitit.Job], watch: Callable[[], None] | None = None,
         signals: processes.Signals | None = None) -> tuple[list[dict], list[str]]:
  """Waits for local workers (``watch()`` every ``POLL_S``: the progress display); returns their results and
  a line per dead worker. A SIGTERM or Ctrl-C (``signals``) stops every worker and waits for them (``stop``)
  before it ends this process: 143 for SIGTERM, ``KeyboardInterrupt`` for Ctrl-C."""
  from submitit.core import utils as submitit_utils

  try:
    if signals is not None:
      signals.check()
    while not all(job.done() for job in jobs):
      if watch is not None:
        watch()
      time.sleep(POLL_S)
  except (KeyboardInterrupt, processes.Stopped) as err:
    if signals is not None:
      signals.quiet()  # a second signal must not cut the stopping short
    stopped = err if isinstance(err, processes.Stopped) else processes.Stopped(signal.SIGINT)
    print(f"suite: got {signal.Signals(stopped.signum).name}; stopping the {len(jobs)} local workers (their "
          "running cells resume from their checkpoints when the same command runs again)", file=sys.stderr,
          flush=True)
    stop(jobs)
    print("suite: every worker stopped; rerun the same command to resume", file=sys.stderr, flush=True)
    raise stopped.exit("the workers are stopped; rerun the same command to resume") from None
  if watch is not None:
    watch()
  outputs, dead = [], []
  for job in jobs:
    job._results_timeout_s = LOCAL_RESULT_WAIT_S  # noqa: SLF001 (submitit's own per-job setting)
    try:
      outputs.append(job.result())
    except submitit_utils.UncompletedJobError as err:
      reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
      dead.append(f"worker job {job.job_id} died ({reason[:200]}); its log: {job.paths.stdout}")
  return outputs, dead


@dataclasses.dataclass
class Launch:
  """What a launch did: the workers' job ids, their results (local) and the lines for the summary."""

  jobs: list[str]
  outputs: list[dict]
  notes: list[str]
  waited: bool


def launch(launcher: str, options: dict[str, Any], grid: Grid, *, watch: Callable[[], None] | None = None
           ) -> Launch:
  """local: submits the workers and waits for them (``watch()`` every ``POLL_S``; a SIGTERM or Ctrl-C stops
  them, ``wait``). slurm: submits the job array and returns."""
  history = history_notes(grid, _log_folder(options, grid)) if launcher == "slurm" else []
  if launcher == "local":
    with processes.Signals() as signals:
      jobs, folder = submit(launcher, options, grid)
      outputs, dead = wait(jobs, watch, signals)
    return Launch([job.job_id for job in jobs], outputs,
                  [f"{len(jobs)} local workers (submitit): logs in {folder}", *dead], waited=True)
  jobs, folder = submit(launcher, options, grid)
  ids = [job.job_id for job in jobs]
  if launcher == "slurm":
    array = ids[0].split("_")[0]
    log = f"{array}_0_log.out" if len(jobs) == 1 else f"{array}_<i>_0_log.out"  # submitit's names
    return Launch(ids, [], [
        *history,
        f"submitted {len(jobs)} workers as SLURM job array {array} "
        f"({_describe(options, len(jobs))}); logs: {folder}/{log}",
        f"watch: squeue -j {array}; results: {grid.results_dir}/results.jsonl "
        f"(lra-bench report --results_dir {grid.results_dir})",
        "a preempted or timed-out worker is requeued and its cell resumes from its checkpoint; after the array "
        "ends, rerunning this command submits workers only for cells still missing"], waited=False)


def _log_folder(options: dict[str, Any], grid: Grid) -> str:
  return os.path.abspath(options["log_dir"] or os.path.join(grid.results_dir, "submitit"))


def history_notes(grid: Grid, folder: str) -> list[str]:
  """A line per planned cell that a worker of an earlier SLURM launch (logs in ``folder``) held last:
  its job, the job's state, the cell's recorded failure if any, and the worker's log."""
  if grid.holder is None:
    return []
  from lra_bench.experiments import results

  failures = _failures(results.load_records(grid.results_dir), grid)
  notes = []
  for cell in grid.cells:
    job = (grid.holder(grid.results_dir, cell) or {}).get("job")
    if not job or not os.path.exists(os.path.join(folder, f"{str(job).split('_')[0]}_submission.sh")):
      continue  # never claimed, or not by a SLURM worker of this log dir
    failure = f"; recorded {failures[cell.name]}" if cell.name in failures else ""
    notes.append(f"{cell.name}: not finished by SLURM job {job} ({job_state(str(job))}){failure}; "
                 f"its log: {os.path.join(folder, f'{job}_0_log.out')}")
  return notes


def _failures(records: Sequence[dict], grid: Grid) -> dict[str, str]:
  """Cell name -> ``status: first error line`` of its latest record, for cells whose last run failed."""
  from lra_bench.experiments import results

  keys = {cell.key(): cell.name for cell in grid.cells}
  out = {}
  for record in records:
    name = keys.get(results.run_key(record)) if "task" in record else None
    if name is not None and record.get("status") != "ok":
      error = (record.get("error") or "").strip()
      out[name] = f"{record['status']}: {error.splitlines()[0][:200] if error else 'no reason recorded'}"
  return out


def job_state(job: str) -> str:
  """What SLURM says of ``job`` (``<id>`` or ``<array>_<task>``): ``squeue: RUNNING``, ``scontrol:
  FAILED, exit code 0:9``, ``sacct: CANCELLED by 0, exit code 0:0``, or why it cannot say."""
  queued = _ask(["squeue", "-h", "-j", job, "-o", "%T %r"])
  if queued:
    state, _, reason = queued.splitlines()[0].partition(" ")
    return f"squeue: {state}" + (f", reason {reason}" if reason and reason != "None" else "")
  shown = _ask(["scontrol", "-o", "show", "job", job])
  fields = dict(item.partition("=")[::2] for item in (shown or "").split("\n")[0].split())
  if fields.get("JobState"):
    return f"scontrol: {fields['JobState']}, exit code {fields.get('ExitCode', '?')}"
  accounted = _ask(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"])
  if accounted:
    state, _, code = accounted.splitlines()[-1].partition("|")
    return f"sacct: {state}, exit code {code}"
  return "no longer known to squeue, scontrol or sacct"


def _ask(command: list[str]) -> str | None:
  """The stripped stdout of a scheduler query, or None if it failed or said nothing."""
  try:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=SCHEDULER_TIMEOUT_S)
  except (OSError, subprocess.TimeoutExpired):
    return None
  if proc.returncode != 0:
    return None
  return proc.stdout.strip() or None


def _describe(options: dict[str, Any], count: int) -> str:
  parts = [f"at most {min(count, options['workers'] or count)} at once",
           f"time limit {options['time_limit_min'] or DEFAULT_SLURM_TIME_LIMIT_MIN} min"]
  if options["partition"]:
    parts.append(f"partition {options['partition']}")
  if options["gpus_per_task"] is not None:
    parts.append(f"{options['gpus_per_task']} GPU(s) each")
  if options["cpus_per_task"] is not None:
    parts.append(f"{options['cpus_per_task']} CPUs each")
  return ", ".join(parts)
