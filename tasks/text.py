"""Text: IMDB reviews (TFDS ``imdb_reviews``) as UTF-8 bytes, binary sentiment.

Tokens are byte + 1 (vocab 257, 0 = padding), as the LRA ByteTextEncoder; sequences are truncated to
``max_length`` (1000 in the LRA code config, 4000 in the paper) and the truncations counted.

Validation: by default a deterministic held-out slice of *train* (``train[:90%]`` trains,
``train[90%:]`` validates — TFDS slices are deterministic), so test accuracy is not selected on test.
``validation="test"`` uses the test split for validation, as the original LRA code did (parity); the
choice is in the config (``data.options.validation``) and in each split's ``source`` in the record.
"""

from __future__ import annotations

import logging

import numpy as np

from tasks import register_task, tfds_data
from tasks.base import DataError, Examples, Task, fit_length_fn, import_tf

BYTE_VOCAB = 257  # 256 byte values + 1, id 0 = padding
HOLDOUT = 0.9     # fraction of train kept for training when validation = "holdout"
VALIDATIONS = ("holdout", "test")


def encode_bytes(text: bytes | str, max_length: int) -> np.ndarray:
  """Eager reference of the tf encoder: int32 [max_length] of byte + 1, zero-padded."""
  data = text.encode("utf-8") if isinstance(text, str) else text
  ids = np.zeros(max_length, np.int32)
  raw = np.frombuffer(data[:max_length], np.uint8).astype(np.int32) + 1
  ids[:len(raw)] = raw
  return ids


def decode_bytes(ids) -> bytes:
  ids = np.asarray(ids)
  return bytes((ids[ids > 0] - 1).astype(np.uint8).tolist())


def byte_tokens_fn(max_length: int):
  """A tf function: scalar string -> int32 [max_length] of byte + 1, zero-padded."""
  tf = import_tf()
  fit = fit_length_fn(max_length)
  return lambda text: fit(tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32) + 1)


def tfds_split(split: str, validation: str) -> str:
  if validation not in VALIDATIONS:
    raise ValueError(f"validation must be one of {VALIDATIONS}, got {validation!r}")
  percent = int(HOLDOUT * 100)
  if validation == "test":
    return {"train": "train", "validation": "test", "test": "test"}[split]
  return {"train": f"train[:{percent}%]", "validation": f"train[{percent}%:]", "test": "test"}[split]


@register_task
class Text(Task):
  name = "text"
  num_classes = 2
  vocab_size = BYTE_VOCAB
  max_length = 1000
  chance_accuracy = 0.5
  dataset_name = "imdb_reviews"

  def data_missing(self, data_dir: str, *, tfds_data_dir: str | None = None, **_) -> str | None:
    return tfds_data.missing(self.dataset_name, data_dir, tfds_data_dir)

  def prepare(self, data_dir: str, *, tfds_data_dir: str | None = None, **_) -> str:
    """Checks that IMDB is prepared for TFDS (nothing to generate) and says where."""
    found = tfds_data.find(self.dataset_name, self.name, data_dir, tfds_data_dir)
    return tfds_data.info(self.dataset_name, found)

  def examples(self, data_dir: str, split: str, *, max_length: int, validation: str = "holdout",
               tfds_data_dir: str | None = None, limit: int = 0) -> Examples:
    found = tfds_data.find(self.dataset_name, self.name, data_dir, tfds_data_dir)
    tfds_split_name = tfds_split(split, validation)
    data = tfds_data.read_split(self.dataset_name, tfds_split_name, found)
    texts, labels = data["text"], data["label"].astype(np.int32)
    if limit:
      texts, labels = texts[:limit], labels[:limit]
    if not len(labels):
      raise DataError(f"{self.dataset_name} {tfds_split_name} in {found} has no examples")
    num_truncated = int(sum(len(t) > max_length for t in texts))
    if num_truncated:
      logging.info("%s %s: %d of %d reviews are longer than %d bytes and are truncated",
                   self.dataset_name, tfds_split_name, num_truncated, len(texts), max_length)
    tf = import_tf()
    encode = byte_tokens_fn(max_length)
    ds = tf.data.Dataset.from_tensor_slices((texts, labels)).map(
        lambda t, y: {"inputs": encode(t), "targets": y}, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    return Examples(ds, len(labels), num_truncated, f"tfds:{self.dataset_name}/{tfds_split_name} ({found})")
