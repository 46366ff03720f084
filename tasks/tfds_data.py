"""Finding and reading TFDS datasets offline (Text: imdb_reviews, Image: cifar10).

The data must already be prepared in a TFDS data dir (nothing is downloaded here). Looked at in order:
the task option ``tfds_data_dir``, else ``<data_dir>/tfds``, then TFDS's default (``$TFDS_DATA_DIR`` or
``~/tensorflow_datasets``). Splits are read once per process into numpy arrays (IMDB ~33 MB of text,
CIFAR-10 gray 60 MB), so the tf.data pipelines built on them are plain slices (checkpointable, fast).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import logging
import os

import numpy as np

from tasks.base import MissingDataError, import_tfds


def candidate_dirs(data_dir: str, tfds_data_dir: str | None = None) -> list[str]:
  if tfds_data_dir:
    return [tfds_data_dir]
  default = os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
  return [os.path.join(data_dir, "tfds"), default]


class _VariantWarnings(logging.Filter):
  """Keeps TFDS's "Variant folder X has no dataset_info.json" warnings out of the log (TFDS repeats them
  for every candidate dir and every split: twice per no-data cell); ``find`` says them once, in its error."""

  def __init__(self):
    super().__init__()
    self.lines: list[str] = []

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if not text.startswith("Variant folder "):
      return True
    folder = record.args[0] if isinstance(record.args, tuple) and record.args else None
    if (folder is None or os.path.isdir(str(folder))) and text not in self.lines:
      self.lines.append(text)  # TFDS also warns about folders it only guessed; those are left out
    return False


@contextlib.contextmanager
def _variant_warnings():
  """Collects TFDS's variant-folder warnings (absl logs them through the ``absl`` Python logger)."""
  caught = _VariantWarnings()
  logger = logging.getLogger("absl")
  logger.addFilter(caught)
  try:
    yield caught
  finally:
    logger.removeFilter(caught)


def find(dataset: str, task: str, data_dir: str, tfds_data_dir: str | None = None) -> str:
  """The first candidate dir where ``dataset`` is prepared, else MissingDataError with the fix."""
  tfds = import_tfds()
  dirs = candidate_dirs(data_dir, tfds_data_dir)
  with _variant_warnings() as caught:
    for d in dirs:
      if tfds.builder(dataset, data_dir=d).is_prepared():
        return d
  target = dirs[0]
  incomplete = "".join(f"\n  ({line}: an incomplete copy?)" for line in caught.lines)
  raise MissingDataError(
      f"{task} data not found: TFDS dataset {dataset!r} is not prepared in {' or '.join(dirs)}.{incomplete}\n"
      f"On a machine with network access run:\n  tfds build {dataset} --data_dir {target}\n"
      f"and copy {os.path.join(target, dataset)} to this machine "
      f"(or pass --set data.options.tfds_data_dir=DIR where it already is).")


def missing(dataset: str, data_dir: str, tfds_data_dir: str | None = None) -> str | None:
  """Why ``dataset`` is surely not prepared in any candidate dir (none holds a ``dataset_info.json`` under
  ``<dir>/<dataset>/``), from the filesystem alone; None when one might be (``find`` decides)."""
  dirs = candidate_dirs(data_dir, tfds_data_dir)
  for d in dirs:
    if glob.glob(os.path.join(d, dataset, "**", "dataset_info.json"), recursive=True):
      return None
  return f"TFDS dataset {dataset!r} is not prepared in {' or '.join(dirs)}"


@functools.lru_cache(maxsize=8)
def read_split(dataset: str, split: str, tfds_dir: str) -> dict[str, np.ndarray]:
  """All examples of one (sliced) split as numpy arrays, in TFDS's deterministic order."""
  tfds = import_tfds()
  logging.info("reading %s %s from %s", dataset, split, tfds_dir)
  ds = tfds.load(dataset, split=split, data_dir=tfds_dir, shuffle_files=False)
  parts: dict[str, list] = {}
  for batch in tfds.as_numpy(ds.batch(4096)):
    for key, value in batch.items():
      parts.setdefault(key, []).append(value)
  return {key: np.concatenate(values) for key, values in parts.items()}


def info(dataset: str, tfds_dir: str) -> str:
  """One line describing the prepared dataset (for ``lra-bench data prepare``)."""
  tfds = import_tfds()
  builder = tfds.builder(dataset, data_dir=tfds_dir)
  splits = ", ".join(f"{name} {split.num_examples}" for name, split in sorted(builder.info.splits.items()))
  return f"{dataset} {builder.info.version} in {tfds_dir}: {splits}"
