"""The result record (docs/ARCHITECTURE.md, "The record"): one JSON object per finished or failed run.

This module is the only place records are built (``train_record``, ``bench_record``, both through
``make_record``), read and written.
Records are appended to ``<results_dir>/results.jsonl`` under an exclusive file lock, and written as
``<workdir>/result.json``; both writes are all-or-nothing: an append is one ``write`` of one whole line
on an ``O_APPEND`` descriptor, checked and fsynced, and truncated back if anything fails (a full disk);
a JSON file is written to a temporary file and renamed over. A failed write raises ``RecordWriteError``
(no record is ever lost without a word). A line cut short by an older crash does not swallow the next
record (that one starts on a new line), and readers name every line they cannot read (stderr, and the
report's index). A record whose run (task, attention, protocol, seed, config hash) already has a
terminal record is not appended twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
from typing import Any, Iterable, Iterator

import ml_collections

from lra_bench import errors, files
from lra_bench.training.config import PRESET_CADENCE, at_preset_cadence, config_hash
from lra_bench.training.objectives import PRETRAIN_OBJECTIVES

STATUSES = ("ok", "failed", "oom", "no_data")
TERMINAL = ("ok", "oom", "no_data")  # a suite does not rerun these; "failed" runs are retried
RESULTS_FILE = "results.jsonl"

FIELDS = (
    "task", "attention", "layer_kind", "attention_module", "protocol", "seed", "status", "error",
    "test_accuracy", "test_accuracy_last", "test_examples", "test_labels", "best_val_accuracy", "best_step",
    "train_steps", "num_params", "steps_per_second", "examples_per_second", "compile_seconds", "wall_seconds",
    "peak_memory_bytes", "compiled_memory_bytes", "flops_per_step", "max_length", "batch_size",
    "backend", "device_kind", "num_devices", "num_processes", "per_device_batch_size", "accumulate_steps",
    "precision", "compute_dtype", "matmul_precision", "attention_implementation", "attention_dropout",
    "versions", "git_sha", "config", "config_hash",
)


# What a reader relies on: required fields and their types (``record_problem`` checks them).
REQUIRED = {"task": str, "attention": str, "protocol": str, "seed": int, "status": str}
# "pretrain": the self-pretraining run of a config (``lra_bench.training.pretrain``); its record holds the
# masked-position (or next-token) accuracy, never a classification accuracy, and no table of classifier
# accuracies reads it.
KINDS = ("train", "bench", "pretrain")
# Optional fields read as numbers by the report (null where unknown).
NUMBERS = ("test_accuracy", "test_accuracy_last", "test_loss", "test_examples", "test_labels", "best_val_accuracy",
           "best_step", "train_steps", "num_params", "steps_per_second", "examples_per_second", "compile_seconds",
           "wall_seconds", "peak_memory_bytes", "compiled_memory_bytes", "flops_per_step", "max_length",
           "batch_size", "num_devices", "num_processes", "step_seconds_median", "step_seconds_q25",
           "step_seconds_q75", "peak_rss_bytes")
TEXTS = ("error", "config_hash", "attention_module", "layer_kind", "mode", "compute_dtype", "matmul_precision",
         "attention_implementation")


def _is_number(value: Any, integer: bool = False) -> bool:
  return not isinstance(value, bool) and isinstance(value, int if integer else (int, float))


def record_problem(obj: Any) -> str | None:
  """Why ``obj`` (one parsed line of ``results.jsonl``) is not a record, or None when it is one.

  The one definition of a readable record: every reader (``read_records``: the report, the suite) skips
  what fails it, with its ``path:line``, instead of failing on a missing or mistyped field.
  """
  if not isinstance(obj, dict):
    return "not a JSON object"
  if obj.get("kind", "train") not in KINDS:
    return f"kind {obj.get('kind')!r} is not one of {', '.join(KINDS)}"
  missing = [name for name in REQUIRED if name not in obj]
  if missing:
    return f"not a record: no {', '.join(map(repr, missing))}"
  for name, kind in REQUIRED.items():
    if not (_is_number(obj[name], integer=True) if kind is int else isinstance(obj[name], kind)):
      return f"{name!r} is {obj[name]!r}, not {'an integer' if kind is int else 'text'}"
  if obj["status"] not in STATUSES:
    return f"status {obj['status']!r} is not one of {', '.join(STATUSES)}"
  if obj.get("kind") == "bench" and not _is_number(obj.get("max_length"), integer=True):
    return "a bench record without an integer 'max_length' (its length)"
  for name in NUMBERS:
    if obj.get(name) is not None and not _is_number(obj[name]):
      return f"{name!r} is {obj[name]!r}, not a number"
  for name in TEXTS:
    if obj.get(name) is not None and not isinstance(obj[name], str):
      return f"{name!r} is {obj[name]!r}, not text"
  if obj.get("config") is not None and not isinstance(obj["config"], dict):
    return f"'config' is {obj['config']!r}, not an object"
  if obj.get("vs_preset") is not None and not isinstance(obj["vs_preset"], dict):
    return f"'vs_preset' is {obj['vs_preset']!r}, not an object"
  return None


def setting_hash(record: dict[str, Any]) -> str | None:
  """The hash of a record's config without its ``seed``: the runs of one setting under several seeds share
  it (``config_hash`` includes the seed, so it differs per seed). Computed from the stored config, so
  records written before this function existed group the same way; a record without a config falls back
  to its ``config_hash``."""
  config = record.get("config")
  if not isinstance(config, dict):
    return record.get("config_hash")
  setting = {key: value for key, value in at_preset_cadence(config).items() if key != "seed"}
  return hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:12]



def pretrain_objective(record: dict[str, Any]) -> str:
  """How a train record's model started: ``none`` (from scratch), ``masked`` or ``causal`` (fine-tuned
  from a self-pretraining run of that objective: its stored config's ``pretrain.objective``)."""
  config = record.get("config")
  section = config.get("pretrain") if isinstance(config, dict) else None
  objective = section.get("objective") if isinstance(section, dict) else None
  return objective if objective in PRETRAIN_OBJECTIVES else "none"


def run_key(record: dict[str, Any]) -> tuple:
  return (record.get("kind", "train"), record["task"], record["attention"], record["protocol"],
          record["seed"], record.get("config_hash"), record.get("max_length"))


def _clean(value):
  """JSON-safe: NaN/inf become null, numpy scalars become Python numbers."""
  if isinstance(value, dict):
    return {str(k): _clean(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_clean(v) for v in value]
  if hasattr(value, "item") and not isinstance(value, (str, bytes)):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


class RecordWriteError(errors.UserError, OSError):
  """A record could not be written (e.g. the disk is full); nothing partial was left behind. Exit 1: the
  input was fine, the work could not be kept."""

  exit_code = 1


def _write_failed(path: str, err: OSError, left: str = "nothing partial was left") -> RecordWriteError:
  error = RecordWriteError(f"could not write the record to {path} ({err.strerror or err}); {left}. Free "
                           "disk space (or fix the permissions) and rerun the command")
  error.errno = err.errno
  return error


def write_json_atomic(path: str, obj: Any) -> None:
  """Writes ``obj`` as JSON to ``path`` via a temporary file and ``os.replace`` (all or nothing)."""
  path = files.absolute(path)
  try:  # files.write_atomic: no temporary file is left behind, the file gets the umask's mode
    files.write_atomic(path, json.dumps(_clean(obj), indent=1, sort_keys=True) + "\n", suffix=".json")
  except OSError as err:
    raise _write_failed(path, err) from err


@contextlib.contextmanager
def locked(results_dir: str) -> Iterator[None]:
  """Exclusive lock on the results directory (held across processes)."""
  os.makedirs(results_dir, exist_ok=True)
  with open(os.path.join(results_dir, ".lock"), "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def read_records(results_dir: str) -> tuple[list[dict[str, Any]], list[str]]:
  """(every record in ``results.jsonl``, ``path:line: why`` for each line that is not a record)."""
  path = os.path.join(files.absolute(results_dir), RESULTS_FILE)
  if not os.path.exists(path):
    return [], []
  records, unreadable = [], []
  with open(path, encoding="utf-8", errors="replace") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as err:
        unreadable.append(f"{path}:{lineno}: not a JSON record ({err}): {line.strip()[:80]!r}")
        continue
      problem = record_problem(record)
      if problem is None:
        records.append(record)
      else:
        unreadable.append(f"{path}:{lineno}: {problem}: {line.strip()[:80]!r}")
  return records, unreadable


_warned: set[str] = set()


def warn_unreadable(unreadable: Iterable[str]) -> None:
  """One line on stderr per unreadable line (once per process: the suite reads the file often)."""
  for problem in unreadable:
    if problem not in _warned:
      _warned.add(problem)
      print(f"warning: {problem}; this line is skipped", file=sys.stderr, flush=True)


def load_records(results_dir: str) -> list[dict[str, Any]]:
  """Every record in ``results.jsonl``; each line that is not a record is named on stderr."""
  records, unreadable = read_records(results_dir)
  warn_unreadable(unreadable)
  return records


def _redundant(old: dict[str, Any], new: dict[str, Any]) -> bool:
  """Whether ``old`` (same run) makes ``new`` a duplicate: an ``ok`` run is final, and a terminal
  outcome is recorded once (a ``no_data`` run that later finds its data still gets its ``ok``)."""
  status = old.get("status")
  return status == "ok" or (status in TERMINAL and status == new.get("status"))


def append_record(results_dir: str, record: dict[str, Any]) -> bool:
  """Appends ``record`` unless its run already has an ``ok`` record or a terminal record with the same
  status. Returns whether it appended; raises ``RecordWriteError`` (file unchanged) if it could not."""
  record, results_dir = _clean(record), files.absolute(results_dir)
  with locked(results_dir):
    key = run_key(record)
    for old in load_records(results_dir):
      if run_key(old) == key and _redundant(old, record):
        logging.info("run %s already has a %r record; not appending another", key, old["status"])
        return False
    _append_line(os.path.join(results_dir, RESULTS_FILE), json.dumps(record, sort_keys=True) + "\n")
  return True


def _append_line(path: str, line: str) -> None:
  """Appends ``line`` whole or not at all (the caller holds the lock, so the size cannot change)."""
  fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":  # a line cut short by an older crash stays alone
      line = "\n" + line
    try:
      files.write_all(fd, line.encode())
    except OSError as err:
      try:
        os.ftruncate(fd, size)
        os.fsync(fd)
      except OSError:
        raise _write_failed(path, err, f"a partial line may remain after byte {size}") from err
      raise _write_failed(path, err) from err
  finally:
    os.close(fd)


def latest_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
  """One record per run (``run_key``): its ``ok`` record if it has one, else its latest record.

  A run has several records when it was retried: a ``no_data`` run after ``data prepare``, a ``failed``
  run after a fix. ``ok`` is final; otherwise the latest outcome is the current state.
  """
  chosen: dict[tuple, tuple[int, int, dict[str, Any]]] = {}
  for order, record in enumerate(records):
    try:
      key = run_key(record)
    except KeyError:
      continue
    rank = (int(record.get("status") == "ok"), order)
    if key not in chosen or rank >= chosen[key][:2]:
      chosen[key] = (*rank, record)
  return [entry[2] for entry in chosen.values()]


def git_sha() -> str:
  """The commit of the code that ran (``+dirty`` if the tree had local changes), or 'unknown'."""
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                         timeout=10, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    return sha + ("+dirty" if dirty else "")
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def versions() -> dict[str, str]:
  import importlib.metadata as md

  out = {"python": platform.python_version()}
  for dist in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "tensorflow-cpu", "tensorflow",
               "tensorflow-datasets", "lra-bench"):
    with contextlib.suppress(md.PackageNotFoundError):
      out[dist] = md.version(dist)
  return out


def device_info() -> dict[str, Any]:
  import jax

  device = jax.devices()[0]
  return {"backend": jax.default_backend(), "device_kind": device.device_kind,
          "num_devices": jax.device_count(), "num_processes": jax.process_count()}


def slurm_job() -> str | None:
  """The SLURM job this process runs in: ``<array job>_<task>`` in a job array, else the job id."""
  if os.environ.get("SLURM_ARRAY_JOB_ID"):
    return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID')}"
  return os.environ.get("SLURM_JOB_ID")


def make_record(**fields: Any) -> dict[str, Any]:
  """A record with every ``FIELDS`` entry present (missing ones null) plus any extra fields given, and
  the SLURM job that wrote it (``slurm_job``, null outside SLURM)."""
  record = {name: None for name in FIELDS}
  record.update(versions=versions(), git_sha=git_sha(), slurm_job=slurm_job(), **device_info())
  record.update(fields)
  if record["status"] not in STATUSES:
    raise ValueError(f"status must be one of {STATUSES}, got {record['status']!r}")
  return record



def attention_module(name: str) -> str | None:
  """The module that registered ``name``, attention core or sequence mixer (``attention_zoo.<file>``,
  ``attention_zoo.mixers.<file>`` or a plugin's module); None when it is not registered in this process."""
  import attention_zoo

  try:
    return attention_zoo.layer_defining_module(name)
  except ValueError:
    return None


def layer_kind(name: str) -> str:
  """What ``name`` (a record's ``attention`` field) is: ``attention`` (a core inside the multi-head block)
  or ``mixer`` (a sequence mixer replacing that block, ``attention_zoo.mixers``)."""
  import attention_zoo

  return attention_zoo.layer_kind(name)


@functools.lru_cache(maxsize=None)
def _preset(protocol: str, task: str, attention: str, seed: int) -> tuple[dict[str, Any] | None, str | None]:
  """(the flat config ``load_config`` builds for this run, as a record stores it; or why it cannot)."""
  from lra_bench.training import checkpoints
  from lra_bench.training import config as config_lib

  try:
    config = config_lib.load_config(protocol, task, attention=attention, seed=seed)
  except (ValueError, TypeError):  # an attention not registered here (a plugin not loaded): its defaults
    try:
      config = config_lib.load_config(protocol, task, seed=seed)
    except (ValueError, TypeError) as err:  # ConfigError: an unknown protocol or task in this checkout
      return None, str(err).splitlines()[0][:160]
    with config.unlocked():
      config.model.attention = attention
  return checkpoints.flat_config(json.loads(json.dumps(_clean(config.to_dict())))), None


def _set_text(key: str, value: Any) -> str:
  """``key=value`` as ``--set`` parses it back to ``value`` (text that would read as a literal is quoted)."""
  from lra_bench.training import config as config_lib

  if isinstance(value, str):
    return f"{key}={value if config_lib.parse_typed(value, None) == value else repr(value)}"
  return f"{key}={value!r}"


def vs_preset(record: dict[str, Any]) -> dict[str, Any] | None:
  """How a record's stored ``config`` differs from what its protocol's preset builds for the same task,
  attention and seed (the record's ``vs_preset`` field; the report reads it and loads no config):

  - ``differences``: {dotted key: {"record": its value, "preset": the preset's}} for every key that
    differs (a side without the key has no entry);
  - ``sets``: the ``--set``s that rebuild the record's config from the preset (a Fix command's);
  - ``ignored``: the keys that change no result (``checkpoints.RESULT_NEUTRAL_KEYS``: logging and
    checkpoint cadence), which do not make a run another setting than its preset;
  - ``problem``: why the preset could not be built (then nothing else), else None.

  None for a record without a stored config. Never raises: a record is written whatever this finds.
  """
  if not isinstance(record.get("config"), dict):
    return None
  from lra_bench.training import checkpoints

  try:
    preset, problem = _preset(record["protocol"], record["task"], record["attention"], record["seed"])
    if preset is None:
      return {"problem": problem}
    stored = checkpoints.flat_config(json.loads(json.dumps(_clean(record["config"]))))
    # the preset's cadence beside an override of it (config.PRESET_CADENCE) is bookkeeping, not a setting
    mine = {key: value for key, value in stored.items() if not key.startswith(PRESET_CADENCE + ".")}
    absent = object()
    differences = {}
    for key in sorted(set(mine) | set(preset)):
      if mine.get(key, absent) != preset.get(key, absent):
        differences[key] = {side: values[key] for side, values in (("record", mine), ("preset", preset))
                            if key in values}
    return {"differences": differences,
            "sets": [_set_text(key, d["record"]) for key, d in differences.items() if "record" in d],
            "ignored": list(checkpoints.RESULT_NEUTRAL_KEYS), "problem": None}
  except Exception as err:  # noqa: BLE001 - the comparison is a note for the report; the record is the result
    return {"problem": f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"}


def precision_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """``compute_dtype`` and ``matmul_precision`` of ``config`` on this process's backend (``steps.precision_fields``:
  "auto" resolved), for a record whose run did not measure them (a failure before its first step)."""
  from lra_bench.training import steps

  return steps.precision_fields(config)


def train_record(config: ml_collections.ConfigDict, status: str, *, workdir: str, data_dir: str,
                 **fields: Any) -> dict[str, Any]:
  """The record of one training run of ``config`` (``fields``: its measurements, or its ``error``), with
  ``vs_preset``: how its config differs from its protocol's preset. ``compute_dtype`` / ``matmul_precision``
  are the run's (``loop``'s measurements), else this process's for the config (``precision_fields``)."""
  fields = {**precision_fields(config), **fields}
  record = make_record(status=status, task=config.task, attention=config.model.attention,
                       layer_kind=layer_kind(config.model.attention),
                       attention_module=attention_module(config.model.attention), protocol=config.protocol,
                       seed=config.seed, max_length=config.data.max_length,
                       batch_size=config.batch_size, config=config.to_dict(), config_hash=config_hash(config),
                       workdir=os.path.abspath(workdir), data_dir=os.path.abspath(data_dir), **fields)
  record["vs_preset"] = vs_preset(record)
  return record


def bench_key_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The identifying fields of a benchmark point (``run_key`` reads them)."""
  return dict(kind="bench", task=config.task, attention=config.model.attention, protocol=config.protocol,
              seed=config.seed, max_length=config.data.max_length, batch_size=config.batch_size,
              mode=config.bench.mode, compile_only=config.bench.compile_only, config=config.to_dict(),
              config_hash=config_hash(config))


def bench_record(config: ml_collections.ConfigDict, **measurements: Any) -> dict[str, Any]:
  """The record of one benchmark point (``measurements`` include its ``status``; ``compute_dtype`` /
  ``matmul_precision`` / ``attention_dropout`` are the point's, else this process's for the config)."""
  measurements = {**precision_fields(config), "attention_dropout": attention_dropout(config), **measurements}
  return make_record(**bench_key_fields(config), attention_module=attention_module(config.model.attention),
                     layer_kind=layer_kind(config.model.attention), **measurements)


def attention_dropout(config: ml_collections.ConfigDict) -> float:
  """The attention dropout a benchmark point ran: its attention core's rate (``model.attention_kwargs.dropout_rate``,
  else ``model.attention_dropout_rate``) in the modes that run dropout (``train``, ``core``), 0 in ``inference``
  (deterministic)."""
  from lra_bench.training import models

  return 0.0 if config.bench.mode == "inference" else models.core_dropout_rate(config.model)
