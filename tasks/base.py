"""The task contract (docs/ARCHITECTURE.md, CONTRACT 2): what every LRA task provides.

A task knows how to make or find its data (``prepare``) and how to read one split into fixed-length int32
examples (``examples``); batching them is shared (``batched``). Batches are dicts:
``{"inputs": int32[B, T], "targets": int32[B]}`` or, for dual-input tasks,
``{"inputs1", "inputs2", "targets"}``; pad id is 0.

A task's ``objective`` says what is predicted:

- ``"classification"`` (the LRA tasks): one label per example, ``targets: int32[B]`` in
  ``[0, num_classes)``; the encoder is pooled and classified.
- ``"next_token"`` (the recall tasks): labels at chosen positions of one causal sequence. Batches are
  ``{"inputs": int32[B, T], "positions": int32[B, Q], "targets": int32[B, Q]}``: ``targets[b, q]`` is
  the token to predict at position ``positions[b, q]`` from ``inputs[b, :positions[b, q] + 1]`` (the
  model is causal), ``-1`` marks an unused query slot (ignored by the loss and the accuracy). The output
  layer is evaluated at those positions only (at a vocabulary of 8192 it would otherwise be most of the
  compute). ``Q`` may differ between splits (e.g. every position in training, the last in testing).
  The vocabulary is the data's: ``Examples.vocab_size``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shlex
from typing import Any, ClassVar

import numpy as np

SPLITS = ("train", "validation", "test")
INPUT_KINDS = ("tokens", "pixels")
OBJECTIVES = ("classification", "next_token")
IGNORE = -1  # a next-token target slot without a label
# Pixel tasks feed intensity tokens pixel + 1 (1..256), so that 0 stays the padding id and black pixels
# are attended to (the original LRA masked every black pixel as padding: `inputs > 0`).
PIXEL_VOCAB = 257


class DataError(ValueError):
  """Missing or malformed data. The message names the file (and line) and the fix."""


class MissingDataError(DataError):
  """The data of a task is not there; the message names the path looked at and how to make it."""


@dataclasses.dataclass(frozen=True)
class Examples:
  """One split, read and validated.

  Attributes:
    dataset: unbatched ``tf.data.Dataset`` of dicts of fixed-length int32 tensors.
    num_examples: how many examples the split holds.
    num_truncated: how many were longer than ``max_length`` and were truncated.
    source: the file or folder they came from (for logs and result records).
    vocab_size: the token vocabulary of this data, padding id 0 included, where the data decides it
      (the recall tasks' generators take it as an option); None: the task's ``vocab_size``.
    arrays: the same examples as int32 numpy arrays (first axis: the example), with ``dataset`` None:
      what ``Task.array_examples`` returns for the numpy input pipeline (``data.pipeline = "numpy"``).
  """

  dataset: Any
  num_examples: int
  num_truncated: int
  source: str
  vocab_size: int | None = None
  arrays: dict[str, np.ndarray] | None = None


DATA_EXTRA_HINT = "install it with: pip install 'lra-bench[data]' (tensorflow-cpu, tensorflow-datasets)"


class MissingDependencyError(DataError):
  """Reading data needs TensorFlow / TFDS, which the core install leaves out (accelerator images)."""


def import_tf():
  """Imports TensorFlow for tf.data only, hiding every accelerator from it (JAX owns them).

  Only code that reads data calls this, so ``list``, ``bench``, ``check``, ``report``, ``viz`` and the
  attention cores run where TensorFlow is not installed (tests/test_no_tensorflow.py).
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  # oneDNN's kernels are for TensorFlow's matmuls and convolutions, which the input pipelines (decode,
  # tokenise, cast, batch) never run: the batches are byte-identical either way (checked on ListOps and
  # Pathfinder), and off, TensorFlow does not print its "oneDNN custom operations are on" banner (twice,
  # through absl's pre-init logging) in every process that reads data.
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  try:
    import tensorflow as tf
  except ImportError as err:
    raise MissingDependencyError(f"reading task data needs TensorFlow (tf.data), which is not installed "
                                 f"({err}); {DATA_EXTRA_HINT}") from None

  try:
    tf.config.set_visible_devices([], "GPU")
    tf.config.set_visible_devices([], "TPU")
  except (RuntimeError, ValueError):
    pass  # already initialized, or no such device type on this build
  return tf


def import_tfds():
  """``tensorflow_datasets`` (Text and Image read IMDB and CIFAR-10 through it), TensorFlow first."""
  import_tf()
  try:
    import tensorflow_datasets as tfds
  except ImportError as err:
    raise MissingDependencyError(f"the text and image tasks read TFDS datasets, and tensorflow-datasets "
                                 f"is not installed ({err}); {DATA_EXTRA_HINT}") from None
  return tfds


MAX_SEED = 2**31 - 1  # seeds feed jax.random.PRNGKey and tf.data; both take any value up to here
# The allowed range (low, high; None: no bound) of every ``data prepare`` count, length and seed: the one
# table that the ``data prepare`` flags, ``lra_bench.training.config.validate_prepare`` and the tasks'
# ``prepare`` (``check_count``) all read. Every split gets at least one example: an empty validation or
# test split would train to a meaningless record.
PREPARE_RANGES = {"num_train": (1, None), "num_val": (1, None), "num_test": (1, None), "num_images": (1, None),
                  "images_per_batch": (1, None), "workers": (1, None), "min_length": (0, None),
                  "max_expression_length": (2, None), "resolution": (1, None), "contour_length": (1, None),
                  "seed": (0, MAX_SEED), "vocab_size": (3, None), "seq_len": (2, None), "num_kv_pairs": (1, None),
                  "noise_vocab_size": (0, None)}


def check_count(task: str, option: str, value) -> int:
  """A ``data prepare`` count or length (``PREPARE_RANGES``): an int >= its minimum, else DataError
  naming the option and the value (a negative count used to generate nothing, or crash later)."""
  minimum = PREPARE_RANGES[option][0]
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise DataError(f"data prepare {task}: --{option} must be an integer >= {minimum}, got {value!r}")
  if value < minimum:
    raise DataError(f"data prepare {task}: --{option} is {value}; it must be >= {minimum}")
  return int(value)


def length_range_error(min_length: int, max_expression_length: int) -> str | None:
  """Why ``min_length < length < max_expression_length`` holds no length, or None (lengths strictly
  between)."""
  if min_length >= max_expression_length - 1:
    return (f"--min_length {min_length} must be below --max_expression_length {max_expression_length} - 1 "
            "(lengths strictly between them are kept)")
  return None


def check_name(task: str, name: str, flag: str = "--name") -> str:
  """A data variant's name (ListOps file prefix, Pathfinder sub-folder): a plain file name, so nothing is
  read or written outside the data dir; else DataError naming the flag and the value."""
  if not isinstance(name, str) or os.path.basename(name) != name or name in (".", "..") or \
      (os.altsep and os.altsep in name) or "\0" in name:
    raise DataError(f"data prepare {task}: {flag} {name!r} is not a plain file name (no '/', '..' or "
                    f"path); use a name such as 'smoke'")
  return name


def read_meta(path: str, fix: str) -> dict[str, Any]:
  """The JSON object of a prepare's metadata file ``path``; an empty or unreadable one is a DataError
  naming it with ``fix`` (never skipped: it says what the data should hold)."""
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
  except (OSError, ValueError) as err:
    raise DataError(f"{path}: unreadable prepare metadata ({type(err).__name__}: {err}); {fix}") from None
  if not isinstance(meta, dict):
    raise DataError(f"{path}: prepare metadata is not a JSON object; {fix}")
  return meta


def pid_alive(pid: int) -> bool:
  """Whether process ``pid`` exists (a temporary file of a live process is not removed)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except (PermissionError, OverflowError, ValueError):
    return pid > 0
  return True


def default_data_dir() -> str:
  """``$LRA_DATA_DIR`` or ``~/lra_data``."""
  return os.environ.get("LRA_DATA_DIR") or os.path.join(os.path.expanduser("~"), "lra_data")


class Task:
  """Base class of the LRA tasks. Subclasses set the class attributes and implement
  ``prepare`` and ``examples``; batching (``batched``: shuffle / repeat / batch / prefetch) is shared."""

  name: ClassVar[str]
  num_classes: ClassVar[int]
  vocab_size: ClassVar[int]
  max_length: ClassVar[int]
  dual_input: ClassVar[bool] = False
  objective: ClassVar[str] = "classification"   # or "next_token" (module docstring)
  pixel_inputs: ClassVar[bool] = False   # also offers float pixels (model.input_kind = "pixels")
  pixel_std: ClassVar[float] = 1.0       # the float pixels' scale: one intensity level is 1 / pixel_std
  chance_accuracy: ClassVar[float]
  # What ``accuracy`` means: "accuracy" (correct / labels, micro) or "macro" (the mean over target classes
  # of each class's accuracy, MAD's metric; ``lra_bench.training.loop.macro_accuracy``).
  metric: ClassVar[str] = "accuracy"

  def prepare(self, data_dir: str, **options) -> str:
    """Generates or verifies the data under ``data_dir``; idempotent. Returns the task's data path."""
    raise NotImplementedError

  def examples(self, data_dir: str, split: str, *, max_length: int, **options) -> Examples:
    raise NotImplementedError

  def data_missing(self, data_dir: str, **options) -> str | None:
    """Why the data ``examples(data_dir, ..., **options)`` reads is surely not there (a file or folder it
    needs does not exist), from the filesystem alone (no TensorFlow, nothing read): the suite's progress
    counts such cells as skipped for missing data before they run. None: it looks present, or this task
    cannot tell cheaply (its cells then count as training until one ends ``no_data``)."""
    return None

  def array_examples(self, data_dir: str, split: str, *, max_length: int, **options) -> Examples:
    """The split as numpy arrays (``Examples.arrays``), for the input pipeline that needs no TensorFlow
    (``data.pipeline = "numpy"``); the tasks whose data are generated locally implement it."""
    raise DataError(f"the {self.name} task reads its data through tf.data only; data.pipeline=numpy is "
                    f"available for {', '.join(array_tasks()) or 'no task'}")

  def prepare_options(self) -> list[str]:
    """The options ``prepare`` takes by name (``data prepare`` refuses a flag outside them)."""
    parameters = inspect.signature(self.prepare).parameters.values()
    return [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "progress"]

  def prepare_command(self, data_dir: str, **options) -> str:
    """The shell command that makes this task's data (quoted into missing-data errors)."""
    parts = ["lra-bench", "data", "prepare", self.name, f"--data_dir={data_dir}"]
    parts += [f"--{key}={value}" for key, value in sorted(options.items())]
    return shlex.join(parts)


def batched(examples: Examples, batch_size: int, *, seed: int = 0, repeat: bool = False,
            shuffle_buffer: int = 1024, num_shards: int = 1, shard_index: int = 0):
  """Training (``repeat=True``) shuffles with a seeded buffer, repeats forever and drops the remainder;
  evaluation keeps every example (the last batch may be smaller). Examples given as arrays are batched
  by ``ArrayBatches`` (a full permutation per epoch instead of tf.data's shuffle buffer).

  Multi-host: with ``num_shards > 1`` this process reads only examples ``shard_index``,
  ``shard_index + num_shards``, ... (deterministic; ``batch_size`` is then the per-process batch).
  """
  if examples.arrays is not None:
    return ArrayBatches(examples.arrays, batch_size, seed=seed, repeat=repeat, num_shards=num_shards,
                        shard_index=shard_index)
  tf = import_tf()
  ds = examples.dataset
  if num_shards > 1:
    ds = ds.shard(num_shards, shard_index)
  if repeat:
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
  ds = ds.batch(batch_size, drop_remainder=repeat)
  options = tf.data.Options()
  options.deterministic = True
  # tf.data's model-based autotuner off: its model thread sleeps in periods that grow to about 10 s, and
  # destroying an iterator that has run that long waits for the sleep to end (the cpu ListOps cell spent
  # 10 s of its ~40 at its end, measured). Without it AUTOTUNE parallelism is the CPU count and prefetch
  # sizes its own buffer; the elements and their order are the same (``deterministic``).
  options.autotune.enabled = False
  return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def pixel_inputs_fn(input_kind: str, mean: float, std: float):
  """A tf function uint8 pixels [..., T] -> model inputs.

  ``tokens``: int32 pixel + 1 (vocab ``PIXEL_VOCAB``; 0 is never a pixel). ``pixels``: float32
  (pixel - mean) / std on the 0..255 scale, for a dense input projection (the S4 convention).
  """
  tf = import_tf()
  if input_kind == "tokens":
    return lambda pixels: tf.cast(pixels, tf.int32) + 1
  if input_kind == "pixels":
    return lambda pixels: (tf.cast(pixels, tf.float32) - mean) / std
  raise ValueError(f"unknown input_kind {input_kind!r}; expected one of {INPUT_KINDS}")


def fit_length_fn(max_length: int):
  """A tf function: truncates or zero-pads a rank-1 tensor to ``max_length`` (static shape)."""
  tf = import_tf()

  def fit(ids):
    ids = ids[:max_length]
    ids = tf.pad(ids, [[0, max_length - tf.shape(ids)[0]]])
    ids.set_shape([max_length])
    return ids

  return fit


def array_tasks() -> list[str]:
  """The registered tasks that implement ``array_examples`` (the numpy input pipeline)."""
  from tasks import _TASKS as TASKS  # the registry imports this module

  return sorted(name for name, task in TASKS.items() if type(task).array_examples is not Task.array_examples)


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  """Shape (None: the batch axis) and numpy dtype of one batch entry, as a tf.TensorSpec offers them."""

  shape: tuple
  dtype: np.dtype


class ArrayBatches:
  """Batches of in-memory arrays without TensorFlow: the numpy input pipeline (``data.pipeline``).

  Training (``repeat=True``): epoch ``e`` visits this process's examples in the order of a permutation
  drawn from ``numpy.random.default_rng([seed, e])`` and drops its last partial batch; epochs follow
  forever. The iterator's state is two integers (epoch, batch), saved beside each checkpoint
  (``lra_bench.training.checkpoints.iterator_checkpoint``), so a resumed run continues with exactly the
  batches it would have seen.
  Evaluation: every example once in file order, the last batch possibly smaller. Multi-host: this
  process takes examples ``shard_index``, ``shard_index + num_shards``, ... (as ``tf.data``'s ``shard``).
  The batches differ from the tf.data pipeline's (another shuffle), not their distribution.
  """

  def __init__(self, arrays: dict[str, np.ndarray], batch_size: int, *, seed: int = 0, repeat: bool = False,
               num_shards: int = 1, shard_index: int = 0):
    self.arrays = {key: value[shard_index::num_shards] for key, value in arrays.items()}
    self.batch_size, self.seed, self.repeat = batch_size, seed, repeat
    self.num_examples = len(next(iter(self.arrays.values()))) if self.arrays else 0
    if repeat and self.num_examples < batch_size:
      raise DataError(f"{self.num_examples} training examples in this process, fewer than one batch of "
                      f"{batch_size}: lower batch_size or prepare more examples")
    self.element_spec = {key: ArraySpec((None, *value.shape[1:]), value.dtype) for key, value in self.arrays.items()}

  def __iter__(self) -> "ArrayIterator":
    return ArrayIterator(self)


class ArrayIterator:
  """One pass (evaluation) or the endless stream (training) of an ``ArrayBatches``; its position is
  ``state()`` and ``restore(state)``."""

  def __init__(self, batches: ArrayBatches):
    self.batches, self.epoch, self.batch = batches, 0, 0
    self._order = self._epoch_order(0)

  def _epoch_order(self, epoch: int) -> np.ndarray:
    b = self.batches
    if not b.repeat:
      return np.arange(b.num_examples)
    return np.random.default_rng([b.seed, epoch]).permutation(b.num_examples)

  def __iter__(self) -> "ArrayIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    b = self.batches
    per_epoch = b.num_examples // b.batch_size if b.repeat else -(-b.num_examples // b.batch_size)
    if self.batch >= per_epoch:
      if not b.repeat:
        raise StopIteration
      self.epoch, self.batch = self.epoch + 1, 0
      self._order = self._epoch_order(self.epoch)
    rows = self._order[self.batch * b.batch_size:(self.batch + 1) * b.batch_size]
    self.batch += 1
    return {key: value[rows] for key, value in b.arrays.items()}

  def state(self) -> dict[str, int]:
    return {"epoch": self.epoch, "batch": self.batch}

  def restore(self, state: dict[str, int]) -> None:
    self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
    self._order = self._epoch_order(self.epoch)
