"""One run -> one record, and the failure policy of every run in one place.

``train_cell(config, workdir, data_dir, results_dir)`` trains one config and writes its record to
``<workdir>/result.json`` (and appends it to ``<results_dir>/results.jsonl``); whatever goes wrong
becomes a record too, never half a record. ``outcome(err)`` is the failure policy the suite and the
benchmark use as well:

- ``no_data``: the task's data is missing (``tasks.MissingDataError``); the error names the command
  that prepares it;
- ``oom``: the device (or host) ran out of memory; for a benchmark point, a worker killed by SIGKILL;
- ``failed``: anything else (NaN loss, bad data, a config the devices cannot take, a timeout, a bug).

One process trains a workdir at a time: ``train_cell`` holds an exclusive lock on ``<workdir>/.lock``
(``exclusive``, the same lock as the suite's per-cell claims), and a second process raises
``WorkdirBusyError`` naming the pid and host that hold it, before it reads or writes anything there.

``KeyboardInterrupt`` and ``SystemExit`` are never records: they propagate, and so does a refusal to
resume another config's checkpoints (``checkpoints.ConfigMismatchError``: nothing ran, and the workdir's
``result.json`` keeps the earlier run's record) and a record that could not be written
(``results.RecordWriteError``). Paths may be relative: they are made absolute here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import time
import traceback
from typing import Any, Iterator

import jax
import ml_collections

import tasks as tasks_lib
from tasks import plan
from lra_bench import files
from lra_bench.errors import UserError
from lra_bench.experiments import results
from lra_bench.training import config as config_lib
from lra_bench.training import checkpoints, loop, objectives, pretrain, xla_stats

MAX_ERROR_CHARS = 2000
LOCK_FILE = ".lock"  # in the workdir, held while a process trains it


class WorkdirBusyError(UserError, RuntimeError):
  """Another process is training this workdir. Not a result of the run: nothing was read or written."""

  exit_code = 1


def holder_info() -> dict[str, Any]:
  """Who holds a lock: pid, host and scheduler job (with many workers on a cluster, the file says which)."""
  job = results.slurm_job() or os.environ.get("SUBMITIT_LOCAL_JOB_ID")
  return {"pid": os.getpid(), "host": socket.gethostname(), "job": job, "since": time.time()}


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[dict[str, Any] | None]:
  """A non-blocking exclusive ``flock`` on ``path`` (created if missing; the OS releases it when the
  process dies). Yields None when this process holds it (the file then names it, ``holder_info``),
  else the holder the file names (``{}`` when it cannot be read)."""
  with exclusive_file(path) as (holder, _):
    yield holder


@contextlib.contextmanager
def exclusive_file(path: str) -> Iterator[tuple[dict[str, Any] | None, int | None]]:
  """``exclusive``, also yielding the lock file's descriptor while held (``(None, fd)``), so a child
  process given it keeps the lock until it exits too; ``(holder, None)`` when another process holds it."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "a+") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      try:
        holder = json.loads(f.read() or "null")
      except json.JSONDecodeError:
        holder = None
      yield (holder if isinstance(holder, dict) else {}), None
      return
    try:
      f.truncate(0)
      f.write(json.dumps(holder_info()) + "\n")
      f.flush()
      yield None, f.fileno()
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def describe_holder(holder: dict[str, Any]) -> str:
  """``pid 123 on host h (job 7)`` from a lock file's holder."""
  if not holder.get("pid"):
    return "another process"
  job = f" (job {holder['job']})" if holder.get("job") else ""
  return f"pid {holder['pid']} on host {holder.get('host', '?')}{job}"


@contextlib.contextmanager
def workdir_lock(workdir: str) -> Iterator[None]:
  """Holds ``<workdir>/.lock`` (one per process of a multi-host run) or raises ``WorkdirBusyError``."""
  name = LOCK_FILE if jax.process_count() == 1 else f"{LOCK_FILE}.process{jax.process_index()}"
  with exclusive(os.path.join(workdir, name)) as holder:
    if holder is not None:
      raise WorkdirBusyError(f"{workdir} is being trained by {describe_holder(holder)}; wait for that run "
                             "to finish (or stop it), or give this one another --workdir")
    yield


def disk_full(err: BaseException) -> bool:
  """Whether ``err`` (or an error it came from) says the disk is full: ``ENOSPC``, however the library
  that hit it (orbax/TensorStore, TensorFlow, Python) wrapped it."""
  seen = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if getattr(err, "errno", None) == errno.ENOSPC or "No space left on device" in str(err):
      return True
    err = err.__cause__ or err.__context__
  return False


def disk_full_message(err: BaseException, workdir: str | None) -> str:
  """One line: ENOSPC, where, and the fix (a rerun resumes from the last checkpoint)."""
  text = "\n".join(str(e) for e in (err, err.__cause__, err.__context__) if e is not None)
  paths = [p for p in [getattr(err, "filename", None), *re.findall(r"(/[^\s\"';:]+)", text)] if p]
  mine = [p for p in paths if workdir and p.startswith(workdir)]  # else one in an existing directory
  paths = mine or [p for p in paths if os.path.isdir(os.path.dirname(p.rstrip("/")) or "/")]
  where = (paths or [workdir or "the run's workdir"])[0]
  return (f"disk full (ENOSPC: No space left on device) while writing {where}; free space on that "
          f"filesystem (df -h {workdir or where}) or give the run another --workdir, then rerun the same "
          "command: it resumes from the last complete checkpoint")


def outcome(err: BaseException, workdir: str | None = None) -> tuple[str, str]:
  """(status, message) of a failed run: ``oom`` or ``failed`` (``no_data`` is ``missing_data``'s).

  Errors whose message is written for the user (``errors.UserError``; below lra_bench, the tasks'
  ``DataError``) keep it as is; a full disk is one line with the fix (``disk_full_message``); any other
  error is prefixed with its type.
  """
  if disk_full(err):  # before is_oom: TensorStore reports ENOSPC as RESOURCE_EXHAUSTED
    return "failed", disk_full_message(err, workdir)
  status = "oom" if xla_stats.is_oom(err) else "failed"
  clear = isinstance(err, (UserError, tasks_lib.DataError))
  message = str(err) if clear else f"{type(err).__name__}: {err}"
  return status, message.strip()[:MAX_ERROR_CHARS]


def _run_options(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The ``data prepare`` options that make the data ``config`` reads (``tasks.plan.run_options``)."""
  return plan.run_options(config.task, config.data.prepare.to_dict(), config.data.options.to_dict())


def missing_data(err: tasks_lib.MissingDataError, config: ml_collections.ConfigDict, data_dir: str) -> str:
  """The ``no_data`` message: what is missing and the command that prepares exactly the data this run
  reads (``tasks.plan.fix_command``: the protocol's preset and whatever the run's overrides changed in it)."""
  try:
    preset = _run_options(config_lib.load_config(config.protocol, config.task))
    points = [_run_options(run) for run in config_lib.protocol_runs(config.protocol, config.task)]
  except (config_lib.ConfigError, ImportError):  # a protocol made in Python: spell every option out
    preset, points = None, []
  fix = plan.fix_command(config.task, config.protocol, data_dir, _run_options(config), preset, points)
  return str(err).split("\n")[0] + f"\nPrepare it for protocol {config.protocol!r} with:\n  {fix}"


def subprocess_outcome(returncode: int, stderr_tail: str) -> tuple[str, str]:
  """(status, message) of a worker process that died without writing its result."""
  if returncode == -9:  # SIGKILL: almost always the kernel's OOM killer
    return "oom", f"worker killed by SIGKILL (host out of memory?)\n{stderr_tail}"
  return "failed", f"worker exited with {returncode}\n{stderr_tail}"


def previous_record(workdir: str, config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """The terminal record ``<workdir>/result.json`` holds for this very config, if any."""
  path = os.path.join(workdir, "result.json")
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      previous = json.load(f)
  except (OSError, ValueError) as err:  # rewritten (atomically) when this run ends
    logging.warning("%s cannot be read (%s); running the config again", path, err)
    return None
  if not isinstance(previous, dict):
    return None
  if previous.get("config_hash") == config_lib.config_hash(config) and previous.get("status") in results.TERMINAL:
    return previous
  return None


def train_cell(config: ml_collections.ConfigDict, workdir: str, data_dir: str,
               results_dir: str | None = None, force: bool = False,
               pretrain_workdir: str | None = None) -> dict[str, Any]:
  """Runs one training config and writes its record; failures become records too.

  A workdir whose ``result.json`` already holds a terminal record for the same config is not rerun
  (unless ``force``); an interrupted run resumes from its checkpoint.

  A config with a ``pretrain`` section (``lra_bench.training.pretrain``) runs its self-pretraining first
  (objective ``objectives.select(config, objectives.PRETRAIN)``), as a run of its own in ``pretrain_workdir``
  (default ``<workdir>/pretrain``) with its own record (``kind: pretrain``), unless that workdir already holds
  its finished record; the classifier then starts from the pretraining's best-validation encoder, and its
  record's ``pretrain`` field names that run (``pretrain_link``). A kill in either stage resumes in that stage;
  ``force`` reruns both.
  """
  workdir, data_dir = files.absolute(workdir), files.absolute(data_dir)
  results_dir = files.absolute(results_dir) if results_dir else None
  os.makedirs(workdir, exist_ok=True)
  with workdir_lock(workdir):
    return _train_locked(config, workdir, data_dir, results_dir, force, pretrain_workdir)


def _train_locked(config: ml_collections.ConfigDict, workdir: str, data_dir: str, results_dir: str | None,
                  force: bool, pretrain_workdir: str | None = None) -> dict[str, Any]:
  """``train_cell`` once the workdir is this process's."""
  previous = None if force else previous_record(workdir, config)
  if previous is not None:
    logging.info("%s already holds a %r result for this config; not rerunning", workdir, previous["status"])
    if results_dir:
      results.append_record(results_dir, previous)
    return previous
  if force:
    for stale in ("checkpoints", "tensorboard"):  # a forced run's curve starts empty (``loop.validation_curve``)
      shutil.rmtree(os.path.join(workdir, stale), ignore_errors=True)
  where = dict(workdir=workdir, data_dir=data_dir)
  link, init_from = {}, None
  if "pretrain" in config:
    pre_dir = files.absolute(pretrain_workdir or os.path.join(workdir, "pretrain"))
    pre_record = pretrain_stage(config, pre_dir, data_dir, results_dir, force)
    link = {"pretrain": pretrain_link(pre_record)}
    if pre_record["status"] != "ok":
      error = pre_record.get("error") or ""
      record = results.train_record(config, pre_record["status"], error=(
          error if pre_record["status"] == "no_data" else f"the self-pretraining run in {pre_dir} ended "
          f"{pre_record['status']!r}: {error}"), **where, **link)
      if jax.process_index() == 0:
        _write(record, workdir, results_dir)
      return record
    init_from = pretrain.initializer(pretrain.pretrain_config(config), pre_dir, pre_record["best_step"])
  return _recorded_run(config, workdir, data_dir, results_dir, config, fields={**where, **link},
                       objective=objectives.select(config, objectives.TRAIN), init_from=init_from)


def _recorded_run(config: ml_collections.ConfigDict, workdir: str, data_dir: str, results_dir: str | None,
                  data_config: ml_collections.ConfigDict, *, fields: dict[str, Any], **run) -> dict[str, Any]:
  """Runs ``loop.train_and_evaluate(config, workdir, data_dir, **run)`` and writes its record (``fields``
  added; process 0 writes): ``ok`` with the measurements, ``no_data`` with the command that makes the data
  of ``data_config``, or the failure's status and message (its traceback in ``<workdir>/error.log``).
  Ctrl-C, a signal's exit and another config's checkpoints are raised, not recorded."""
  try:
    record = results.train_record(config, "ok", **fields, **loop.train_and_evaluate(config, workdir, data_dir, **run))
  except tasks_lib.MissingDataError as err:
    record = results.train_record(config, "no_data", error=missing_data(err, data_config, data_dir), **fields)
  except (KeyboardInterrupt, SystemExit, checkpoints.ConfigMismatchError):
    raise
  except BaseException as err:  # noqa: BLE001 - every failure becomes a record
    _save_traceback(workdir)
    status, message = outcome(err, workdir)
    record = results.train_record(config, status, error=message, **fields)
  if jax.process_index() == 0:
    _write(record, workdir, results_dir)
  return record


PRETRAIN_LINK_FIELDS = ("status", "config_hash", "workdir", "best_step", "best_val_accuracy", "test_accuracy",
                        "test_loss", "train_steps")


def pretrain_link(pre_record: dict[str, Any]) -> dict[str, Any]:
  """What a fine-tuning record says of its pretraining run: the objective, the mask rate, and the
  pretraining record's status, config hash, workdir, best step, masked-position (or next-token) accuracy on
  validation and test, test loss, and steps."""
  section = pre_record["config"]["pretrain"]
  return {"objective": section["objective"], "mask_rate": section.get("mask_rate"),
          **{name: pre_record.get(name) for name in PRETRAIN_LINK_FIELDS}}


WAIT_SECONDS = 5.0  # how often a stage waiting for another process's pretraining of the same config looks


@contextlib.contextmanager
def waiting_lock(workdir: str) -> Iterator[None]:
  """Holds ``<workdir>/.lock``, waiting while another process holds it (two cells sharing one pretraining:
  the second waits for the first to finish it, then reads its record)."""
  said = False
  while True:
    with exclusive(os.path.join(workdir, LOCK_FILE)) as holder:
      if holder is None:
        yield
        return
    if not said:
      logging.warning("waiting for %s, which is training %s", describe_holder(holder), workdir)
      said = True
    time.sleep(WAIT_SECONDS)


def pretrain_stage(config: ml_collections.ConfigDict, pre_dir: str, data_dir: str, results_dir: str | None,
                   force: bool) -> dict[str, Any]:
  """The self-pretraining run of ``config`` in ``pre_dir``: its finished record if ``pre_dir`` holds one
  for the same pretraining config (unless ``force``), else the record of running it (resumed from its
  checkpoint if it was interrupted); failures become records, as ``train_cell``'s."""
  pre_config = pretrain.pretrain_config(config)
  os.makedirs(pre_dir, exist_ok=True)
  with waiting_lock(pre_dir):
    previous = None if force else previous_record(pre_dir, pre_config)
    if previous is not None and previous.get("kind") == "pretrain":
      logging.info("%s already holds a %r pretraining for this config; not rerunning", pre_dir,
                   previous["status"])
      return previous
    if force:
      for stale in ("checkpoints", "tensorboard"):
        shutil.rmtree(os.path.join(pre_dir, stale), ignore_errors=True)
    logging.info("self-pretraining (%s) in %s", pre_config.pretrain.objective, pre_dir)
    # a missing dataset names the fine-tuning config's prepare command (the same data)
    return _recorded_run(pre_config, pre_dir, data_dir, results_dir, config,
                         fields=dict(workdir=pre_dir, data_dir=data_dir, kind="pretrain"),
                         objective=objectives.select(pre_config, objectives.PRETRAIN))


def _save_traceback(workdir: str) -> None:
  """``<workdir>/error.log``: the traceback of the exception being handled; best effort (on a full disk
  it cannot be written, and the failure handler must not fail)."""
  with contextlib.suppress(OSError):
    files.write_atomic(os.path.join(workdir, "error.log"), traceback.format_exc())


def _write(record: dict[str, Any], workdir: str, results_dir: str | None) -> None:
  """``result.json``, then the results file; says where (INFO: `train` shows it; a suite
  keeps it in the cell's train.log, its console shows the progress bar)."""
  path = os.path.join(workdir, "result.json")
  try:
    results.write_json_atomic(path, record)
    if results_dir:
      results.append_record(results_dir, record)
  except results.RecordWriteError as err:
    if record["status"] == "ok":
      raise
    # The run's own failure first (often the same full disk), then why there is no record of it.
    raise results.RecordWriteError(f"run {record['status']}: {record['error'].splitlines()[0]}; and "
                                   f"no {record['status']!r} record: {err}") from err
  if results_dir:
    path += " and " + os.path.join(results_dir, results.RESULTS_FILE)
  logging.info("%s record written to %s", record["status"], path)  # train shows INFO; a suite only its bar
