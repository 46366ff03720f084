"""ListOps (LRA variant): a seeded generator faithful to the LRA generator, a reader for its TSV files
(ours or the official ``lra_release/listops-1000``), and a deterministic tokenizer.

Spec: docs/generators.md §1. Files: ``<data_dir>/listops-1000/<name>_{train,val,test}.tsv``
with header ``Source\\tTarget`` and CRLF line ends (Python's csv default, as the original wrote them), and
``<name>_meta.json`` (the generation options and each TSV's sha256), written last: it marks complete data.
A TSV that differs from it (another example count or sha256: cut short, overwritten) is named: a ``data
prepare`` with the same options generates the files again, and reading it (training) is refused with the
command that does (``tasks.checksums``). Files without that metadata (the official release) are read as
they are.

Differences from the original, on purpose:
- Seeded (``random.Random(seed)``): the same seed gives byte-identical files in every process. The
  original used unseeded global ``random`` and set iteration order.
- The vocabulary is a fixed tuple, so token ids are identical in every process. The original built it
  from a Python ``set``, so ids changed between processes (the likely cause of its ListOps ~17% test bug).
- Subtrees that already exceed the length filter are abandoned early; the accepted trees have the same
  distribution (they are exactly the draws that pass the filter), generation is just faster.
"""

from __future__ import annotations

import csv
import glob
import logging
import os
import random
import shutil
import tempfile
from typing import Union

import numpy as np

from tasks import checksums, register_task
from tasks.base import (DataError, Examples, MissingDataError, Task, check_count, check_name, import_tf,
                        length_range_error, pid_alive, read_meta)

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
CLOSE = "]"
# Token id 0 is padding; these get ids 1..15 in this fixed order; 16 is out-of-vocabulary (never used).
VOCAB = OPERATORS + ("X",) + tuple(str(d) for d in range(10))
OOV_ID = len(VOCAB) + 1
VOCAB_SIZE = len(VOCAB) + 2  # pad + 15 tokens + OOV = 17, as LRA's TokenTextEncoder

# What a Source may hold: parentheses (dropped by the tokenizer) around these whitespace-separated tokens.
# "X" is the tokenizer's own stand-in for "]", so a literal "X" in a file is refused like any other word.
SOURCE_TOKENS = frozenset(OPERATORS + (CLOSE,) + tuple(str(d) for d in range(10)))
_DROP_PARENS = str.maketrans("", "", "()")  # as the tokenizer: "(3" is "3", "3(4" is "34"
SPLIT_FILES = {"train": "train", "validation": "val", "test": "test"}
HEADER = ["Source", "Target"]
SUBDIR = "listops-1000"  # the official release folder name

Tree = Union[int, tuple[str, list["Tree"]]]


class _TooLong(Exception):
  pass


def generate_tree(rng: random.Random, *, max_depth: int = 10, max_args: int = 10,
                  value_p: float = 0.25, budget: int | None = None) -> tuple[Tree, int]:
  """One random tree from depth 1, as the LRA generator (docs/generators.md §1.2).

  Returns (tree, length) where length counts operator, value and ``]`` tokens. Raises ``_TooLong`` as
  soon as the length reaches ``budget`` (such a tree would be rejected by the length filter anyway).
  """
  used = 0

  def gen(depth: int) -> Tree:
    nonlocal used
    r = rng.random() if depth < max_depth else 1.0
    if r > value_p:
      used += 1
      if budget is not None and used >= budget:
        raise _TooLong
      return rng.randrange(10)
    num_args = rng.randint(2, max_args)
    children = [gen(depth + 1) for _ in range(num_args)]  # children are drawn before the operator
    used += 2
    if budget is not None and used >= budget:
      raise _TooLong
    return (rng.choice(OPERATORS), children)

  tree = gen(1)
  return tree, used


def to_source(tree: Tree) -> str:
  """The LRA ``Source`` string: the left-nested binary tuple form, every tuple in ``( … )``."""
  if not isinstance(tree, tuple):
    return str(tree)
  op, args = tree
  text = f"( {op} {to_source(args[0])} )"
  for arg in args[1:]:
    text = f"( {text} {to_source(arg)} )"
  return f"( {text} {CLOSE} )"


def evaluate(tree: Tree) -> int:
  """The label: MIN, MAX, MED (numpy median truncated to int), SM (sum mod 10)."""
  if not isinstance(tree, tuple):
    return tree
  op, args = tree
  values = [evaluate(a) for a in args]
  if op == "[MIN":
    return min(values)
  if op == "[MAX":
    return max(values)
  if op == "[MED":
    return int(np.median(values))
  if op == "[SM":
    return sum(values) % 10
  raise ValueError(f"unknown operator {op!r}")


def generate(num_examples: int, *, seed: int, min_length: int = 500, max_expression_length: int = 2000,
             max_depth: int = 10, max_args: int = 10, value_p: float = 0.25,
             progress: bool = True) -> list[tuple[str, int]]:
  """``num_examples`` distinct (source, label) pairs with ``min_length < length < max_expression_length``,
  shuffled with the seeded RNG."""
  from tasks.progress import Progress

  rng = random.Random(seed)
  seen: dict[str, int] = {}
  with Progress(num_examples, "ListOps: generating", "examples", enabled=progress,
                every=max(1, num_examples // 10)) as bar:
    while len(seen) < num_examples:
      try:
        tree, length = generate_tree(rng, max_depth=max_depth, max_args=max_args, value_p=value_p,
                                     budget=max_expression_length)
      except _TooLong:
        continue
      if min_length < length < max_expression_length:
        source = to_source(tree)
        if source not in seen:
          seen[source] = evaluate(tree)
          bar.advance()
  pairs = list(seen.items())  # insertion order: deterministic
  rng.shuffle(pairs)
  return pairs


def _split_path(data_dir: str, split: str, name: str) -> str:
  return os.path.join(data_dir, SUBDIR, f"{name}_{SPLIT_FILES[split]}.tsv")


def _remove_stale_temporaries(out_dir: str) -> None:
  """Removes the ``.tmp-listops-<pid>-*`` folders of killed prepares (not those of live processes)."""
  for path in glob.glob(os.path.join(out_dir, ".tmp-listops-*-*")):
    pid = os.path.basename(path).split("-")[2]
    if pid.isdigit() and not pid_alive(int(pid)):
      shutil.rmtree(path, ignore_errors=True)
      logging.info("removed %s (left by an interrupted prepare)", path)


def _count_examples(path: str) -> int:
  """Non-empty lines after the header (``read_tsv``'s examples, without parsing them)."""
  with open(path, "rb") as f:
    return sum(1 for line in f if line.strip()) - 1


def _count_problem(path: str, expected) -> str | None:
  """How ``path`` differs from the example count its metadata promises (a cut copy), or None."""
  count = _count_examples(path)
  if isinstance(expected, int) and count != expected:
    return f"{path} holds {count} examples, its metadata {expected}"
  return None


def _damaged_files(data_dir: str, options: dict, sums) -> list[str]:
  """Why each prepared file is not the one its metadata describes (missing, another example count, another
  sha256; ``sums``: the metadata's checksums, None for data prepared before they were kept, whose files
  must then read as valid ListOps), one line per damaged file naming it; empty: the data are whole."""
  problems = []
  for split, short in SPLIT_FILES.items():
    path = _split_path(data_dir, split, options["name"])
    if not os.path.exists(path):
      problems.append(f"{path} is missing")
      continue
    problem = _count_problem(path, options[f"num_{short}"])
    if not problem:
      detail = checksums.checksum_problem(path, sums)
      problem = detail and f"{path}: {detail}"
    if not problem and not isinstance(sums, dict):
      try:
        read_tsv(path)
      except DataError as err:
        problem = str(err)
    if problem:
      problems.append(problem)
  return problems


def _meta_options(meta: dict) -> dict:
  """A metadata file's options under today's names, without its checksums: data prepared before the
  generator's bound was renamed holds ``max_length`` for ``max_expression_length`` (the same data, kept)."""
  if "max_length" in meta and "max_expression_length" not in meta:
    meta = {("max_expression_length" if k == "max_length" else k): v for k, v in meta.items()}
  return {k: v for k, v in meta.items() if k != checksums.KEY}


def num_tokens(source: str) -> int:
  """Tokens after LRA preprocessing (parentheses dropped), for single-space separated sources."""
  return source.count(" ") + 1 - source.count("(") - source.count(")")


def read_tsv(path: str, num_classes: int = 10) -> tuple[list[str], list[int]]:
  """Reads and validates one ListOps TSV; malformed lines raise ``DataError`` naming file:line."""
  try:
    return _read_tsv(path, num_classes)
  except UnicodeDecodeError:
    raise DataError(_utf8_error(path)) from None


def _utf8_error(path: str) -> str:
  """Where ``path`` stops being UTF-8 (file:line, the byte) and the fix."""
  with open(path, "rb") as f:
    for lineno, line in enumerate(f, start=1):
      try:
        line.decode("utf-8")
      except UnicodeDecodeError as err:
        return (f"{path}:{lineno}: not valid UTF-8 (byte 0x{line[err.start]:02x} at column {err.start + 1}); "
                "a ListOps TSV is UTF-8 text: restore the file, or regenerate it with lra-bench data "
                "prepare listops --overwrite (and the options it was made with)")
  return f"{path}: not valid UTF-8"


def _read_tsv(path: str, num_classes: int) -> tuple[list[str], list[int]]:
  sources, labels = [], []
  with open(path, newline="", encoding="utf-8") as f:
    header = f.readline().rstrip("\r\n").split("\t")
    if header != HEADER:
      raise DataError(f"{path}:1: expected the header 'Source<TAB>Target', got {header!r}")
    for lineno, line in enumerate(f, start=2):
      line = line.rstrip("\r\n")
      if not line:
        continue
      fields = line.split("\t")
      if len(fields) != 2:
        raise DataError(f"{path}:{lineno}: expected 2 tab-separated columns (Source, Target), "
                        f"got {len(fields)}")
      source, target = fields
      try:
        label = int(target)
      except ValueError:
        raise DataError(f"{path}:{lineno}: Target {target!r} is not an integer") from None
      if not 0 <= label < num_classes:
        raise DataError(f"{path}:{lineno}: Target {label} is outside 0..{num_classes - 1}")
      if not source.strip():
        raise DataError(f"{path}:{lineno}: empty Source")
      check_tokens(source, path, lineno)
      sources.append(source)
      labels.append(label)
  return sources, labels


def check_tokens(source: str, path: str, lineno: int) -> None:
  """Refuses a Source token outside the vocabulary, naming file:line and the token (the tokenizer would
  map it to the out-of-vocabulary id without a word, and the model would train on it)."""
  words = source.translate(_DROP_PARENS).split()
  if not SOURCE_TOKENS.issuperset(set(words)):  # a set per line: the common (valid) case stays in C
    word = next(w for w in words if w not in SOURCE_TOKENS)
    raise DataError(f"{path}:{lineno}: Source token {word!r} is not in the ListOps vocabulary "
                    f"({' '.join(OPERATORS)} {CLOSE} 0-9, with parentheses); fix or drop that line")


def tokenize_fn(max_length: int):
  """A tf function str -> int32[max_length] with the fixed vocabulary (same ids in every process)."""
  tf = import_tf()
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(tf.constant(VOCAB), tf.range(1, len(VOCAB) + 1, dtype=tf.int32)),
      default_value=OOV_ID)

  def tokenize(source):
    text = tf.strings.regex_replace(source, r"[()]", "")
    text = tf.strings.regex_replace(text, r"\]", "X")
    ids = table.lookup(tf.strings.split(text))[:max_length]
    ids = tf.pad(ids, [[0, max_length - tf.shape(ids)[0]]])
    ids.set_shape([max_length])
    return ids

  return tokenize


def pretokenized_fn(sources: list[str], max_length: int):
  """The same function as ``tokenize_fn(max_length)`` for these sources, with the tokenizing done once.

  Every distinct source is tokenized here into a uint8 table [sources, max_length] (truncated and padded
  as ``tokenize_fn``); the returned tf function finds a source's row by a hash lookup of the whole
  string. ``tokenize_fn`` in the pipeline ran two regex passes, a split and a lookup per token for every
  example of every epoch and evaluation: ~4 ms of CPU per batch of 32 at the cpu protocol's 128 tokens,
  taken from the train step on 2 cores, and ~55 s per epoch of the 96 000 LRA-size sources. This costs
  one pass at the start (0.3 s for the cpu protocol's 8 000 sources, 13 s for the 96 000) and one string
  hash per example. The sources reaching here passed ``check_tokens``, so every word is in the
  vocabulary. The elements, their types and the pipeline's structure are unchanged: batches are
  byte-identical, and an iterator state saved by either pipeline restores into the other
  (tests/test_listops.py).
  """
  tf = import_tf()
  unique = list(dict.fromkeys(sources))
  table = tf.constant(_token_table(unique, max_length))
  keys = tf.constant(unique) if unique else tf.constant([], tf.string)
  rows = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(keys, tf.range(len(unique), dtype=tf.int64)), default_value=-1)

  def tokenized(source):
    return tf.cast(tf.gather(table, rows.lookup(source)), tf.int32)

  return tokenized


def _token_table(sources: list[str], max_length: int) -> np.ndarray:
  """uint8 [N, max_length]: each source's token ids (``tokenize_fn``'s, truncated and zero-padded),
  computed in numpy. The sources passed ``check_tokens``, so every word is in the vocabulary."""
  ids = {word: i for i, word in enumerate(VOCAB, start=1)}
  ids[CLOSE] = ids.pop("X")  # the tokenizer's "]" -> "X"; a literal "X" is refused by check_tokens
  lookup = ids.__getitem__
  table = np.zeros((len(sources), max_length), np.uint8)  # ids < VOCAB_SIZE = 17
  for row, source in enumerate(sources):
    words = source.translate(_DROP_PARENS).split()[:max_length]
    table[row, :len(words)] = np.fromiter(map(lookup, words), np.uint8, len(words))
  return table


def token_ids(sources: list[str], max_length: int) -> np.ndarray:
  """int32 [N, max_length]: the token ids of ``sources`` without TensorFlow (the numpy pipeline)."""
  return _token_table(sources, max_length).astype(np.int32)


def tokenize(sources: list[str], max_length: int) -> np.ndarray:
  """Eager helper: int32 [N, max_length] token ids (tests, inspection)."""
  tf = import_tf()
  fn = tokenize_fn(max_length)
  return np.stack([fn(tf.constant(s)).numpy() for s in sources]) if sources else np.zeros((0, max_length), np.int32)


@register_task
class ListOps(Task):
  name = "listops"
  num_classes = 10
  vocab_size = VOCAB_SIZE
  max_length = 2000
  chance_accuracy = 0.1

  def prepare(self, data_dir: str, *, name: str = "basic", num_train: int = 96_000,
              num_val: int = 2_000, num_test: int = 2_000, seed: int = 0, min_length: int = 500,
              max_expression_length: int = 2000, overwrite: bool = False, progress: bool = True) -> str:
    """Generates ``<data_dir>/listops-1000/<name>_{train,val,test}.tsv`` (idempotent, atomic).

    Existing files with the same generation options are kept; existing files from elsewhere (e.g. the
    official release) are never overwritten unless ``overwrite=True``. ``max_expression_length`` bounds
    the generated expressions (tokens); the model's sequence length is ``data.max_length``.
    """
    num_train, num_val, num_test, min_length, max_expression_length = (
        check_count(self.name, option, value) for option, value in
        (("num_train", num_train), ("num_val", num_val), ("num_test", num_test), ("min_length", min_length),
         ("max_expression_length", max_expression_length)))
    problem = length_range_error(min_length, max_expression_length)
    if problem:
      raise DataError(f"data prepare {self.name}: {problem}")
    check_name(self.name, name)
    out_dir = os.path.join(data_dir, SUBDIR)
    options = dict(name=name, num_train=num_train, num_val=num_val, num_test=num_test, seed=seed,
                   min_length=min_length, max_expression_length=max_expression_length,
                   generator="lra-bench listops v1")
    meta_path = os.path.join(out_dir, f"{name}_meta.json")
    paths = [_split_path(data_dir, s, name) for s in SPLIT_FILES]
    if all(map(os.path.exists, paths)) and not overwrite:
      if os.path.exists(meta_path):
        meta = read_meta(meta_path, "pass --overwrite to regenerate the data")
        if _meta_options(meta) == options:
          sums = meta.get(checksums.KEY)
          damaged = _damaged_files(data_dir, options, sums)
          if not damaged:
            if not isinstance(sums, dict):  # prepared before the checksums: whole, so add them
              checksums.add_checksums(meta_path, meta, paths)
            logging.info("ListOps data already prepared in %s", out_dir)
            return out_dir
          for problem in damaged:
            logging.warning("%s; generating the files again", problem)
          return self.prepare(data_dir, **{k: v for k, v in options.items() if k != "generator"},
                              overwrite=True, progress=progress)
        raise DataError(f"{out_dir} holds ListOps '{name}' files generated with other options "
                        f"(see {meta_path}); pass --overwrite to regenerate them")
      logging.info("found ListOps files without generator metadata in %s (official release?); "
                   "keeping them", out_dir)
      return out_dir
    pairs = generate(num_train + num_val + num_test, seed=seed, min_length=min_length,
                     max_expression_length=max_expression_length, progress=progress)
    cuts = {"train": pairs[:num_train], "validation": pairs[num_train:num_train + num_val],
            "test": pairs[num_train + num_val:]}
    os.makedirs(out_dir, exist_ok=True)
    _remove_stale_temporaries(out_dir)
    tmp_dir = tempfile.mkdtemp(prefix=f".tmp-listops-{os.getpid()}-", dir=out_dir)
    try:
      for split, rows in cuts.items():
        with open(os.path.join(tmp_dir, os.path.basename(_split_path(data_dir, split, name))), "w",
                  newline="", encoding="utf-8") as f:
          writer = csv.writer(f, delimiter="\t")  # default dialect: CRLF, like the original
          writer.writerow(HEADER)
          writer.writerows(rows)
      # The metadata, written last, holds each file's sha256 (checked by a prepare and by every read).
      sums = {os.path.basename(path): checksums.sha256(os.path.join(tmp_dir, os.path.basename(path)))
              for path in paths}
      checksums.write_json(os.path.join(tmp_dir, os.path.basename(meta_path)), {**options, checksums.KEY: sums})
      for split in SPLIT_FILES:
        base = os.path.basename(_split_path(data_dir, split, name))
        os.replace(os.path.join(tmp_dir, base), os.path.join(out_dir, base))
      os.replace(os.path.join(tmp_dir, os.path.basename(meta_path)), meta_path)  # last: marks complete
    finally:
      shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir

  def _check_generated(self, data_dir: str, split: str, name: str) -> None:
    """A file we generated (its ``<name>_meta.json`` is beside it) is the one its metadata describes: the
    example count it promises, and the sha256 it records (data prepared before checksums were kept: the
    count alone). Else DataError naming the file and the prepare command that regenerates it, before the
    file is parsed (a file cut mid-line would otherwise fail on that line, without the fix)."""
    meta_path = os.path.join(data_dir, SUBDIR, f"{name}_meta.json")
    if not os.path.exists(meta_path):
      return  # the official release or a user's own files: nothing promised
    command = self.prepare_command(data_dir, name=name)
    meta = read_meta(meta_path, f"delete it and regenerate the data: {command} --overwrite (with "
                     "the options it was made with)")
    options = {k: v for k, v in _meta_options(meta).items() if k != "generator"}
    regenerate = f"regenerate it with: {self.prepare_command(data_dir, **options)}"
    path = _split_path(data_dir, split, name)
    count, expected = _count_examples(path), options.get(f"num_{SPLIT_FILES[split]}")
    if isinstance(expected, int) and count != expected:
      raise DataError(f"{path}: {count} examples, but {meta_path} promises {expected} (a cut or edited file); "
                      f"{regenerate}")
    problem = checksums.checksum_problem(path, meta.get(checksums.KEY), source=os.path.basename(meta_path))
    if problem:
      raise DataError(f"{path}: {problem}; {regenerate} (a prepare with the same options finds the damaged "
                      "file and generates the data again)")

  def data_missing(self, data_dir: str, *, name: str = "basic", **_) -> str | None:
    path = _split_path(data_dir, "train", name)
    return None if os.path.exists(path) else f"{path} does not exist"

  def examples(self, data_dir: str, split: str, *, max_length: int, name: str = "basic") -> Examples:
    path, sources, labels, num_truncated = self._read(data_dir, split, max_length, name)
    tf = import_tf()
    tokenized = pretokenized_fn(sources, max_length)
    ds = tf.data.Dataset.from_tensor_slices((sources, np.asarray(labels, np.int32)))
    ds = ds.map(lambda s, y: {"inputs": tokenized(s), "targets": y},
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return Examples(ds, len(sources), num_truncated, path)

  def array_examples(self, data_dir: str, split: str, *, max_length: int, name: str = "basic") -> Examples:
    path, sources, labels, num_truncated = self._read(data_dir, split, max_length, name)
    arrays = {"inputs": token_ids(sources, max_length), "targets": np.asarray(labels, np.int32)}
    return Examples(None, len(sources), num_truncated, path, arrays=arrays)

  def _read(self, data_dir: str, split: str, max_length: int, name: str) -> tuple[str, list[str], list[int], int]:
    """(path, sources, labels, how many are truncated) of one split, checked."""
    path = _split_path(data_dir, split, name)
    if not os.path.exists(path):
      fix = self.prepare_command(data_dir) if name == "basic" else \
          f"lra-bench data prepare listops --protocol <the protocol that uses {name!r}> --data_dir {data_dir}"
      raise MissingDataError(f"ListOps data not found: {path} does not exist.\nGenerate it with:\n  {fix}")
    check_name(self.name, name, "data.options.name")
    self._check_generated(data_dir, split, name)
    sources, labels = read_tsv(path, self.num_classes)
    if not sources:
      raise DataError(f"{path}: no examples")
    num_truncated = sum(num_tokens(s) > max_length for s in sources)
    if num_truncated:
      logging.warning("%s: %d of %d examples are longer than max_length=%d and are truncated",
                      path, num_truncated, len(sources), max_length)
    return path, sources, labels, num_truncated
