"""Finding and reading TFDS datasets offline (Text: imdb_reviews, Image: cifar10).

The data must already be prepared in a TFDS data dir (nothing is downloaded here). Looked at in order:
the task option ``tfds_data_dir``, else ``<data_dir>/tfds``, then TFDS's default (``$TFDS_DATA_DIR`` or
``~/tensorflow_datasets``). Splits are read once per process into numpy arrays (IMDB ~33 MB of text,
CIFAR-10 gray 60 MB), so the tf.data pipelines built on them are plain slices (checkpointable, fast).
"""

from __future__ import annotations

import functools
import logging
import os

import numpy as np

from tasks.base import MissingDataError, import_tf


def candidate_dirs(data_dir: str, tfds_data_dir: str | None = None) -> list[str]:
  if tfds_data_dir:
    return [tfds_data_dir]
  default = os.environ.get("TFDS_DATA_DIR") or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")
  return [os.path.join(data_dir, "tfds"), default]


def find(dataset: str, task: str, data_dir: str, tfds_data_dir: str | None = None) -> str:
  """The first candidate dir where ``dataset`` is prepared, else MissingDataError with the fix."""
  import_tf()
  import tensorflow_datasets as tfds

  dirs = candidate_dirs(data_dir, tfds_data_dir)
  for d in dirs:
    if tfds.builder(dataset, data_dir=d).is_prepared():
      return d
  target = dirs[0]
  raise MissingDataError(
      f"{task} data not found: TFDS dataset {dataset!r} is not prepared in {' or '.join(dirs)}.\n"
      f"On a machine with network access run:\n  tfds build {dataset} --data_dir {target}\n"
      f"and copy {os.path.join(target, dataset)} to this machine "
      f"(or pass --set data.options.tfds_data_dir=DIR where it already is).")


@functools.lru_cache(maxsize=8)
def read_split(dataset: str, split: str, tfds_dir: str) -> dict[str, np.ndarray]:
  """All examples of one (sliced) split as numpy arrays, in TFDS's deterministic order."""
  import_tf()
  import tensorflow_datasets as tfds

  logging.info("reading %s %s from %s", dataset, split, tfds_dir)
  ds = tfds.load(dataset, split=split, data_dir=tfds_dir, shuffle_files=False)
  parts: dict[str, list] = {}
  for batch in tfds.as_numpy(ds.batch(4096)):
    for key, value in batch.items():
      parts.setdefault(key, []).append(value)
  return {key: np.concatenate(values) for key, values in parts.items()}


def info(dataset: str, tfds_dir: str) -> str:
  """One line describing the prepared dataset (for ``lra-bench data prepare``)."""
  import_tf()
  import tensorflow_datasets as tfds

  builder = tfds.builder(dataset, data_dir=tfds_dir)
  splits = ", ".join(f"{name} {split.num_examples}" for name, split in sorted(builder.info.splits.items()))
  return f"{dataset} {builder.info.version} in {tfds_dir}: {splits}"
