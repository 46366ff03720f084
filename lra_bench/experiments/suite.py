"""The suite: every (task, attention, seed) cell of one protocol, resumable and safe to run twice.

Each cell trains in its own workdir ``<results_dir>/runs/<protocol>/<task>/<attention>/seed<k>_<hash>``
(the config hash keeps runs of different overrides apart) and ends as one record in
``<results_dir>/results.jsonl`` (``cell.train_cell``).

- Done cells (an ``ok`` or ``oom`` record for the same config) are skipped; ``no_data`` cells are retried
  (the data may have been prepared since) and so are ``failed`` ones unless ``retry_failed=False``.
- A killed suite resumes where it stopped: the interrupted cell resumes from its checkpoint.
- A failing cell (error, NaN, OOM, missing data) becomes a record with its status and reason; the suite
  moves on (``cell.outcome`` decides the status).
- Two suites on one results dir never run a cell twice: a cell is claimed with a non-blocking ``flock``
  on ``<results_dir>/locks/...`` (released by the OS if the process dies) and its record is re-checked
  after the claim; ``results.append_record`` serializes the writes.
- Tasks the protocol has no config for are skipped with a log line (no record: there is no config).
- Cells run in this process by default (no per-cell import/startup cost; failures are caught by
  ``cell.train_cell``); ``isolate=True`` runs each cell in a fresh ``lra-bench train`` subprocess instead,
  which dies with the suite (SIGKILL, Linux ``PR_SET_PDEATHSIG``), shares the cell's claim (it is released
  only once both have exited) and gets the suite's SIGTERM (the suite then exits 143, recording nothing).
- A ``--set`` of a key the grid sets itself (``GRID_KEYS``) is refused: it would make cells one run.
- The console: a ``failed`` or ``oom`` cell is one line (its name, status and reason) as it ends; a task
  without data is one line (the reason and the command that prepares it) at its first ``no_data`` cell,
  and its other such cells add nothing (a grid of 46 attentions is one line per task, not 46).
- The summary counts every cell of the grid by its final status, names the ``failed``, ``oom`` and
  unfinished cells (the first ``grid.NAMES_SHOWN``, then how many more) and gives one line per task and
  reason for the ``no_data`` ones, from each cell's best record (right after a resume and from the
  workers' records too); ``Summary.exit_code`` is 1 when a cell is ``failed`` or left unfinished (``oom``
  and ``no_data`` are outcomes with a reason, not errors).
- ``launcher="local"`` or ``"slurm"`` hands the same loop (``work``) to N workers started by submitit
  (``launcher.py``): N local processes, or a SLURM job array whose workers claim cells through the same
  locks on a shared results dir. A cell run (or recorded) since the suite was planned is not run again
  by another worker of the same launch, even when its record is ``failed`` (``baseline``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator, Sequence

import ml_collections

import attention_zoo
import tasks as tasks_lib
from tasks.progress import Progress, clock
from lra_bench import REPO_ROOT
from lra_bench.experiments import cell as cell_lib
from lra_bench.experiments import processes, results
from lra_bench.experiments.grid import failure_line, group_line, name_list, one_line, parse_ints, parse_names
from lra_bench.training import config as config_lib
from lra_bench.training import models, objectives, pretrain


@dataclasses.dataclass
class Cell:
  task: str
  attention: str
  seed: int
  config: ml_collections.ConfigDict
  workdir: str
  # the ``key=value`` overrides that make ``config`` from the preset: the sweep's values of this cell,
  # then the suite's --set (a fresh ``train`` process rebuilds the config from them)
  overrides: tuple[str, ...] = ()
  variant: str = ""  # the sweep's values, short (``lr=0.001,emb_dim=64``); "" without a sweep
  # the self-pretraining run of a cell with a ``pretrain`` section, shared by every cell whose pretraining
  # config is the same (``<results_dir>/runs/<protocol>/<task>/<attention>/pretrain/seed<k>_<hash>``)
  pretrain_workdir: str | None = None

  @property
  def name(self) -> str:
    return f"{self.task}/{self.attention}/seed{self.seed}" + (f"[{self.variant}]" if self.variant else "")

  def key(self) -> tuple:
    return results.run_key({"task": self.task, "attention": self.attention,
                            "protocol": self.config.protocol, "seed": self.seed,
                            "config_hash": config_lib.config_hash(self.config),
                            "max_length": self.config.data.max_length})


PRETRAIN_CHOICES = ("none", *objectives.PRETRAIN_OBJECTIVES)  # none: from scratch


def parse_sweeps(items: Sequence[str] | None, pretrain: str | None = None) -> dict[str, list[dict[str, Any]]]:
  """``--sweep key=v1,v2`` flags -> axes {short key: [{key: text value}, ...]} (each value parsed later by
  the key's type); ``pretrain`` (``--pretrain none,masked``): the axis ``pretrain`` of
  ``pretrain.objective`` (each cell from scratch and after self-pretraining)."""
  sweeps: dict[str, list[dict[str, Any]]] = {}
  if pretrain:
    values = [v.strip() for v in pretrain.split(",") if v.strip()]
    unknown = [v for v in values if v not in PRETRAIN_CHOICES]
    if unknown or not values:
      raise config_lib.ConfigError(f"--pretrain {pretrain!r}: expected a comma list of "
                                   f"{', '.join(PRETRAIN_CHOICES)}")
    sweeps["pretrain"] = [{"pretrain.objective": value} for value in dict.fromkeys(values)]
  for item in items or ():
    key, sep, values = item.partition("=")
    key, values_list = key.strip(), [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key or not values_list:
      raise config_lib.ConfigError(f"--sweep {item!r} is not of the form key=value1,value2,...")
    sweeps[_short_key(key)] = [{key: value} for value in values_list]
  return sweeps


def _short_key(key: str) -> str:
  return {"optimizer.learning_rate": "lr", "pretrain.objective": "pretrain"}.get(key, key.rpartition(".")[2])


def sweep_variants(protocol: str, task: str, sweeps: dict[str, list[dict[str, Any]]],
                   overrides: Sequence[str]) -> list[tuple[tuple[str, ...], str]]:
  """(overrides, variant name) per point of the protocol's sweep for ``task`` with ``sweeps`` (``--sweep``)
  added or replacing an axis of the same name; an axis with a key that an override (``--set``) fixes is
  not swept. Variant names read ``axis=value`` (the value of the point's first key). One point
  ((), "") without a sweep."""
  axes = {**config_lib.protocol_sweep(protocol, task), **sweeps}
  for axis, points in sweeps.items():  # a --sweep of a key replaces the protocol's axis holding it
    keys = set(points[0])
    axes = {name: pts for name, pts in axes.items() if name == axis or not keys & set(pts[0])}
  fixed = {item.split("=", 1)[0].strip() for item in overrides if "=" in item}
  axes = {name: points for name, points in axes.items() if points and not fixed & set(points[0])}
  return config_lib.sweep_points(axes)


def plan(protocol: str, task_names: Sequence[str], attention_names: Sequence[str], seeds: Sequence[int],
         results_dir: str, overrides: Sequence[str] = (), sweeps: dict[str, list[dict[str, Any]]] | None = None
         ) -> tuple[list[Cell], list[str]]:
  """The cells of the grid (task-major; each point of the task's sweep a cell of its own) and the tasks
  skipped because the protocol has no config."""
  cells, skipped, keys = [], [], set()
  for task in task_names:
    try:  # with the grid's first attention: an attention option (model.attention_kwargs.*) is its own
      config_lib.load_config(protocol, task, overrides, attention=attention_names[0] if attention_names else None)
    except config_lib.ConfigError as err:
      if "has no config for task" not in str(err):
        raise config_lib.ConfigError(f"task {task} (each --set applies to every task): {err}") from None
      logging.info("suite: skipping task %s: %s", task, err)
      skipped.append(task)
      continue
    for attention in attention_names:
      for seed in seeds:
        for point, variant in sweep_variants(protocol, task, sweeps or {}, overrides):
          cell_overrides = (*point, *overrides)
          where = f"{task}/{attention}/seed{seed}" + (f"[{variant}]" if variant else "")
          try:
            config = config_lib.load_config(protocol, task, cell_overrides, attention=attention, seed=seed)
          except config_lib.ConfigError as err:
            raise config_lib.ConfigError(f"cell {where}: {err}") from None
          _check_grid_keys(config, protocol, task, attention, seed)
          workdir = os.path.join(os.path.abspath(results_dir), "runs", protocol, task, attention,
                                 f"seed{seed}_{config_lib.config_hash(config)}")
          pre_workdir = None
          if "pretrain" in config:
            pre_workdir = os.path.join(os.path.dirname(workdir), "pretrain",
                                       f"seed{seed}_{config_lib.config_hash(pretrain.pretrain_config(config))}")
          cell = Cell(task, attention, seed, config, workdir, tuple(cell_overrides), variant, pre_workdir)
          if cell.key() not in keys:  # a name or seed given twice is one cell
            keys.add(cell.key())
            cells.append(cell)
  return cells, skipped


causal_form_problem = models.causal_form_problem  # where the grid and the SPT check share it


def without_causal_form(cells: Sequence[Cell]) -> tuple[list[Cell], dict[str, str]]:
  """(the cells whose attention can run causal as configured, attention -> why not for the others):
  a next-token task's grid lists each core without a causal form once instead of failing its cells."""
  kept, excluded, known = [], {}, {}
  for cell in cells:
    key = (cell.attention, config_lib.config_hash(cell.config.model), cell.config.data.max_length)
    if key not in known:
      known[key] = causal_form_problem(cell.config)
    if known[key] is None:
      kept.append(cell)
    else:
      excluded.setdefault(cell.attention, known[key])
  return kept, excluded


# Config keys the grid sets from its own flags: a --set of one would make several cells one run (two
# attentions training the same one, two seeds the same seed) whose records then collide.
GRID_KEYS = (("protocol", "--protocol"), ("task", "--tasks"), ("model.attention", "--attentions"),
             ("seed", "--seeds"))


def _check_grid_keys(config: ml_collections.ConfigDict, protocol: str, task: str, attention: str,
                     seed: int) -> None:
  """Raises ConfigError if an override replaced a value the grid sets (``GRID_KEYS``)."""
  wanted = {"protocol": protocol, "task": task, "model.attention": attention, "seed": seed}
  for key, flag in GRID_KEYS:
    value = functools.reduce(lambda section, part: section[part], key.split("."), config)
    if value != wanted[key]:
      raise config_lib.ConfigError(
          f"--set {key}={value}: {key} is set by {flag} (cell {task}/{attention}/seed{seed} would run "
          f"{key}={value!r}, and several cells would be one run); use {flag} instead of --set {key}")


def cell_status(cell: Cell, records: Sequence[dict]) -> str | None:
  """The best recorded outcome of ``cell`` (None if it has no record)."""
  key = cell.key()
  mine = [r for r in records if results.run_key(r) == key]
  return results.latest_records(mine)[0]["status"] if mine else None


def lock_path(results_dir: str, cell: Cell) -> str:
  return os.path.join(results_dir, "locks", cell.config.protocol, cell.task, cell.attention,
                      os.path.basename(cell.workdir) + ".lock")


def lock_holder(results_dir: str, cell: Cell) -> dict[str, Any] | None:
  """The holder the cell's lock file names (it may be stale: only a held lock means a running cell)."""
  try:
    with open(lock_path(results_dir, cell)) as f:
      return json.loads(f.read() or "null")
  except (OSError, json.JSONDecodeError):
    return None


@dataclasses.dataclass
class Claim:
  """Whether this process holds a cell's lock (true as a bool when it does) and the lock's descriptor."""

  held: bool
  fd: int | None = None

  def __bool__(self) -> bool:
    return self.held


@contextlib.contextmanager
def claim(results_dir: str, cell: Cell) -> Iterator[Claim]:
  """Yields whether this process holds the cell's lock (non-blocking; released on exit or death).

  The holder writes its pid, host and job id into the lock file (``lock_holder``); the lock is
  ``cell.exclusive``'s, the one a training run holds on its workdir. A ``flock`` belongs to the open
  file: a child given ``fd`` (an ``--isolate`` cell) holds the lock until it exits too."""
  with cell_lib.exclusive_file(lock_path(results_dir, cell)) as (holder, fd):
    yield Claim(holder is None, fd)


@contextlib.contextmanager
def _cell_logging(workdir: str) -> Iterator[None]:
  """Sends the cell's log to ``<workdir>/train.log`` and keeps only warnings on the console."""
  from absl import logging as absl_logging

  os.makedirs(workdir, exist_ok=True)
  handler = logging.FileHandler(os.path.join(workdir, "train.log"))
  handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
  root = logging.getLogger()
  console = absl_logging.get_absl_handler()
  old_level, old_root_level = console.level, root.level
  console.setLevel(logging.WARNING)
  root.setLevel(min(old_root_level or logging.INFO, logging.INFO))
  root.addHandler(handler)
  try:
    yield
  finally:
    root.removeHandler(handler)
    handler.close()
    console.setLevel(old_level)
    root.setLevel(old_root_level)


def _run_in_process(cell: Cell, data_dir: str, results_dir: str, force: bool) -> dict:
  import jax

  with _cell_logging(cell.workdir):
    try:
      return cell_lib.train_cell(cell.config, cell.workdir, data_dir, results_dir, force=force,
                                 pretrain_workdir=cell.pretrain_workdir)
    finally:
      jax.clear_caches()  # compiled executables of this cell are not needed by the next one


_die_with_parent = processes.die_with_parent  # an isolated cell dies with its suite


class Terminated(SystemExit):
  """The suite got SIGTERM while an isolated cell ran; the cell got it too and is not recorded."""


class _SigtermForward:
  """The suite's SIGTERM handler while an isolated cell runs: the first SIGTERM goes to the cell's process
  (``proc``, once started), a second one kills it; ``received`` lists what came."""

  def __init__(self) -> None:
    self.proc: subprocess.Popen | None = None
    self.received: list[int] = []

  def __call__(self, signum, frame) -> None:
    self.received.append(signum)
    self.send()

  def send(self) -> None:
    if self.proc is not None and self.received:
      with contextlib.suppress(ProcessLookupError):
        self.proc.send_signal(signal.SIGTERM if len(self.received) == 1 else signal.SIGKILL)


@contextlib.contextmanager
def _forward_sigterm() -> Iterator[_SigtermForward]:
  """Installs a ``_SigtermForward`` (before the cell starts: no SIGTERM is missed). Only the main thread
  can set handlers: elsewhere nothing is forwarded (the cell still dies with the suite)."""
  forward = _SigtermForward()
  try:
    previous = signal.signal(signal.SIGTERM, forward)
  except ValueError:  # not the main thread
    yield forward
    return
  try:
    yield forward
  finally:
    signal.signal(signal.SIGTERM, previous)


def _stop(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
  """Interrupts ``proc`` as a Ctrl-C does (it saves nothing new: its last checkpoint stays the resume
  point) and waits for it; kills it if it is still running after ``grace_s``."""
  with contextlib.suppress(ProcessLookupError):
    proc.send_signal(signal.SIGINT)
  try:
    proc.wait(grace_s)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


def _run_subprocess(cell: Cell, data_dir: str, results_dir: str, force: bool,
                    overrides: Sequence[str], lock_fd: int | None = None) -> dict:
  """The cell in a fresh ``lra-bench train`` process, which dies with the suite (``_die_with_parent``),
  gets the suite's SIGTERM (then the suite exits 143, no record) and holds the cell's lock (``lock_fd``)
  until it exits, so a rerun never races it."""
  os.makedirs(cell.workdir, exist_ok=True)
  cmd = [sys.executable, "-m", "lra_bench", "train", f"--task={cell.task}",
         f"--attention={cell.attention}", f"--protocol={cell.config.protocol}", f"--seed={cell.seed}",
         f"--workdir={cell.workdir}", f"--data_dir={data_dir}", f"--results_dir={results_dir}",
         *[f"--set={o}" for o in (cell.overrides or overrides)], *(["--force"] if force else []),
         *([f"--pretrain_workdir={cell.pretrain_workdir}"] if cell.pretrain_workdir else [])]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
  with open(os.path.join(cell.workdir, "train.log"), "a") as log, _forward_sigterm() as forward, \
      processes.forking():
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                            pass_fds=() if lock_fd is None else (lock_fd,), preexec_fn=_die_with_parent())
    forward.proc = proc
    forward.send()  # a SIGTERM that came while it started
    try:
      proc.wait()
    except BaseException:  # Ctrl-C: the cell ends before its claim is let go
      _stop(proc)
      raise
  if forward.received:
    print(f"suite: terminated (SIGTERM) during cell {cell.name}; rerun the same command to resume it",
          file=sys.stderr, flush=True)
    raise Terminated(128 + signal.SIGTERM)
  path = os.path.join(cell.workdir, "result.json")
  if os.path.exists(path):
    with open(path) as f:
      record = json.load(f)
    if record.get("config_hash") == config_lib.config_hash(cell.config):
      return record
  # The process died before it could write a record (crash, signal): record that, with the log's tail.
  with open(os.path.join(cell.workdir, "train.log"), errors="replace") as f:
    tail = f.read()[-1500:]
  return _failure_record(cell, *cell_lib.subprocess_outcome(proc.returncode, tail), data_dir, results_dir)


def _failure_record(cell: Cell, status: str, error: str, data_dir: str, results_dir: str) -> dict:
  record = results.train_record(cell.config, status, error=error[:cell_lib.MAX_ERROR_CHARS],
                                workdir=cell.workdir, data_dir=data_dir)
  results.write_json_atomic(os.path.join(cell.workdir, "result.json"), record)
  results.append_record(results_dir, record)
  return record


def run_cell(cell: Cell, data_dir: str, results_dir: str, *, force: bool = False, isolate: bool = False,
             overrides: Sequence[str] = (), lock_fd: int | None = None) -> dict:
  """Runs one claimed cell; whatever goes wrong ends as a record (KeyboardInterrupt propagates).

  ``lock_fd``: the descriptor of the cell's claim, handed to an isolated cell's process."""
  try:
    if isolate:
      return _run_subprocess(cell, data_dir, results_dir, force, overrides, lock_fd)
    return _run_in_process(cell, data_dir, results_dir, force)
  except (KeyboardInterrupt, SystemExit):
    raise
  except BaseException as err:
    logging.exception("suite: cell %s failed outside the training loop", cell.name)
    return _failure_record(cell, *cell_lib.outcome(err), data_dir, results_dir)


@dataclasses.dataclass
class Summary:
  ran: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # status -> cell names
  done_before: list[str] = dataclasses.field(default_factory=list)
  claimed_elsewhere: list[str] = dataclasses.field(default_factory=list)
  skipped_tasks: list[str] = dataclasses.field(default_factory=list)
  # attention -> why it has no causal form (next-token tasks; its cells are not in the grid)
  no_causal_form: dict[str, str] = dataclasses.field(default_factory=dict)
  unfinished: list[str] = dataclasses.field(default_factory=list)  # launched: no worker finished them
  queued: list[str] = dataclasses.field(default_factory=list)  # slurm: handed to the cluster, not waited for
  jobs: list[str] = dataclasses.field(default_factory=list)  # submitit job ids of the workers
  notes: list[str] = dataclasses.field(default_factory=list)  # launcher lines: log dir, dead workers, ...
  # status -> cells of the whole grid with that best record at the end (``final_statuses``)
  final: dict[str, list[str]] = dataclasses.field(default_factory=dict)
  # cell name -> (task, error) of its best record when that is not ``ok`` (``reasons``): what groups the
  # ``no_data`` cells by task and reason
  reasons: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0

  def statuses(self) -> dict[str, list[str]]:
    """Cells per status: of the whole grid when known (``final``), else of the cells run now."""
    return self.final or self.ran

  def lines(self) -> list[str]:
    if self.queued:
      out = [f"suite submitted in {self.seconds:.0f} s: {len(self.queued)} cells to run on the cluster; "
             f"{len(self.done_before)} already done"]
    else:
      statuses = self.statuses()
      # a cell running elsewhere when passed may have its record by the end: count each cell once
      total = len({n for names in statuses.values() for n in names} | {*self.claimed_elsewhere, *self.unfinished})
      counts = ", ".join(f"{len(statuses[k])} {k}" for k in sorted(statuses, key=_status_order))
      finished = {n for names in statuses.values() for n in names}
      running = [n for n in self.claimed_elsewhere if n not in finished]  # no record yet: still running
      if running:
        counts += f"{', ' if counts else ''}{len(running)} still running in another worker"
      ran = sum(map(len, self.ran.values()))
      out = [f"suite finished in {self.seconds:.0f} s: {total} cell{'' if total == 1 else 's'}"
             + (f": {counts}" if counts else "")
             + f" (ran now {ran}, already done {len(self.done_before)}"
             + (f", running elsewhere {len(self.claimed_elsewhere)}" if self.claimed_elsewhere else "")
             + (f", unfinished {len(self.unfinished)}" if self.unfinished else "") + ")"]
    if self.skipped_tasks:
      out.append("tasks without a config in this protocol (skipped): " + ", ".join(self.skipped_tasks))
    if self.no_causal_form:
      out.append(f"no causal form (not run on next-token tasks, {len(self.no_causal_form)}): "
                 + name_list(sorted(self.no_causal_form)))
    for status in ("failed", "oom"):  # cells to act on one by one: their names
      if self.statuses().get(status):
        out.append(f"{status}: " + name_list(self.statuses()[status]))
    out += self.no_data_lines()
    if self.unfinished:
      out.append("unfinished (a worker died; rerun the same command to finish them from their checkpoints): "
                 + name_list(self.unfinished))
    if self.exit_code():
      out.append("exit status 1: cells failed or were left unfinished; rerun the same command to retry them")
    return out + self.notes

  def no_data_lines(self) -> list[str]:
    """One line per task (and reason) of the ``no_data`` cells: ``no_data: text (46 cells): <reason and
    the command that prepares the data>``, in grid order; a cell without a known reason is grouped by the
    task its name starts with."""
    groups: dict[tuple[str, str], int] = {}
    for name in self.statuses().get("no_data", []):
      task, error = self.reasons.get(name, (name.split("/")[0], ""))
      groups[task, error] = groups.get((task, error), 0) + 1
    return [group_line("no_data", task, count, error) for (task, error), count in groups.items()]

  def exit_code(self) -> int:
    """1 when a cell of the grid ends ``failed`` or a worker left cells unfinished, else 0 (``oom`` and
    ``no_data`` are outcomes with their reason, as in ``run_all.sh``'s smoke grid without downloads)."""
    return int(bool(self.statuses().get("failed") or self.unfinished))


def _status_order(status: str) -> tuple[int, str]:
  return (results.STATUSES.index(status) if status in results.STATUSES else len(results.STATUSES), status)


def final_records(cells: Sequence[Cell], records: Sequence[dict]) -> dict[str, dict]:
  """cell name -> its best record (``results.latest_records``), in grid order; cells without one are left
  out."""
  best = {results.run_key(r): r for r in results.latest_records(records)}
  return {cell.name: best[key] for cell in cells if (key := cell.key()) in best}


def final_statuses(best: dict[str, dict]) -> dict[str, list[str]]:
  """status -> the cells whose best record has it, from ``final_records`` (cells without one are left out)."""
  out: dict[str, list[str]] = {}
  for name, record in best.items():
    out.setdefault(record["status"], []).append(name)
  return out


def reasons(named_records: dict[str, dict]) -> dict[str, tuple[str, str]]:
  """cell name -> (task, error) of each record that is not ``ok`` (``Summary.reasons``)."""
  return {name: (r.get("task") or name.split("/")[0], r.get("error") or "") for name, r in named_records.items()
          if r["status"] != "ok"}


def record_counts(cells: Sequence[Cell], records: Sequence[dict]) -> dict[tuple, int]:
  """How many records each cell has: the ``baseline`` of a launch (a cell with more records than its
  baseline was run since, by some worker of the launch, and is not run again by another)."""
  counts = {cell.key(): 0 for cell in cells}
  for record in records:
    key = results.run_key(record) if "task" in record else None
    if key in counts:
      counts[key] += 1
  return counts


class GridProgress:
  """The suite's progress on the console (``tasks.progress.Progress``): the cells that train counted apart
  from the cells skipped for missing data, and the time left from the cells that trained.

  The bar counts the cells that train: those finished with a trained outcome (``ok``, ``failed``, ``oom``)
  and those still to run that are not expected to lack their data. A cell is expected to lack it when its
  task says so from the filesystem (``Task.data_missing``, checked once per task and data options before the
  grid runs) or when a cell of the same task and data options ended ``no_data`` in this run. Such cells
  are shown as ``no data <done>/<expected>`` beside the bar, never in its time left, which is the mean time
  of the cells trained so far times the cells left to train, divided by the workers running side by side.
  Elsewhere than a terminal the bar is one line per trained cell (its name, outcome and time).
  """

  def __init__(self, cells: Sequence[Cell], data_dir: str, desc: str, *, workers: int = 1, enabled: bool = True):
    self.cells = {cell.name: cell for cell in cells}
    self.workers = max(1, workers)
    self.status: dict[str, str] = {}  # finished cells -> their outcome
    self.seconds: list[float] = []  # times of the trained cells
    self.missing = {cell.name for cell in cells if _data_missing(cell, data_dir)}
    self.missing_data: set[tuple] = set()  # (task, data options) with a no_data cell in this run
    self.bar = Progress(0, desc, "cells trained", remaining=self.seconds_left, enabled=enabled)
    self._show()

  def expected_missing(self, name: str) -> bool:
    cell = self.cells[name]
    return name in self.missing or _data_key(cell) in self.missing_data

  def counts(self) -> tuple[int, int, int, int]:
    """(trained, to train, no data, expected without data) of the grid now."""
    trained = sum(status != "no_data" for status in self.status.values())
    no_data = len(self.status) - trained
    left = [name for name in self.cells if name not in self.status]
    skip = sum(self.expected_missing(name) for name in left)
    return trained, len(left) - skip, no_data, skip

  def seconds_left(self) -> float | None:
    _, to_train, _, _ = self.counts()
    if not to_train:
      return 0.0
    if not self.seconds:
      return None
    return sum(self.seconds) / len(self.seconds) * to_train / self.workers

  def _show(self) -> None:
    trained, to_train, no_data, skip = self.counts()
    self.bar.set_total(trained + to_train)
    self.bar.set_extra(f"no data {no_data}/{no_data + skip}" if no_data + skip else "")

  def started(self, name: str, since: float | None = None) -> None:
    self.bar.set_status(name, since)

  def finished(self, name: str, status: str, seconds: float | None = None) -> None:
    """Cell ``name`` ended with ``status`` after ``seconds`` (None: not known)."""
    if name not in self.cells or name in self.status:
      return
    self.status[name] = status
    if status == "no_data":
      self.missing_data.add(_data_key(self.cells[name]))
      self._show()
      return
    if seconds is not None:
      self.seconds.append(seconds)
    self._show()
    took = f" in {clock(seconds)}" if seconds is not None else ""
    self.bar.advance(note=f"{name} {status}{took}")

  def passed(self, name: str) -> None:
    """Cell ``name`` is not run here (done before, or running in another process): out of the counts."""
    if self.cells.pop(name, None) is not None:
      self.missing.discard(name)
      self._show()

  def write(self, line: str) -> None:
    """A console line of the suite (a failed cell, a task without data): on stdout, above the bar."""
    self.bar.write(line, file=sys.stdout)

  def poll(self, grid) -> None:
    """A launch's progress from the records and the lock files: the cells finished since it was planned
    (their record's ``wall_seconds`` as their time) and the cells a live worker holds now."""
    records = results.load_records(grid.results_dir)
    best = final_records(grid.cells, records)
    for name, status in _ran_since(grid, records).items():
      self.finished(name, status, (best.get(name) or {}).get("wall_seconds"))
    running, host = [], socket.gethostname()
    for cell in grid.cells:
      if cell.name in self.status:
        continue
      holder = lock_holder(grid.results_dir, cell) or {}
      if holder.get("host") == host and isinstance(holder.get("pid"), int) and processes.running(holder["pid"]):
        running.append((holder.get("since") or time.time(), cell.name))
    if running:
      start = min(since for since, _ in running)
      self.started(", ".join(name for _, name in sorted(running)), time.monotonic() - (time.time() - start))
    else:
      self.started("")

  def close(self) -> None:
    self.bar.close()


def _data_key(cell: Cell) -> tuple:
  """What identifies the data a cell reads: its task and data options."""
  return cell.task, json.dumps(cell.config.data.options.to_dict(), sort_keys=True, default=str)


@functools.lru_cache(maxsize=256)
def _missing_reason(task: str, data_dir: str, options: str) -> str | None:
  try:
    return tasks_lib.get_task(task).data_missing(data_dir, **json.loads(options))
  except Exception:  # noqa: BLE001 - a guess for the progress display only; the cell itself decides
    return None


def _data_missing(cell: Cell, data_dir: str) -> str | None:
  """``Task.data_missing`` of the cell's data (cached per task and data options)."""
  return _missing_reason(cell.task, os.path.abspath(data_dir), _data_key(cell)[1])


def work(cells: Sequence[Cell], *, results_dir: str, data_dir: str, overrides: Sequence[str] = (),
         isolate: bool = False, retry: Sequence[str] = ("no_data", "failed"),
         baseline: dict[tuple, int] | None = None, progress: GridProgress | None = None, echo=None,
         done=None) -> Summary:
  """One pass over ``cells``: claim each, skip what is done, run the rest (the loop every worker runs).

  A cell is done if its best record is terminal (not in ``retry``) or it has more records than its
  ``baseline`` count (it ran since the launch began). ``progress``: the display to tell (``GridProgress``);
  ``echo``: where failure lines go (default: the display, else nowhere): one per ``failed`` or ``oom``
  cell, one per task (and reason) for ``no_data`` cells; ``done(name, record)``: called after each run.
  """
  summary = Summary()
  echo = echo or (progress.write if progress is not None else None)
  shown: set[tuple[str, str]] = set()  # (task, error) of the no_data lines printed
  for cell in cells:
    record = None
    start = time.perf_counter()
    with claim(results_dir, cell) as mine:
      if not mine:
        summary.claimed_elsewhere.append(cell.name)
      else:
        records = results.load_records(results_dir)  # re-check under the claim
        status = cell_status(cell, records)
        ran_since = baseline is not None and record_counts([cell], records)[cell.key()] > baseline.get(cell.key(), 0)
        if (status is not None and status not in retry) or ran_since:
          summary.done_before.append(cell.name)
        else:
          if progress is not None:
            progress.started(cell.name)
          record = run_cell(cell, data_dir, results_dir, force=status == "no_data", isolate=isolate,
                            overrides=overrides, lock_fd=mine.fd)
    if record is not None:
      summary.ran.setdefault(record["status"], []).append(cell.name)
      summary.reasons.update(reasons({cell.name: record}))
      if done is not None:
        done(cell.name, record)
      if echo is not None:
        line = _console_line(cell, record, shown)
        if line:
          echo(line)
      if progress is not None:
        progress.finished(cell.name, record["status"], time.perf_counter() - start)
    elif progress is not None:
      progress.passed(cell.name)
  return summary


def _console_line(cell: Cell, record: dict, shown: set[tuple[str, str]]) -> str | None:
  """The console line of a finished cell, or None: nothing for ``ok``; for ``no_data`` one line per task
  and reason (the reason and its fix; ``shown`` holds those printed), since every cell of a task without
  data fails alike; ``cell: status: reason`` for the others."""
  if record["status"] == "ok":
    return None
  if record["status"] != "no_data":
    return failure_line(cell.name, record)
  key = (cell.task, record.get("error") or "")
  if key in shown:
    return None
  shown.add(key)
  return f"{cell.task}: no_data (shown once for the task; the summary counts its cells): {one_line(key[1])}"


def run_suite(protocol: str, tasks: str | Sequence[str] = "all", attentions: str | Sequence[str] = "all",
              seeds: str | Sequence[int] = (0,), *, results_dir: str, data_dir: str,
              overrides: Sequence[str] = (), isolate: bool = False, retry_failed: bool = True,
              progress: bool = True, launcher: str = "inprocess",
              launcher_options: dict[str, Any] | None = None,
              sweeps: dict[str, list[dict[str, Any]]] | None = None) -> Summary:
  """Runs every cell of the grid that is not done yet (see the module docstring).

  ``launcher``: "inprocess" (this process), "local" (submitit local workers) or "slurm" (a submitit
  SLURM job array; returns once submitted). ``launcher_options``: see ``launcher.OPTION_KEYS``.
  """
  from lra_bench.experiments import launcher as launcher_lib

  options = launcher_lib.check_options(launcher, launcher_options)  # a bad flag fails before planning
  start = time.perf_counter()
  task_names = parse_names(tasks, tasks_lib.list_tasks(), "task")
  attention_names = parse_names(attentions, attention_zoo.list_layers(), "attention")
  cells, skipped = plan(protocol, task_names, attention_names, parse_ints(seeds), results_dir, overrides, sweeps)
  cells, no_causal = without_causal_form(cells)
  retry = ("no_data", "failed") if retry_failed else ("no_data",)

  def pending(cell: Cell, records) -> bool:
    status = cell_status(cell, records)
    return status is None or status in retry

  records = results.load_records(results_dir)
  todo = [c for c in cells if pending(c, records)]
  done_before = [c.name for c in cells if not pending(c, records)]
  logging.info("suite %s: %d cells, %d to run (%d done before)", protocol, len(cells), len(todo),
               len(done_before))
  baseline = record_counts(todo, records)
  if launcher != "inprocess":
    summary = _launch(launcher, options, todo, baseline, results_dir=results_dir, data_dir=data_dir,
                      overrides=overrides, isolate=isolate, retry=retry, progress=progress,
                      desc=f"suite {protocol}")
  else:
    display = GridProgress(todo, data_dir, f"suite {protocol}", enabled=progress)
    try:
      summary = work(todo, results_dir=results_dir, data_dir=data_dir, overrides=overrides, isolate=isolate,
                     retry=retry, baseline=baseline, progress=display)
    finally:
      display.close()
  summary.done_before = done_before + summary.done_before
  summary.skipped_tasks = skipped
  summary.no_causal_form = no_causal
  if not summary.queued:
    best = final_records(cells, results.load_records(results_dir))
    summary.final = final_statuses(best)
    summary.reasons = reasons(best)
  summary.seconds = time.perf_counter() - start
  return summary


def _launch(launcher: str, options: dict[str, Any], todo: list[Cell], baseline: dict[tuple, int], *,
            results_dir: str, data_dir: str, overrides: Sequence[str], isolate: bool, retry: Sequence[str],
            progress: bool, desc: str) -> Summary:
  """The grid on submitit workers (``launcher.launch``), summarized from the records when waited for."""
  from lra_bench.experiments import launcher as launcher_lib

  if not todo:
    return Summary()
  grid = launcher_lib.Grid(todo, os.path.abspath(results_dir), os.path.abspath(data_dir), list(overrides),
                           bool(isolate), tuple(retry), baseline, work, lock_holder)
  display = None
  if launcher == "local":
    workers = launcher_lib.worker_count(launcher, options, len(todo))
    display = GridProgress(todo, data_dir, desc, workers=workers, enabled=progress)
  try:
    done = launcher_lib.launch(launcher, options, grid, watch=None if display is None else
                               lambda: display.poll(grid))
  finally:
    if display is not None:
      display.close()
  if not done.waited:
    return Summary(queued=[c.name for c in todo], jobs=done.jobs, notes=done.notes)
  summary = settle(grid, done.outputs)
  summary.jobs, summary.notes = done.jobs, done.notes
  return summary


def _ran_since(grid, records: Sequence[dict] | None = None) -> dict[str, str]:
  """Cells of a launch that have a new record since it was planned -> the status of their best record
  (``records``: the results file's, read when not given)."""
  records = results.load_records(grid.results_dir) if records is None else records
  out = {}
  for cell in grid.cells:
    key = cell.key()
    mine = [r for r in records if "task" in r and results.run_key(r) == key]
    if len(mine) > grid.baseline.get(key, 0):
      out[cell.name] = results.latest_records(mine)[0]["status"]
  return out


def settle(grid, outputs: Sequence[dict]) -> Summary:
  """The summary of a finished launch, from ``results.jsonl`` (it covers every worker, dead ones too);
  a cell without a new record is ``unfinished`` unless its lock is still held (running elsewhere)."""
  summary = Summary()
  records = results.load_records(grid.results_dir)
  recorded = _ran_since(grid, records)
  best = final_records(grid.cells, records)  # the reasons (a no_data rerun appends no record: its last one)
  reported = {name: status for out in outputs for name, status in out["ran"].items()}
  for cell in grid.cells:
    status = recorded.get(cell.name) or reported.get(cell.name)  # reported: rerun, same record (no_data)
    if status is not None:
      summary.ran.setdefault(status, []).append(cell.name)
      if status != "ok" and cell.name in best and best[cell.name]["status"] == status:
        summary.reasons.update(reasons({cell.name: best[cell.name]}))
      continue
    with claim(grid.results_dir, cell) as free:
      (summary.unfinished if free else summary.claimed_elsewhere).append(cell.name)
  return summary
