"""Checkpoints of a run: orbax ``last`` and ``best`` states and the input iterator's state beside ``last``.

Exact resume: the ``last`` checkpoint holds params, optimizer state, step and the base PRNG key (per-step
keys are ``fold_in(key, step)``), and the input iterator's state (tf.data's position and shuffle buffer,
or the numpy pipeline's epoch and batch: ``iterator_checkpoint``) is saved beside it, so a
killed run continued with the same command ends with the same numbers as an uninterrupted one.

Consistent under a kill at any instant: the ``last`` save is the commit point. Its progress names the
best step of the committed state, and ``best`` keeps that step until the next ``last`` commit, plus at
most the newest best found since (``save_best``). A run that resumes drops every best step newer than
the state it resumes from (the replayed steps save them again) and a run that starts from scratch drops
them all, so no rerun meets a step that already exists (orbax's ``StepAlreadyExistsError``) or reports
the best parameters of steps it replays. orbax writes each step into a temporary directory, renames it
when complete and removes leftover temporary directories when it opens a manager.

Never mixed: the progress of ``last`` also holds the config it was trained with, and a run whose config
differs (keys in ``RESULT_NEUTRAL_KEYS`` apart) refuses to resume it (``ConfigMismatchError``) before
reading its state. A checkpoint that cannot be read raises ``CheckpointError`` naming the directory and
the fix, never an orbax/TensorStore traceback.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
import threading
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

from lra_bench import files
from lra_bench.errors import ConfigError, UserError
from lra_bench.training import config as config_lib
from lra_bench.training.steps import TrainState
from tasks import base as tasks_base

RESULT_NEUTRAL_KEYS = config_lib.RESULT_NEUTRAL_KEYS  # logging and checkpoint cadence: may differ on resume


class CheckpointError(UserError, RuntimeError):
  """A checkpoint cannot be read. The message names the directory and the fix."""

  exit_code = 1


class ConfigMismatchError(ConfigError):
  """The workdir holds checkpoints of another config. Not a result of the run: nothing was trained."""


def flat_config(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  """{"model.num_layers": 2, ...} from a nested config dict; an empty section has no keys (as if absent)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flat_config(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def config_differences(stored: dict[str, Any], config: dict[str, Any]) -> list[str]:
  """``key: stored -> new`` for every (dotted) key whose value differs, ``RESULT_NEUTRAL_KEYS`` apart."""
  old, new, missing = flat_config(stored), flat_config(_as_json(config)), "(none)"
  return [f"{key}: {old.get(key, missing)!r} -> {new.get(key, missing)!r}" for key in sorted(set(old) | set(new))
          if not config_lib.is_result_neutral(key) and old.get(key, missing) != new.get(key, missing)]


def _as_json(config: dict[str, Any]) -> dict[str, Any]:
  """The config as it reads back from JSON (tuples become lists), so stored and new compare equal."""
  return json.loads(json.dumps(config))


class _LoopClosedNoiseFilter:
  """``sys.stderr`` without the "Event loop is closed" tracebacks TensorStore prints from its threads.

  When orbax's restore fails (a corrupt checkpoint), the reads still in flight complete after orbax
  closed its asyncio loop, and TensorStore prints one 6-line traceback per read (thousands for a real
  model) from C++, past every logger, burying the one-line error. This drops exactly those lines (a
  ``Traceback`` header is held until the next line shows whether it starts such a block); everything
  else is written through unchanged, partial lines (progress bars) too.
  """

  NOISE = re.compile(r'  File ".*asyncio/base_events\.py", line \d+, in (call_soon_threadsafe|_check_closed)'
                     r"|    self\._check_closed\(\)|    raise RuntimeError\('Event loop is closed'\)"
                     r"|RuntimeError: Event loop is closed")
  HEADER = "Traceback (most recent call last):"
  STARTS = (HEADER, '  File "', "    ", "RuntimeError: Event loop is closed")  # of lines it may drop

  def __init__(self, stream):
    self.stream, self._partial, self._header = stream, {}, {}
    self._lock = threading.Lock()

  def write(self, text: str) -> int:
    with self._lock:
      thread = threading.get_ident()
      text = self._partial.pop(thread, "") + text
      *lines, rest = text.split("\n")
      for line in lines:
        self._line(thread, line)
      if rest and any(start.startswith(rest) or rest.startswith(start) for start in self.STARTS):
        self._partial[thread] = rest  # perhaps the start of a noise line: wait for its end
      elif rest:
        self.stream.write(rest)
    return len(text)

  def _line(self, thread: int, line: str) -> None:
    header = self._header.pop(thread, None)
    if self.NOISE.fullmatch(line):
      return
    if header is not None:
      self.stream.write(header + "\n")
    if line == self.HEADER:
      self._header[thread] = line
    else:
      self.stream.write(line + "\n")

  def __getattr__(self, name: str):  # flush, fileno, isatty, encoding ...
    return getattr(self.stream, name)


@contextlib.contextmanager
def quiet_orbax():
  """orbax's ERROR logs (a traceback per failed thread: hundreds of lines for a full disk) off while a
  save or restore runs, unless ``--verbosity`` turned the libraries' logs on: the exception it raises
  becomes one line naming the directory (and the run's error.log keeps the traceback)."""
  logger = logging.getLogger("absl")  # orbax logs through absl
  level = logger.level
  if level >= logging.WARNING:
    logger.setLevel(logging.CRITICAL + 1)
  try:
    yield
  finally:
    logger.setLevel(level)


def quiet_loop_closed_noise() -> None:
  """Installs ``_LoopClosedNoiseFilter`` on ``sys.stderr`` (once per process)."""
  if not isinstance(sys.stderr, _LoopClosedNoiseFilter):
    sys.stderr = _LoopClosedNoiseFilter(sys.stderr)


class Checkpoints:
  """``<workdir>/checkpoints/{last,best}`` (orbax) + the input iterator's state beside ``last``."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict):
    self.root = os.path.join(files.absolute(workdir), "checkpoints")
    self.config = _as_json(config.to_dict())
    # orbax coordinates the processes of a multi-host run; the input iterator's state is per process.
    # ``best`` keeps every step it is given; ``_keep_best`` prunes it (see the module docstring).
    options = lambda keep: ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                                        enable_async_checkpointing=False,
                                                        cleanup_tmp_directories=True)
    self.last = self._manager("last", options(1))
    self.best = self._manager("best", options(None))
    self.data_dir = os.path.join(self.root, "data")
    if jax.process_count() > 1:
      self.data_dir = os.path.join(self.data_dir, f"process_{jax.process_index()}")
    self.committed_best_step = 0  # the best step the committed ``last`` progress names (0: none)

  def unreadable(self, directory: str, err: BaseException) -> CheckpointError:
    """The one-line error for a checkpoint ``directory`` that ``err`` says cannot be read."""
    cause = (str(err).strip().splitlines() or [""])[0][:200]
    return CheckpointError(
        f"cannot read the checkpoint {directory} ({type(err).__name__}: {cause}); it is corrupted or "
        f"half-written. Rerun with --force to train this run from scratch, or delete {self.root}")

  def _manager(self, name: str, options) -> ocp.CheckpointManager:
    directory = os.path.join(self.root, name)
    try:
      return ocp.CheckpointManager(directory, options=options)
    except Exception as err:
      raise self.unreadable(directory, err) from err

  def _step_dir(self, manager: ocp.CheckpointManager, step: int) -> str:
    return os.path.join(str(manager.directory), str(step))

  def _keep_best(self, *keep: int) -> None:
    """Deletes every ``best`` step but ``keep``."""
    for step in self.best.all_steps():
      if step not in keep:
        self.best.delete(step)

  def save_last(self, step: int, state: TrainState, progress: dict, iterator_ckpt) -> None:
    data_prefix = iterator_ckpt.write(os.path.join(self.data_dir, f"iter-{step}"))
    progress = dict(progress, data_checkpoint=os.path.relpath(data_prefix, self.root), config=self.config)
    # The orbax save is the commit point: a crash before it leaves the previous checkpoint in force.
    with quiet_orbax():
      self.last.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   progress=ocp.args.JsonSave(progress)), force=True)
      self.last.wait_until_finished()
    self._committed(step, progress)

  def _committed(self, step: int, progress: dict) -> None:
    """After a ``last`` commit: only its best step stays in ``best``; unreferenced iterator states go."""
    self.committed_best_step = progress["best_step"]
    self._keep_best(self.committed_best_step)
    for name in os.listdir(self.data_dir):
      if not name.startswith(f"iter-{step}") and name != "checkpoint":
        path = os.path.join(self.data_dir, name)
        if os.path.isdir(path):  # ``iter-<step>_temp/``: a write that a kill interrupted
          shutil.rmtree(path)
        else:
          os.remove(path)

  def restore_last(self, target: TrainState, iterator_ckpt):
    """(state, progress) of the latest ``last`` step, or None; prunes ``best`` to match either way.

    Raises ``ConfigMismatchError`` (before reading the state) if that step was trained with another
    config, ``CheckpointError`` if it cannot be read.
    """
    step = self.last.latest_step()
    if step is None:
      self._keep_best()  # a fresh start: best steps of an earlier attempt would be replayed
      return None
    quiet_loop_closed_noise()  # a corrupt checkpoint's error must not drown in TensorStore's threads
    progress = self._read_progress(step)
    directory = self._step_dir(self.last, step)
    try:
      with quiet_orbax():
        restored = self.last.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
      # progress (written by process 0) names process 0's file; each process reads its own of that step.
      data_prefix = os.path.join(self.data_dir, os.path.basename(progress["data_checkpoint"]))
      iterator_ckpt.read(data_prefix).expect_partial()
    except Exception as err:
      raise self.unreadable(directory, err) from err
    self.committed_best_step = progress["best_step"]
    self._keep_best(self.committed_best_step)
    return restored["state"], progress

  def check_config(self) -> None:
    """Raises ``ConfigMismatchError`` if the ``last`` checkpoint was trained with another config."""
    step = self.last.latest_step()
    if step is not None:
      self._read_progress(step)

  def _read_progress(self, step: int) -> dict:
    """The progress of ``last`` step ``step``, after checking it was trained with this config."""
    directory = self._step_dir(self.last, step)
    try:
      with quiet_orbax():
        progress = dict(self.last.restore(step, args=ocp.args.Composite(progress=ocp.args.JsonRestore()))["progress"])
    except Exception as err:
      raise self.unreadable(directory, err) from err
    fix = (f"rerun with --force to train this run from scratch, or use another --workdir than "
           f"{os.path.dirname(self.root)}")
    if "config" not in progress:
      raise ConfigMismatchError(f"{directory} was written without its config, so it cannot be resumed "
                                f"safely; {fix}")
    differences = config_differences(progress["config"], self.config)
    if differences:
      raise ConfigMismatchError(f"{self.root} holds a run with a different config "
                                f"({'; '.join(differences)}); {fix}")
    return progress

  def save_best(self, step: int, state: TrainState) -> None:
    """Saves ``step`` as the newest best; keeps the committed best until the next ``last`` commit."""
    self._keep_best(self.committed_best_step)  # an interrupted save_best/_committed left more
    with quiet_orbax():
      self.best.save(step, args=ocp.args.StandardSave({"params": state.params,
                                                       "model_state": state.model_state}), force=True)
      self.best.wait_until_finished()
    self._keep_best(self.committed_best_step, step)

  def restore_best(self, target: TrainState, step: int):
    """The ``{params, model_state}`` saved as best at ``step``, or None if no best was saved (step 0)."""
    directory = self._step_dir(self.best, step)
    quiet_loop_closed_noise()
    if step not in self.best.all_steps():
      if not step:
        return None
      raise self.unreadable(directory, FileNotFoundError("the best checkpoint of this step is missing"))
    try:
      with quiet_orbax():
        return self.best.restore(step, args=ocp.args.StandardRestore(
            {"params": target.params, "model_state": target.model_state}))
    except Exception as err:
      raise self.unreadable(directory, err) from err


class ArrayIteratorCheckpoint:
  """``tf.train.Checkpoint(iterator=...)``'s interface for an ``ArrayIterator``: ``write(prefix)`` saves
  its state to ``<prefix>.json`` (atomically) and returns the prefix; ``read(prefix)`` restores it."""

  def __init__(self, iterator: tasks_base.ArrayIterator):
    self.iterator = iterator

  def write(self, prefix: str) -> str:
    files.write_atomic(f"{prefix}.json", json.dumps(self.iterator.state()))
    return prefix

  def read(self, prefix: str) -> "ArrayIteratorCheckpoint":
    with open(f"{prefix}.json") as f:
      self.iterator.restore(json.load(f))
    return self

  def expect_partial(self) -> None:
    """(tf.train.Checkpoint's status call; nothing to check here.)"""


def iterator_checkpoint(iterator):
  """What saves and restores the training iterator's position beside each checkpoint."""
  if isinstance(iterator, tasks_base.ArrayIterator):
    return ArrayIteratorCheckpoint(iterator)
  return tasks_base.import_tf().train.Checkpoint(iterator=iterator)
