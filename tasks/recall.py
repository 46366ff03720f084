"""The recall tasks: seeded generators of three synthetic in-context recall benchmarks, next-token objective.

- ``mqar``: Zoology's multi-query associative recall (HazyResearch/zoology,
  ``zoology/data/multiquery_ar.py``; the same logic since its commit 13e789b "Add power law code").
- ``assoc_recall``: the single-query associative recall of H3 / Hyena (HazyResearch/safari,
  ``src/dataloaders/synthetics.py`` with ``copy_method: assoc_recall``; the same file in berlino/seq_icl).
- ``induction_head``: the induction-head task of the same file (``copy_method: induction_head``).

Spec, defaults and every difference from the originals: docs/generators.md §3. Batches follow the
``"next_token"`` contract of ``tasks/base.py``: per example ``{"inputs": int32[T], "positions": int32[Q],
"targets": int32[Q]}``.

Token ids: the original's token ``t`` is our ``t + 1``, so 0 stays the harness's padding id and the data
never holds it (not even where the original has a 0: Zoology's filler token, safari's ``"."``), and the
vocabulary (``Examples.vocab_size``) is the original's plus one. The generators below (``generate_*``)
return the original ids; ``prepare`` shifts them.

Files: ``<data_dir>/recall/<task>-<name>_{train,val,test}.npz`` (arrays ``inputs`` [N, T], ``positions``
[N, Q], ``targets`` [N, Q], int32, shifted ids; MQAR adds ``num_kv_pairs`` [N]) and
``<task>-<name>.json`` (every option, the vocabulary, the counts and each split file's sha256), written
last: it marks complete data. A split file whose checksum differs (cut short, overwritten) is named: a
``data prepare`` with the same options generates the data again, and reading it (training) is refused with
the command that does.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import shutil
import tempfile
import zipfile
from typing import Callable

import numpy as np

from tasks import checksums, register_task
from tasks.checksums import sha256
from tasks.progress import Progress
from tasks.base import (IGNORE, PREPARE_RANGES, DataError, Examples, MissingDataError, Task, check_count,
                        check_name, import_tf, pid_alive, read_meta)

SUBDIR = "recall"
SPLIT_FILES = {"train": "train", "validation": "val", "test": "test"}
GENERATOR = "lra-bench recall v1"
TRAIN_TARGETS = ("all", "last")
DEFAULT_NAME = "default"
# Rows the MQAR generator makes at once (bounds its memory at long sequences). The chunks draw from the
# stream in turn, so the data depend on it: changing it is a new GENERATOR version.
MQAR_CHUNK = 16_384
# A split whose drawing finds no new distinct example this many rounds in a row is refused: its options
# allow fewer distinct sequences than requested (e.g. induction_head --seq_len 3 --vocab_size 3).
MAX_STALLED_ROUNDS = 20


# ----------------------------------------------------------------------------------------------------
# Generators (original token ids, before the +1 shift). Each takes a numpy Generator and a row count.


def distinct_integers(rng: np.random.Generator, n: int, low: int, high: int, k: int) -> np.ndarray:
  """int64[n, k]: per row, k distinct integers drawn uniformly from ``[low, high)`` without replacement,
  in uniformly random order (Floyd's subset sampling, vectorised over rows, then a per-row shuffle)."""
  size = high - low
  if not 0 <= k <= size:
    raise ValueError(f"cannot draw {k} distinct integers from [{low}, {high})")
  out = np.empty((n, k), np.int64)
  for i, j in enumerate(range(size - k, size)):
    t = rng.integers(0, j + 1, size=n)
    if i:
      t = np.where((out[:, :i] == t[:, None]).any(axis=1), j, t)
    out[:, i] = t
  return rng.permuted(out, axis=1) + low


def power_law(space: int, power_a: float) -> np.ndarray:
  """Zoology's gap distribution over ``g = 0 .. space-1``: ``p(g) ∝ a·(g+1)^(a-1)``, normalised."""
  p = power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)
  return p / p.sum()


def ordered_sample(rng: np.random.Generator, n: int, p: np.ndarray, k: int) -> np.ndarray:
  """int64[n, k]: per row, k distinct indices of ``p`` drawn one after another without replacement, each
  from ``p`` renormalised over the indices not yet drawn (the order matters: draw i is key i's gap).

  This is the distribution of numpy's ``choice(space, k, replace=False, p=p)`` (which keeps the first
  occurrences of repeated i.i.d. draws), sampled for all rows at once by the Gumbel-top-k trick: the k
  largest ``log p + Gumbel`` in decreasing order."""
  with np.errstate(divide="ignore"):
    scores = np.log(p)[None, :] + rng.gumbel(size=(n, len(p)))
  return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int64)


def generate_mqar(rng: np.random.Generator, n: int, *, vocab_size: int = 8192, seq_len: int = 64,
                  num_kv_pairs: int = 4, power_a: float = 0.01, random_non_queries: bool = False
                  ) -> dict[str, np.ndarray]:
  """``n`` MQAR examples, original ids (docs/generators.md §3.1).

  Returns ``inputs`` int64[n, seq_len], ``positions`` int64[n, num_kv_pairs] (query i is key i of the
  context) and ``targets`` int64[n, num_kv_pairs] (the value of that key, predicted at the key's position).
  """
  out = {"inputs": [], "positions": [], "targets": []}
  for start in range(0, n, MQAR_CHUNK):
    m = min(MQAR_CHUNK, n - start)
    chunk = _mqar_chunk(rng, m, vocab_size, seq_len, num_kv_pairs, power_a, random_non_queries)
    for key, value in chunk.items():
      out[key].append(value)
  if not n:
    return {"inputs": np.zeros((0, seq_len), np.int64), "positions": np.zeros((0, num_kv_pairs), np.int64),
            "targets": np.zeros((0, num_kv_pairs), np.int64)}
  return {key: np.concatenate(value) for key, value in out.items()}


def _mqar_chunk(rng, n, vocab_size, seq_len, num_kv_pairs, power_a, random_non_queries):
  context = 2 * num_kv_pairs
  half = vocab_size // 2
  keys = distinct_integers(rng, n, 1, half, num_kv_pairs)          # 0 is never a key
  values = distinct_integers(rng, n, half, vocab_size, num_kv_pairs)
  inputs = np.zeros((n, seq_len), np.int64)
  inputs[:, 0:context:2] = keys
  inputs[:, 1:context:2] = values
  gaps = ordered_sample(rng, n, power_law((seq_len - context) // 2, power_a), num_kv_pairs)
  positions = context + 2 * gaps
  np.put_along_axis(inputs, positions, keys, axis=1)
  if random_non_queries:  # every 0 (the fillers; no key or value is 0) becomes a uniform draw from [0, V)
    fill = inputs == 0
    inputs[fill] = rng.integers(0, vocab_size, size=int(fill.sum()))
  return {"inputs": inputs, "positions": positions, "targets": values}


def safari_tokens(vocab_size: int) -> dict[str, int]:
  """safari's ids for ``vocab_size`` (its ``Vocab``: ``vocab_size - 2`` ordinary tokens, the strings
  "0" .. str(n-1), and the specials "." (noop) and "=>" (copy prefix), all sorted as strings). The sort
  puts "." first (id 0), the ordinary tokens at ids 1..n and "=>" last (id n + 1); the associative-recall
  keys are the first half of the ordinary tokens in that order (ids 1..n//2), the values the rest."""
  n = vocab_size - 2
  return {"noop": 0, "first": 1, "last": n, "copy_prefix": n + 1, "num_keys": n // 2}


def generate_assoc_recall(rng: np.random.Generator, n: int, *, vocab_size: int = 20, seq_len: int = 40
                          ) -> np.ndarray:
  """``n`` associative-recall sequences, original ids: int64[n, 2·(seq_len//2) + 3] (docs/generators.md
  §3.2): ``seq_len // 2`` pairs ``k v`` with keys drawn uniformly with replacement and each key's value
  fixed per example by a random map, then ``=>``, a key that occurred (uniform over the distinct keys of the
  context), and its value. The model reads all but the last token."""
  ids = safari_tokens(vocab_size)
  num_keys = ids["num_keys"]
  num_values = ids["last"] - num_keys
  kv_map = num_keys + 1 + rng.integers(0, num_values, size=(n, num_keys))   # key index -> value id
  pairs = seq_len // 2
  key_index = rng.integers(0, num_keys, size=(n, pairs))
  rows = np.arange(n)[:, None]
  seq = np.empty((n, 2 * pairs + 3), np.int64)
  seq[:, 0:2 * pairs:2] = key_index + 1
  seq[:, 1:2 * pairs:2] = kv_map[rows, key_index]
  present = np.zeros((n, num_keys), bool)
  present[rows, key_index] = True
  scores = np.where(present, rng.random((n, num_keys)), -1.0)
  query = scores.argmax(axis=1)                                           # uniform over the present keys
  seq[:, -3] = ids["copy_prefix"]
  seq[:, -2] = query + 1
  seq[:, -1] = kv_map[np.arange(n), query]
  return seq


def generate_induction_head(rng: np.random.Generator, n: int, *, vocab_size: int = 20, seq_len: int = 30
                            ) -> np.ndarray:
  """``n`` induction-head sequences, original ids: int64[n, seq_len + 2] (docs/generators.md §3.3):
  ``seq_len`` uniform ordinary tokens, one of them (at p, uniform in [0, seq_len - 2)) replaced by the
  trigger ``=>``, then ``=>`` again and the token that followed the first trigger (at p + 1)."""
  ids = safari_tokens(vocab_size)
  seq = np.empty((n, seq_len + 2), np.int64)
  seq[:, :seq_len] = rng.integers(ids["first"], ids["last"] + 1, size=(n, seq_len))
  trigger = rng.integers(0, seq_len - 2, size=n)
  rows = np.arange(n)
  seq[rows, trigger] = ids["copy_prefix"]
  seq[:, seq_len] = ids["copy_prefix"]
  seq[:, seq_len + 1] = seq[rows, trigger + 1]
  return seq


def mad_vocab(vocab_size: int, noise_vocab_size: int) -> dict[str, int]:
  """MAD's split of the vocabulary (multi-query form, no special token): keys ``0 .. K-1``, values
  ``K .. S-1`` and noise ``S .. S+noise-1``, where ``S = vocab_size - noise_vocab_size`` and ``K = S // 2``."""
  plain = vocab_size - noise_vocab_size
  return {"keys": plain // 2, "plain": plain, "noise": noise_vocab_size}


def generate_mad_recall(rng: np.random.Generator, n: int, *, vocab_size: int = 16, seq_len: int = 128,
                        noise_vocab_size: int = 0, frac_noise: float = 0.0) -> dict[str, np.ndarray]:
  """``n`` sequences of MAD's in-context recall (``frac_noise = 0``) or noisy in-context recall, original
  ids, multi-query form (MAD's benchmark setting; docs/generators.md, "MAD recall").

  A sequence is ``seq_len // 2`` slots of two tokens. Each of the first ``seq_len // 2 - 1`` is, with
  probability ``frac_noise``, two uniform noise tokens, else a key drawn uniformly with replacement and
  its value (a random value per key, fixed within the sequence; two keys may share one). At least one of
  them is a key-value pair. The last slot repeats a key of the sequence (uniform over the distinct keys
  seen) with its value. Returns ``sequences`` int64[n, seq_len] and ``labels`` int64[n, seq_len]: the
  value at each value position whose key occurred earlier in the sequence (the last slot's always), -1
  elsewhere; the model reads ``sequences[:, :-1]``."""
  ids = mad_vocab(vocab_size, noise_vocab_size)
  keys_n, plain = ids["keys"], ids["plain"]
  slots = seq_len // 2 - 1
  rows = np.arange(n)
  kv_map = rng.integers(keys_n, plain, size=(n, keys_n))               # key -> its value in this sequence
  keys = rng.integers(0, keys_n, size=(n, slots))
  noise = np.zeros((n, slots), bool)
  if frac_noise > 0:
    noise = rng.random((n, slots)) < frac_noise
    noise[rows, rng.integers(0, slots, size=n)] = False                  # at least one key-value pair
  values = kv_map[rows[:, None], keys]
  seq = np.empty((n, seq_len), np.int64)
  seq[:, 0:2 * slots:2] = keys
  seq[:, 1:2 * slots:2] = values
  if frac_noise > 0:
    filler = rng.integers(plain, plain + ids["noise"], size=(n, slots, 2))
    seq[:, 0:2 * slots:2] = np.where(noise, filler[..., 0], seq[:, 0:2 * slots:2])
    seq[:, 1:2 * slots:2] = np.where(noise, filler[..., 1], seq[:, 1:2 * slots:2])
  # seen[b, i, k]: key k was shown in a key-value slot at or before slot i (bool: 1 byte per entry, as
  # this is n x slots x keys large)
  seen = np.zeros((n, slots, keys_n), bool)
  seen[rows[:, None], np.arange(slots)[None, :], keys] = ~noise
  np.logical_or.accumulate(seen, axis=1, out=seen)
  repeated = np.zeros((n, slots), bool)                                 # its key was shown in an earlier slot
  repeated[:, 1:] = seen[rows[:, None], np.arange(slots - 1)[None, :], keys[:, 1:]] & ~noise[:, 1:]
  labels = np.full((n, seq_len), IGNORE, np.int64)
  labels[:, 1:2 * slots:2] = np.where(repeated, values, IGNORE)
  probe = np.where(seen[:, -1], rng.random((n, keys_n)), -1.0).argmax(axis=1)  # uniform over the keys seen
  seq[:, -2] = probe
  seq[:, -1] = labels[:, -1] = kv_map[rows, probe]
  return {"sequences": seq, "labels": labels}


def lm_layout(sequences: np.ndarray, targets: str) -> dict[str, np.ndarray]:
  """safari's layout of full sequences S [n, T + 1]: inputs ``S[:, :-1]``; ``targets="all"``: every
  position t predicts ``S[:, t + 1]`` (its training loss); ``"last"``: only the last position (its test
  metric, the answer)."""
  n, length = sequences.shape
  inputs = sequences[:, :-1]
  if targets == "all":
    positions = np.broadcast_to(np.arange(length - 1), (n, length - 1))
    return {"inputs": inputs, "positions": positions, "targets": sequences[:, 1:]}
  if targets == "last":
    return {"inputs": inputs, "positions": np.full((n, 1), length - 2), "targets": sequences[:, -1:]}
  raise ValueError(f"unknown targets layout {targets!r}; expected one of {TRAIN_TARGETS}")


def shift(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Original ids -> ours (t + 1; 0 is padding), int32; positions unchanged, ``IGNORE`` targets kept."""
  out = {key: np.asarray(value, np.int32) for key, value in arrays.items()}
  out["inputs"] = out["inputs"] + 1
  out["targets"] = np.where(out["targets"] == IGNORE, IGNORE, out["targets"] + 1).astype(np.int32)
  return out


def _row_keys(rows: np.ndarray) -> list[bytes]:
  rows = np.ascontiguousarray(rows, np.int64)
  return [row.tobytes() for row in rows]


def draw_split(generate: Callable[[np.random.Generator, int], dict[str, np.ndarray]], key: str,
               rng: np.random.Generator, count: int, seen: set[bytes], *, unique: bool, task: str,
               split: str) -> tuple[dict[str, np.ndarray], int]:
  """``count`` examples of ``generate`` (a dict of arrays with one row per example; ``key`` names the one
  whose rows identify an example: its tokens) none of which is in ``seen`` (the earlier splits' rows; the
  kept rows are added to it); ``unique``: no row twice in this split either (safari de-duplicates each
  split). A dropped example is replaced by further draws of the same stream. Returns the arrays (rows in
  the order drawn) and how many draws were dropped."""
  kept, have, dropped, stalled, local = [], 0, 0, 0, set()
  size = count
  while have < count:
    batch = generate(rng, size)
    select = []
    for i, row in enumerate(_row_keys(batch[key])):
      if row in seen or (unique and row in local):
        dropped += 1
        continue
      if unique:
        local.add(row)
      select.append(i)
      if have + len(select) == count:
        break
    select = np.asarray(select, np.intp)
    kept.append({name: value[select] for name, value in batch.items()})
    have += len(select)
    stalled = 0 if len(select) else stalled + 1
    if stalled >= MAX_STALLED_ROUNDS:
      raise DataError(f"data prepare {task}: found only {have} of the {count} {split} examples (each new, "
                      f"unlike the earlier splits' and, for {task}, the split's own) and then none in "
                      f"{MAX_STALLED_ROUNDS} rounds of draws: these options allow too few different sequences; "
                      "lower the example counts or raise --seq_len / --vocab_size")
    size = max(2 * (count - have), 1024)
  seen.update(_row_keys(np.concatenate([piece[key] for piece in kept])))
  return {name: np.concatenate([piece[name] for piece in kept]) for name in kept[0]}, dropped


# ----------------------------------------------------------------------------------------------------
# The tasks


def _check_int(task: str, option: str, value) -> int:
  """``check_count`` and the upper bound of ``PREPARE_RANGES`` (the seed's)."""
  value = check_count(task, option, value)
  high = PREPARE_RANGES[option][1]
  if high is not None and value > high:
    raise DataError(f"data prepare {task}: --{option} is {value}; it must be <= {high}")
  return value


def _check_choice(task: str, option: str, value, choices: tuple) -> str:
  if value not in choices:
    raise DataError(f"data prepare {task}: --{option} is {value!r}; expected one of {', '.join(choices)}")
  return value


class _RecallTask(Task):
  """Shared prepare (seeded splits, atomic files, metadata last) and examples (npz -> tf.data)."""

  objective = "next_token"
  dual_input = False
  unique_within_split: bool   # safari de-duplicates each split; Zoology does not
  key_array: str              # the generated array one example's identity is read from

  # -- per task
  def _generate(self, rng: np.random.Generator, n: int, options: dict) -> dict[str, np.ndarray]:
    """``n`` examples as arrays of original ids, one row each; ``key_array`` is compared for duplicates."""
    raise NotImplementedError

  def _layout(self, drawn: dict[str, np.ndarray], split: str, options: dict) -> dict[str, np.ndarray]:
    """``inputs`` / ``positions`` / ``targets`` (+ extras) of one split's drawn examples, original ids."""
    raise NotImplementedError

  def _vocab_size(self, options: dict) -> int:
    """Ours: the original vocabulary + 1 (padding)."""
    raise NotImplementedError

  # -- shared
  def _paths(self, data_dir: str, name: str) -> tuple[str, dict[str, str], str]:
    out_dir = os.path.join(data_dir, SUBDIR)
    stem = f"{self.name}-{name}"
    splits = {split: os.path.join(out_dir, f"{stem}_{short}.npz") for split, short in SPLIT_FILES.items()}
    return out_dir, splits, os.path.join(out_dir, f"{stem}.json")

  def _common(self, name, num_train, num_val, num_test, seed) -> dict:
    check_name(self.name, name)
    counts = {option: _check_int(self.name, option, value) for option, value in
              (("num_train", num_train), ("num_val", num_val), ("num_test", num_test), ("seed", seed))}
    return {"name": name, **counts}

  def _prepare(self, data_dir: str, options: dict) -> str:
    name = options["name"]
    out_dir, paths, meta_path = self._paths(data_dir, name)
    if os.path.exists(meta_path):
      fix = f"delete it and the {self.name}-{name}_*.npz files beside it and prepare again"
      meta = read_meta(meta_path, fix)
      made = meta.get("options") if isinstance(meta.get("options"), dict) else {}
      if made != options or meta.get("generator") != GENERATOR:
        differ = sorted(k for k in set(options) | set(made) if made.get(k) != options.get(k))
        raise DataError(f"{meta_path}: the {self.name} data '{name}' was generated with other options "
                        f"(differing: {', '.join(differ) or 'generator version'}; see that file); pick "
                        f"another --name, or delete {os.path.join(out_dir, f'{self.name}-{name}')}* and prepare "
                        "again")
      damaged = [(path, problem) for path in paths.values() if (problem := _file_problem(path, meta))]
      if not damaged:
        if not isinstance(meta.get(checksums.KEY), dict):  # prepared before the checksums: whole, so add them
          checksums.add_checksums(meta_path, meta, paths.values())
        logging.info("%s data '%s' already prepared in %s", self.name, name, out_dir)
        return out_dir
      for path, problem in damaged:
        logging.warning("%s: %s; generating the %s data '%s' again", path, problem, self.name, name)
    arrays, redrawn = self._generate_splits(options)
    meta = {"task": self.name, "generator": GENERATOR, "options": options,
            "vocab_size": self._vocab_size(options),
            "length": int(arrays["train"]["inputs"].shape[1]),
            "queries": {split: int(a["positions"].shape[1]) for split, a in arrays.items()},
            "examples": {split: int(a["inputs"].shape[0]) for split, a in arrays.items()},
            "duplicates_redrawn": redrawn}
    os.makedirs(out_dir, exist_ok=True)
    self._remove_stale_temporaries(out_dir)
    tmp_dir = tempfile.mkdtemp(prefix=f".tmp-recall-{os.getpid()}-", dir=out_dir)
    try:
      for split, path in paths.items():
        np.savez(os.path.join(tmp_dir, os.path.basename(path)), **arrays[split])
      meta[checksums.KEY] = {os.path.basename(path): sha256(os.path.join(tmp_dir, os.path.basename(path)))
                             for path in paths.values()}
      # fsynced by write_json: on disk before it marks the data complete
      checksums.write_json(os.path.join(tmp_dir, os.path.basename(meta_path)), meta)
      for path in paths.values():
        os.replace(os.path.join(tmp_dir, os.path.basename(path)), path)
      os.replace(os.path.join(tmp_dir, os.path.basename(meta_path)), meta_path)  # last: marks the data complete
    finally:
      shutil.rmtree(tmp_dir, ignore_errors=True)
    return out_dir

  def _generate_splits(self, options: dict) -> tuple[dict, dict]:
    """Train, validation and test from their own streams ``default_rng([seed, 0|1|2])``; no row of a later
    split repeats one of an earlier split (redrawn, counted)."""
    seen: set[bytes] = set()
    arrays, redrawn = {}, {}
    counts = {split: options[f"num_{short}"] for split, short in SPLIT_FILES.items()}
    with Progress(sum(counts.values()), f"{self.name} '{options['name']}': generating", "examples") as bar:
      for index, (split, short) in enumerate(SPLIT_FILES.items()):
        bar.set_status(f"the {split} split")
        rng = np.random.default_rng([options["seed"], index])
        drawn, dropped = draw_split(lambda r, n: self._generate(r, n, options), self.key_array, rng,
                                    options[f"num_{short}"], seen, unique=self.unique_within_split,
                                    task=self.name, split=split)
        if dropped:
          logging.warning("%s: %d %s examples repeated an earlier one and were drawn again", self.name, dropped,
                          split)
        arrays[split] = shift(self._layout(drawn, split, options))
        redrawn[split] = dropped
        bar.advance(counts[split], note=f"the {split} split")
    return arrays, redrawn

  @staticmethod
  def _remove_stale_temporaries(out_dir: str) -> None:
    for path in glob.glob(os.path.join(out_dir, ".tmp-recall-*-*")):
      pid = os.path.basename(path).split("-")[2]
      if pid.isdigit() and not pid_alive(int(pid)):
        shutil.rmtree(path, ignore_errors=True)

  def data_missing(self, data_dir: str, *, name: str = DEFAULT_NAME, **_) -> str | None:
    meta_path = self._paths(data_dir, name)[2]
    return None if os.path.exists(meta_path) else f"{meta_path} does not exist"

  def examples(self, data_dir: str, split: str, *, max_length: int, name: str = DEFAULT_NAME) -> Examples:
    arrays, path, vocab_size = self._read(data_dir, split, max_length, name)
    count, length = arrays["inputs"].shape
    tf = import_tf()
    ds = tf.data.Dataset.from_tensor_slices(arrays)
    if max_length > length:
      pad = [[0, max_length - length]]
      ds = ds.map(lambda ex: {"inputs": tf.pad(ex["inputs"], pad), "positions": ex["positions"],
                              "targets": ex["targets"]}, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return Examples(ds, count, 0, path, vocab_size=vocab_size)

  def array_examples(self, data_dir: str, split: str, *, max_length: int, name: str = DEFAULT_NAME) -> Examples:
    arrays, path, vocab_size = self._read(data_dir, split, max_length, name)
    count, length = arrays["inputs"].shape
    arrays = dict(arrays, inputs=np.pad(arrays["inputs"], [(0, 0), (0, max_length - length)]))
    return Examples(None, count, 0, path, vocab_size=vocab_size, arrays=arrays)

  def _read(self, data_dir: str, split: str, max_length: int, name: str) -> tuple[dict[str, np.ndarray], str, int]:
    """(arrays inputs / positions / targets, path, vocabulary size) of one split, checked."""
    check_name(self.name, name, "data.options.name")
    if split not in SPLIT_FILES:
      raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLIT_FILES)}")
    out_dir, paths, meta_path = self._paths(data_dir, name)
    path = paths[split]
    if not os.path.exists(meta_path):
      fix = self.prepare_command(data_dir) if name == DEFAULT_NAME else (
          f"{self.prepare_command(data_dir, name=name)}  (with the options of the variant {name!r}, e.g. "
          f"--protocol <the protocol that uses it>)")
      raise MissingDataError(f"{self.name} data not found: {meta_path} does not exist (the metadata of "
                             f"{os.path.basename(path)}, written last by a finished prepare).\n"
                             f"Generate it with:\n  {fix}")
    meta = read_meta(meta_path, f"delete it and the {self.name}-{name}_*.npz files beside it and prepare again")
    try:
      command = self.prepare_command(data_dir, **meta["options"])
      vocab_size, length = int(meta["vocab_size"]), int(meta["length"])
      count, queries = int(meta["examples"][split]), int(meta["queries"][split])
    except (KeyError, TypeError, ValueError):
      raise DataError(f"{meta_path}: not the metadata of an lra-bench {self.name} prepare; delete it and the "
                      f"{self.name}-{name}_*.npz files beside it and prepare again") from None
    regenerate = (f"regenerate it with: {command} (a prepare with the same options finds the damaged file and "
                  "generates the data again)")
    if not os.path.exists(path):
      raise MissingDataError(f"{self.name} data not found: {path} does not exist.\nGenerate it with:\n  {command}")
    problem = checksums.checksum_problem(path, meta.get(checksums.KEY))
    if problem:
      raise DataError(f"{path}: {problem}; {regenerate}")
    arrays = _load(path, regenerate)
    inputs, positions, targets = arrays["inputs"], arrays["positions"], arrays["targets"]
    if inputs.shape != (count, length) or positions.shape != (count, queries) or targets.shape != positions.shape:
      raise DataError(f"{path}: arrays inputs {inputs.shape}, positions {positions.shape}, targets "
                      f"{targets.shape}, but {meta_path} promises {count} examples of {length} tokens and "
                      f"{queries} queries; {regenerate}")
    if count and (inputs.min() < 1 or inputs.max() >= vocab_size or positions.min() < 0 or
                  positions.max() >= length or targets.min() < IGNORE or targets.max() >= vocab_size or
                  np.any(targets == 0)):
      raise DataError(f"{path}: token ids outside 1..{vocab_size - 1}, positions outside 0..{length - 1} or "
                      f"targets outside -1, 1..{vocab_size - 1}; {regenerate}")
    if max_length < length:
      raise DataError(f"{self.name}: data.max_length {max_length} is shorter than the generated sequences of "
                      f"{path} ({length} tokens); set data.max_length >= {length} (a recall sequence is never "
                      f"truncated: that would cut its queries)")
    return {"inputs": inputs, "positions": positions, "targets": targets}, path, vocab_size


def _file_problem(path: str, meta: dict) -> str | None:
  """Why a split file cannot be kept by a prepare (missing, damaged), or None. Metadata written before
  checksums were kept: the file must at least load (``_load``)."""
  if not os.path.exists(path):
    return "missing"
  if isinstance(meta.get(checksums.KEY), dict):
    return checksums.checksum_problem(path, meta[checksums.KEY])
  try:
    _load(path, "")
  except DataError as err:
    return str(err).split(": ", 1)[-1].rstrip("; ")
  return None


def _load(path: str, fix: str) -> dict[str, np.ndarray]:
  try:
    with np.load(path, allow_pickle=False) as data:
      arrays = {key: data[key] for key in ("inputs", "positions", "targets")}
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
    raise DataError(f"{path}: unreadable recall data ({type(err).__name__}: {err}); {fix}") from None
  for key, value in arrays.items():
    if value.ndim != 2 or not np.issubdtype(value.dtype, np.integer):
      raise DataError(f"{path}: array {key!r} is {value.dtype}{list(value.shape)}, expected a 2-D integer "
                      f"array; {fix}")
  return {key: value.astype(np.int32, copy=False) for key, value in arrays.items()}


@register_task
class MQAR(_RecallTask):
  """Zoology's multi-query associative recall; defaults: the Zoology paper's Figure 2 at length 64."""

  name = "mqar"
  vocab_size = 8192 + 1
  num_classes = vocab_size
  max_length = 64
  chance_accuracy = 1 / (8192 - 8192 // 2)   # a uniform guess among the 4096 values
  unique_within_split = False
  key_array = "inputs"

  def prepare(self, data_dir: str, *, name: str = DEFAULT_NAME, num_train: int = 100_000, num_val: int = 3_000,
              num_test: int = 3_000, seed: int = 0, vocab_size: int = 8192, seq_len: int = 64,
              num_kv_pairs: int = 4, power_a: float = 0.01, random_non_queries: bool = False) -> str:
    """Generates ``<data_dir>/recall/mqar-<name>_{train,val,test}.npz`` (idempotent, atomic)."""
    options = self._common(name, num_train, num_val, num_test, seed)
    vocab_size, seq_len, num_kv_pairs = (_check_int(self.name, option, value) for option, value in
                                         (("vocab_size", vocab_size), ("seq_len", seq_len),
                                          ("num_kv_pairs", num_kv_pairs)))
    if seq_len % 2:
      raise DataError(f"data prepare mqar: --seq_len is {seq_len}; it must be even (Zoology's assert "
                      "input_seq_len % 2 == 0)")
    if vocab_size <= seq_len:
      raise DataError(f"data prepare mqar: --vocab_size {vocab_size} must be greater than --seq_len {seq_len} "
                      "(Zoology's assert vocab_size > input_seq_len)")
    if 4 * num_kv_pairs > seq_len:
      raise DataError(f"data prepare mqar: --num_kv_pairs {num_kv_pairs} needs --seq_len >= 4 * num_kv_pairs "
                      f"= {4 * num_kv_pairs}, got {seq_len} (the pairs and a query slot per key)")
    if isinstance(power_a, bool) or not isinstance(power_a, (int, float, np.integer, np.floating)) or \
        not math.isfinite(power_a) or power_a <= 0:
      raise DataError(f"data prepare mqar: --power_a must be a finite number > 0, got {power_a!r}")
    if not isinstance(random_non_queries, (bool, np.bool_)):
      raise DataError(f"data prepare mqar: --random_non_queries must be true or false, got "
                      f"{random_non_queries!r}")
    options.update(vocab_size=vocab_size, seq_len=seq_len, num_kv_pairs=num_kv_pairs, power_a=float(power_a),
                   random_non_queries=bool(random_non_queries))
    return self._prepare(data_dir, options)

  def _generate(self, rng, n, options):
    return generate_mqar(rng, n, vocab_size=options["vocab_size"], seq_len=options["seq_len"],
                         num_kv_pairs=options["num_kv_pairs"], power_a=options["power_a"],
                         random_non_queries=options["random_non_queries"])

  def _layout(self, drawn, split, options):
    return {**drawn, "num_kv_pairs": np.full(len(drawn["inputs"]), options["num_kv_pairs"], np.int64)}

  def _vocab_size(self, options):
    return options["vocab_size"] + 1


class _SafariTask(_RecallTask):
  """safari's single-query tasks: whole sequences, labels at every next token (training, by default) or
  at the answer alone (validation, test)."""

  unique_within_split = True
  key_array = "sequences"

  def _check_sizes(self, vocab_size: int, seq_len: int) -> None:
    raise NotImplementedError

  def _prepare_safari(self, data_dir, name, num_train, num_val, num_test, seed, vocab_size, seq_len,
                      train_targets) -> str:
    options = self._common(name, num_train, num_val, num_test, seed)
    vocab_size, seq_len = (_check_int(self.name, option, value) for option, value in
                           (("vocab_size", vocab_size), ("seq_len", seq_len)))
    self._check_sizes(vocab_size, seq_len)
    options.update(vocab_size=vocab_size, seq_len=seq_len,
                   train_targets=_check_choice(self.name, "train_targets", train_targets, TRAIN_TARGETS))
    return self._prepare(data_dir, options)

  def _layout(self, drawn, split, options):
    return lm_layout(drawn["sequences"], options["train_targets"] if split == "train" else "last")

  def _vocab_size(self, options):
    return options["vocab_size"] + 1


@register_task
class AssocRecall(_SafariTask):
  """safari's (H3 / Hyena) single-query associative recall; defaults: ``configs/dataset/icl_synthetics.yaml``."""

  name = "assoc_recall"
  vocab_size = 20 + 1
  num_classes = vocab_size
  max_length = 2 * (40 // 2) + 2   # 42: the pairs, "=>" and the query key
  chance_accuracy = 1 / 9          # a uniform guess among the 9 values

  def prepare(self, data_dir: str, *, name: str = DEFAULT_NAME, num_train: int = 5_000, num_val: int = 500,
              num_test: int = 500, seed: int = 0, vocab_size: int = 20, seq_len: int = 40,
              train_targets: str = "all") -> str:
    """Generates ``<data_dir>/recall/assoc_recall-<name>_{train,val,test}.npz`` (idempotent, atomic)."""
    return self._prepare_safari(data_dir, name, num_train, num_val, num_test, seed, vocab_size, seq_len,
                                train_targets)

  def _check_sizes(self, vocab_size: int, seq_len: int) -> None:
    if vocab_size < 4:
      raise DataError(f"data prepare assoc_recall: --vocab_size is {vocab_size}; it must be >= 4 (2 special "
                      "tokens and at least one key and one value)")

  def _generate(self, rng, n, options):
    return {"sequences": generate_assoc_recall(rng, n, vocab_size=options["vocab_size"],
                                               seq_len=options["seq_len"])}


@register_task
class InductionHead(_SafariTask):
  """safari's induction-head task; defaults: ``configs/pipeline/induction_head.yaml``."""

  name = "induction_head"
  vocab_size = 20 + 1
  num_classes = vocab_size
  max_length = 30 + 1              # the tokens and the second trigger
  chance_accuracy = 1 / 18         # a uniform guess among the 18 ordinary tokens

  def prepare(self, data_dir: str, *, name: str = DEFAULT_NAME, num_train: int = 5_000, num_val: int = 500,
              num_test: int = 500, seed: int = 0, vocab_size: int = 20, seq_len: int = 30,
              train_targets: str = "all") -> str:
    """Generates ``<data_dir>/recall/induction_head-<name>_{train,val,test}.npz`` (idempotent, atomic)."""
    return self._prepare_safari(data_dir, name, num_train, num_val, num_test, seed, vocab_size, seq_len,
                                train_targets)

  def _check_sizes(self, vocab_size: int, seq_len: int) -> None:
    if seq_len < 3:
      raise DataError(f"data prepare induction_head: --seq_len is {seq_len}; it must be >= 3 (the trigger is "
                      "drawn from [0, seq_len - 2))")

  def _generate(self, rng, n, options):
    return {"sequences": generate_induction_head(rng, n, vocab_size=options["vocab_size"],
                                                 seq_len=options["seq_len"])}


class _MADTask(_RecallTask):
  """MAD's recall tasks (athms/mad-lab ``mad/data/instances.py``, multi-query form): training labels at
  every next token (MAD's full language-model loss), validation and test labels at the values of keys
  seen before. The metric is MAD's macro accuracy (``metric``; ``lra_bench.training.loop.macro_accuracy``)."""

  unique_within_split = False   # MAD draws its splits without de-duplicating them
  key_array = "sequences"
  metric = "macro"
  default_vocab: int
  default_noise: int
  default_frac: float

  def prepare(self, data_dir: str, *, name: str = DEFAULT_NAME, num_train: int = 12_800, num_val: int = 1_280,
              num_test: int = 1_280, seed: int = 0, vocab_size: int | None = None, seq_len: int = 128,
              noise_vocab_size: int | None = None, frac_noise: float | None = None) -> str:
    """Generates ``<data_dir>/recall/<task>-<name>_{train,val,test}.npz`` (idempotent, atomic)."""
    options = self._common(name, num_train, num_val, num_test, seed)
    vocab_size = self.default_vocab if vocab_size is None else vocab_size
    noise_vocab_size = self.default_noise if noise_vocab_size is None else noise_vocab_size
    frac_noise = self.default_frac if frac_noise is None else frac_noise
    vocab_size, seq_len = (_check_int(self.name, option, value) for option, value in
                           (("vocab_size", vocab_size), ("seq_len", seq_len)))
    noise_vocab_size = check_count(self.name, "noise_vocab_size", noise_vocab_size)
    if seq_len % 2 or seq_len < 4:
      raise DataError(f"data prepare {self.name}: --seq_len is {seq_len}; it must be even and >= 4 (pairs of "
                      "tokens: at least one key-value pair and the final query pair)")
    if vocab_size - noise_vocab_size < 2:
      raise DataError(f"data prepare {self.name}: --vocab_size {vocab_size} leaves {vocab_size - noise_vocab_size} "
                      f"tokens after the {noise_vocab_size} noise tokens; at least 2 are needed (a key and a value)")
    if isinstance(frac_noise, bool) or not isinstance(frac_noise, (int, float, np.integer, np.floating)) or \
        not 0 <= frac_noise < 1:
      raise DataError(f"data prepare {self.name}: --frac_noise must be a number in [0, 1), got {frac_noise!r}")
    if frac_noise > 0 and noise_vocab_size == 0:
      raise DataError(f"data prepare {self.name}: --frac_noise {frac_noise} needs --noise_vocab_size > 0")
    options.update(vocab_size=vocab_size, seq_len=seq_len, noise_vocab_size=noise_vocab_size,
                   frac_noise=float(frac_noise))
    return self._prepare(data_dir, options)

  def _generate(self, rng, n, options):
    return generate_mad_recall(rng, n, vocab_size=options["vocab_size"], seq_len=options["seq_len"],
                               noise_vocab_size=options["noise_vocab_size"], frac_noise=options["frac_noise"])

  def _layout(self, drawn, split, options):
    sequences = drawn["sequences"]
    n, length = sequences.shape
    positions = np.broadcast_to(np.arange(length - 1), (n, length - 1))
    targets = sequences[:, 1:] if split == "train" else drawn["labels"][:, 1:]
    return {"inputs": sequences[:, :-1], "positions": positions, "targets": targets}

  def _vocab_size(self, options):
    return options["vocab_size"] + 1


@register_task
class InContextRecall(_MADTask):
  """MAD's in-context recall; defaults: its baseline (``configs/tasks/in-context-recall.yml``: vocabulary
  16, length 128, 12 800 training sequences, multi-query)."""

  name = "in_context_recall"
  vocab_size = 16 + 1
  num_classes = vocab_size
  max_length = 128 - 1
  chance_accuracy = 1 / 8          # a uniform guess among the 8 values
  default_vocab, default_noise, default_frac = 16, 0, 0.0


@register_task
class NoisyInContextRecall(_MADTask):
  """MAD's noisy in-context recall; defaults: its baseline (``configs/tasks/noisy-in-context-recall.yml``:
  vocabulary 32 of which 16 noise tokens, noise fraction 0.2, length 128, 12 800 training sequences)."""

  name = "noisy_in_context_recall"
  vocab_size = 32 + 1
  num_classes = vocab_size
  max_length = 128 - 1
  chance_accuracy = 1 / 8
  default_vocab, default_noise, default_frac = 32, 16, 0.2
