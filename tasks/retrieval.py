"""Retrieval: AAN citation pairs (do two papers cite each other?), byte-level, two inputs.

Files: ``<data_dir>/lra_release/tsv_data/new_aan_pairs.{train,eval,test}.tsv`` (or ``<data_dir>/tsv_data/…``),
no header, tab-separated columns ``label id1 id2 text1 text2`` (label 0/1, possibly written ``1.0``).
Each text becomes bytes + 1 (vocab 257), truncated to ``max_length`` (4000 per document in LRA). Batches
are ``{"inputs1", "inputs2", "targets"}`` and go through the shared dual encoder of
``lra_bench.training.models.Classifier`` (one encoder for both documents, head over [u, v, u*v, u-v] as
the paper's eq. 1; docs/lra_protocol.md §3.5) — the original
code fed them to single-input encoders and crashed (LRA issues #39/#42).

Every file is validated once per process in one streaming pass (column count, label), so a malformed
line is reported as ``file:line``; the tf.data pipeline then streams the file with ``TextLineDataset``.
"""

from __future__ import annotations

import functools
import logging
import os

from tasks import register_task
from tasks.base import DataError, Examples, MissingDataError, Task, import_tf
from tasks.text import BYTE_VOCAB, byte_tokens_fn

SPLIT_FILES = {"train": "train", "validation": "eval", "test": "test"}
SUBDIRS = (os.path.join("lra_release", "tsv_data"), "tsv_data")
NUM_COLUMNS = 5


def split_path(data_dir: str, split: str) -> tuple[str, list[str]]:
  """The split's TSV (the first that exists) and the paths looked at."""
  looked = [os.path.join(data_dir, sub, f"new_aan_pairs.{SPLIT_FILES[split]}.tsv") for sub in SUBDIRS]
  return next((p for p in looked if os.path.exists(p)), looked[0]), looked


def parse_label(text: str) -> int:
  value = float(text)
  if value not in (0.0, 1.0):
    raise ValueError(text)
  return int(value)


@functools.lru_cache(maxsize=16)
def scan(path: str, size: int, mtime_ns: int, max_length: int) -> tuple[int, int]:
  """Validates every line of ``path``; returns (examples, examples with a text over max_length bytes)."""
  del size, mtime_ns  # cache key only
  count = truncated = 0
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      line = raw.rstrip(b"\r\n")
      if not line:
        continue
      fields = line.split(b"\t")
      if len(fields) != NUM_COLUMNS:
        raise DataError(f"{path}:{lineno}: expected {NUM_COLUMNS} tab-separated columns "
                        f"(label, id1, id2, text1, text2), got {len(fields)}")
      try:
        parse_label(fields[0].decode("ascii"))
      except (ValueError, UnicodeDecodeError):
        raise DataError(f"{path}:{lineno}: label {fields[0][:20]!r} is not 0 or 1") from None
      count += 1
      truncated += len(fields[3]) > max_length or len(fields[4]) > max_length
  return count, truncated


@register_task
class Retrieval(Task):
  name = "retrieval"
  num_classes = 2
  vocab_size = BYTE_VOCAB
  max_length = 4000
  dual_input = True
  chance_accuracy = 0.5

  def data_missing(self, data_dir: str, **_) -> str | None:
    path, looked = split_path(data_dir, "train")
    return None if os.path.exists(path) else f"none of {', '.join(looked)} exists"

  def prepare(self, data_dir: str, **_) -> str:
    """Checks that the AAN TSVs are there (they come only with the LRA release) and validates them."""
    lines = []
    for split in SPLIT_FILES:
      path, looked = split_path(data_dir, split)
      if not os.path.exists(path):
        raise self._missing(data_dir, looked)
      count, _ = scan(path, os.path.getsize(path), os.stat(path).st_mtime_ns, self.max_length)
      lines.append(f"{split} {count} pairs")
    return f"AAN in {os.path.dirname(path)}: " + ", ".join(lines)

  def _missing(self, data_dir: str, looked: list[str]) -> MissingDataError:
    return MissingDataError(
        f"retrieval data not found: {' or '.join(looked)} does not exist.\n"
        f"Download and unpack the LRA release with:\n  lra-bench data download lra-release --data_dir {data_dir}")

  def examples(self, data_dir: str, split: str, *, max_length: int, limit: int = 0) -> Examples:
    path, looked = split_path(data_dir, split)
    if not os.path.exists(path):
      raise self._missing(data_dir, looked)
    count, truncated = scan(path, os.path.getsize(path), os.stat(path).st_mtime_ns, max_length)
    if not count:
      raise DataError(f"{path}: no examples")
    if truncated:
      logging.info("%s: %d of %d pairs have a text longer than %d bytes (truncated)", path, truncated,
                   count, max_length)
    tf = import_tf()
    encode = byte_tokens_fn(max_length)

    def parse(line):
      fields = tf.strings.split(line, "\t")
      label = tf.cast(tf.strings.to_number(fields[0], tf.float32), tf.int32)
      return {"inputs1": encode(fields[3]), "inputs2": encode(fields[4]), "targets": label}

    ds = tf.data.TextLineDataset(path).map(lambda line: tf.strings.regex_replace(line, "\r$", ""))
    ds = ds.filter(lambda line: tf.strings.length(line) > 0)
    if limit:
      ds = ds.take(limit)
      count, truncated = min(count, limit), min(truncated, limit)
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return Examples(ds, count, truncated, path)
