"""The recall tasks (mqar, assoc_recall, induction_head): the generators' rules and statistics against the
originals' (docs/generators.md §3), the token shift, the next-token layouts, splits, files and reading."""

import json
import os

import numpy as np
import pytest

import tasks
from tasks import recall
from tasks.base import PREPARE_RANGES, DataError, MissingDataError
from tests.task_batches import dataset

V, L, KV = 8192, 64, 4
SMALL = dict(num_train=300, num_val=50, num_test=50)


def mqar(n, seed=0, **options):
  return recall.generate_mqar(np.random.default_rng(seed), n, **options)


def rows_of(array):
  return [row.tobytes() for row in np.ascontiguousarray(array)]


def load(root, task, split, name="default"):
  short = recall.SPLIT_FILES[split]
  with np.load(os.path.join(root, "recall", f"{task}-{name}_{short}.npz")) as data:
    return {key: data[key] for key in data.files}


# ----------------------------------------------------------------------------------------------------
# MQAR (Zoology, zoology/data/multiquery_ar.py)


def test_mqar_keys_and_values_are_distinct_draws_from_their_halves():
  out = mqar(3000)
  keys, values = out["inputs"][:, 0:2 * KV:2], out["inputs"][:, 1:2 * KV:2]
  assert out["inputs"].shape == (3000, L)
  assert keys.min() >= 1 and keys.max() < V // 2          # [1, V/2): 0 is never a key
  assert values.min() >= V // 2 and values.max() < V      # [V/2, V)
  for half in (keys, values):
    assert (np.diff(np.sort(half, axis=1), axis=1) > 0).all()   # distinct within an example
  # drawn uniformly: both halves of each range are used about equally
  assert abs((keys < V // 4).mean() - 0.5) < 0.03 and abs((values < 3 * V // 4).mean() - 0.5) < 0.03


def test_mqar_queries_each_key_once_at_its_gap_and_labels_its_value():
  out = mqar(2000)
  inputs, positions, targets = out["inputs"], out["positions"], out["targets"]
  keys, values = inputs[:, 0:2 * KV:2], inputs[:, 1:2 * KV:2]
  rows = np.arange(len(inputs))[:, None]
  assert positions.shape == targets.shape == (2000, KV)
  gaps, odd = np.divmod(positions - 2 * KV, 2)
  assert (odd == 0).all() and gaps.min() >= 0 and gaps.max() < (L - 2 * KV) // 2   # 2kv + 2g, g < space
  assert (np.diff(np.sort(positions, axis=1), axis=1) > 0).all()
  assert (inputs[rows, positions] == keys).all()           # query i asks key i of the context
  np.testing.assert_array_equal(targets, values)           # ... and its label is key i's value
  tail = inputs[:, 2 * KV:]
  assert (np.sort(np.where(tail != 0, tail, V), axis=1)[:, :KV] == np.sort(keys, axis=1)).all()
  assert ((tail != 0).sum(axis=1) == KV).all()             # exactly one query per key, nothing else
  assert (inputs[rows, positions + 1] == 0).all()          # the token after a query is a filler
  # the label is the value that follows the key in the context, read back by lookup
  for b in range(50):
    context = dict(zip(inputs[b, 0:2 * KV:2].tolist(), inputs[b, 1:2 * KV:2].tolist()))
    assert [context[inputs[b, p]] for p in positions[b]] == targets[b].tolist()


def test_mqar_gap_distribution_is_the_power_law_drawn_in_key_order():
  n = 20_000
  out = mqar(n, seed=1)
  gaps = (out["positions"] - 2 * KV) // 2
  space = (L - 2 * KV) // 2
  p = recall.power_law(space, 0.01)
  assert p[0] == pytest.approx(1 / sum(j ** -0.99 for j in range(1, space + 1)))
  assert abs(p[0] - 0.25) < 0.01                            # about 1/H_28 at a = 0.01
  tol = 5 * np.sqrt(p[0] * (1 - p[0]) / n)
  first = np.bincount(gaps[:, 0], minlength=space) / n     # key 1's gap: p itself
  assert np.abs(first - p).max() < tol
  # key 2's gap: p renormalised without key 1's (sampling without replacement, in order)
  second = sum(p[j] * p[0] / (1 - p[j]) for j in range(1, space))
  assert abs((gaps[:, 1] == 0).mean() - second) < tol
  assert (np.diff(np.sort(gaps, axis=1), axis=1) > 0).all()   # without replacement
  uniform = (mqar(n, seed=2, power_a=1.0)["positions"][:, 0] == 2 * KV).mean()
  assert abs(uniform - 1 / space) < 0.01                   # a = 1: uniform gaps


def test_ordered_sample_has_the_law_of_numpys_choice_without_replacement():
  """Zoology draws the gaps with ``np.random.choice(space, kv, replace=False, p=p)``; the Gumbel-top-k
  draw must give the same law of the ordered tuple (compared on a small space, every tuple counted)."""
  p, n = np.array([0.5, 0.25, 0.15, 0.1]), 20_000
  legacy = np.random.RandomState(0)
  theirs = np.array([legacy.choice(4, 3, replace=False, p=p) for _ in range(n)])
  ours = recall.ordered_sample(np.random.default_rng(0), n, p, 3)
  codes = lambda rows: np.bincount(rows @ np.array([16, 4, 1]), minlength=64) / n
  assert np.abs(codes(theirs) - codes(ours)).max() < 0.015   # 24 tuples; the largest has P = 0.167


def test_mqar_random_non_queries():
  plain, noisy = mqar(2000, seed=3), mqar(2000, seed=3, random_non_queries=True)
  # the fillers are drawn last: the same seed gives the same keys, values and queries either way
  np.testing.assert_array_equal(plain["positions"], noisy["positions"])
  np.testing.assert_array_equal(plain["targets"], noisy["targets"])
  fill = np.ones((2000, L), bool)
  fill[:, :2 * KV] = False
  np.put_along_axis(fill, plain["positions"], False, axis=1)
  np.testing.assert_array_equal(plain["inputs"][~fill], noisy["inputs"][~fill])
  assert (plain["inputs"][fill] == 0).all() and (plain["inputs"][~fill] != 0).all()   # off: fillers are 0
  fillers = noisy["inputs"][fill]
  assert fillers.min() >= 0 and fillers.max() < V           # on: uniform draws from [0, V), keys' and values'
  assert abs(fillers.mean() / V - 0.5) < 0.02 and (fillers == 0).mean() < 0.01
  assert abs((fillers < V // 2).mean() - 0.5) < 0.02
  assert len(np.unique(fillers)) > 0.95 * V * (1 - np.exp(-len(fillers) / V))


def test_mqar_answer_is_not_readable_after_its_position():
  """Leakage: the model reads inputs[:p + 1] to predict the target at p. The value does stand in the
  context (that is the task); it must never be the next input (trivially copyable by a shifted model)."""
  plain, noisy = mqar(3000, seed=4), mqar(3000, seed=4, random_non_queries=True)
  rows = np.arange(3000)[:, None]
  assert not (plain["inputs"][rows, plain["positions"] + 1] == plain["targets"]).any()
  assert not np.isin(plain["targets"], plain["inputs"][:, 2 * KV:]).any()   # no value after the context
  # random fillers may equal the value only by chance (1/V each), as in the original
  assert (noisy["inputs"][rows, noisy["positions"] + 1] == noisy["targets"]).mean() < 0.002


def test_distinct_integers_is_uniform_over_ordered_samples():
  out = recall.distinct_integers(np.random.default_rng(0), 60_000, 3, 6, 2)   # 6 ordered pairs of {3, 4, 5}
  pairs, counts = np.unique(out, axis=0, return_counts=True)
  assert len(pairs) == 6 and (pairs[:, 0] != pairs[:, 1]).all()
  assert np.abs(counts / 60_000 - 1 / 6).max() < 0.01


# ----------------------------------------------------------------------------------------------------
# Associative recall and induction head (safari, src/dataloaders/synthetics.py)


def test_safari_ids_follow_its_string_sorted_vocabulary():
  # safari's Vocab(18) sorts "0".."17", "." and "=>" as strings: "." "0" "1" "10" .. "17" "2" .. "9" "=>"
  words = sorted([str(i) for i in range(18)] + [".", "=>"])
  ids = recall.safari_tokens(20)
  assert words.index(".") == ids["noop"] == 0 and words.index("=>") == ids["copy_prefix"] == 19
  keys = sorted(str(i) for i in range(18))[:9]             # safari: non_special_vocab[:n // 2]
  assert [words.index(k) for k in keys] == list(range(1, ids["num_keys"] + 1))


def test_assoc_recall_construction():
  seq = recall.generate_assoc_recall(np.random.default_rng(0), 4000)
  assert seq.shape == (4000, 43)                           # 20 pairs, "=>", key, value
  keys, values = seq[:, 0:40:2], seq[:, 1:40:2]
  assert keys.min() >= 1 and keys.max() <= 9 and values.min() >= 10 and values.max() <= 18
  assert (seq[:, 40] == 19).all() and not (seq[:, :40] == 19).any() and not (seq == 0).any()   # no "."
  for b in range(200):                                     # one value per key within an example
    pairs = set(zip(keys[b].tolist(), values[b].tolist()))
    assert len({k for k, _ in pairs}) == len(pairs)
    assert (seq[b, 41], seq[b, 42]) in pairs               # the query key occurred; its value answers
  # the query is uniform over the distinct keys present (not over the 20 slots): compare how often the
  # query key occurs with its expectation under each rule
  occurs = (keys == seq[:, 41:42]).sum(axis=1)
  distinct = np.array([len(set(row)) for row in keys.tolist()])
  assert abs(occurs.mean() - (20 / distinct).mean()) < 0.1
  # values are drawn per key with replacement: two keys may share a value
  assert any(len(set(values[b].tolist())) < len(set(keys[b].tolist())) for b in range(200))


def test_induction_head_construction():
  seq = recall.generate_induction_head(np.random.default_rng(0), 4000)
  assert seq.shape == (4000, 32)                           # 30 tokens, "=>", the copied token
  trigger = seq[:, :30] == 19
  assert (trigger.sum(axis=1) == 1).all() and (seq[:, 30] == 19).all()
  where = trigger.argmax(axis=1)
  assert where.min() == 0 and where.max() == 27            # p uniform in [0, seq_len - 2)
  assert abs(np.bincount(where).std() / np.bincount(where).mean()) < 0.25
  np.testing.assert_array_equal(seq[:, 31], seq[np.arange(4000), where + 1])
  ordinary = seq[:, :30][~trigger]
  assert ordinary.min() == 1 and ordinary.max() == 18 and not (seq == 0).any()


@pytest.mark.parametrize("layout", ["all", "last"])
def test_lm_layout(layout):
  seq = np.arange(12).reshape(2, 6)
  out = recall.lm_layout(seq, layout)
  np.testing.assert_array_equal(out["inputs"], seq[:, :5])
  if layout == "all":                                      # safari's training loss: every next token
    np.testing.assert_array_equal(out["positions"][0], np.arange(5))
    np.testing.assert_array_equal(out["targets"], seq[:, 1:])
  else:                                                    # its test metric: the answer only
    np.testing.assert_array_equal(out["positions"], [[4], [4]])
    np.testing.assert_array_equal(out["targets"], seq[:, 5:])


# ----------------------------------------------------------------------------------------------------
# prepare: files, shift, layouts, splits, determinism, options


def test_registered_tasks():
  for name, vocab, length, chance in (("mqar", 8193, 64, 1 / 4096), ("assoc_recall", 21, 42, 1 / 9),
                                      ("induction_head", 21, 31, 1 / 18)):
    task = tasks.get_task(name)
    assert (task.objective, task.dual_input, task.vocab_size, task.num_classes) == ("next_token", False, vocab,
                                                                                    vocab)
    assert task.max_length == length and task.chance_accuracy == pytest.approx(chance)
    assert {"name", "num_train", "num_val", "num_test", "seed", "vocab_size", "seq_len"} <= \
        set(task.prepare_options())
  assert {"vocab_size", "seq_len", "num_kv_pairs"} <= set(PREPARE_RANGES)


def test_mqar_files_are_shifted_and_complete(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("mqar")
  task.prepare(root, seed=3, **SMALL)
  meta = json.load(open(os.path.join(root, "recall", "mqar-default.json")))
  assert meta["vocab_size"] == V + 1 and meta["length"] == L and meta["queries"]["train"] == KV
  assert meta["options"] == dict(name="default", seed=3, vocab_size=V, seq_len=L, num_kv_pairs=KV, power_a=0.01,
                                 random_non_queries=False, **SMALL)
  train = load(root, "mqar", "train")
  assert all(a.dtype == np.int32 for a in train.values()) and train["inputs"].shape == (300, L)
  raw = recall.generate_mqar(np.random.default_rng([3, 0]), 300)
  np.testing.assert_array_equal(train["inputs"], raw["inputs"] + 1)   # t -> t + 1
  np.testing.assert_array_equal(train["targets"], raw["targets"] + 1)
  np.testing.assert_array_equal(train["positions"], raw["positions"])
  assert train["inputs"].min() == 1                                   # the filler 0 is id 1; 0 is padding
  keys, values = train["inputs"][:, 0:2 * KV:2], train["inputs"][:, 1:2 * KV:2]
  assert keys.min() >= 2 and keys.max() <= V // 2 and values.min() >= V // 2 + 1 and values.max() <= V
  assert (train["num_kv_pairs"] == KV).all()


@pytest.mark.parametrize("task_name, length", [("assoc_recall", 42), ("induction_head", 31)])
def test_safari_files_layouts_and_shift(tmp_path, task_name, length):
  root = str(tmp_path)
  task = tasks.get_task(task_name)
  task.prepare(root, **SMALL)
  task.prepare(root, name="last", train_targets="last", **SMALL)
  train, test = load(root, task_name, "train"), load(root, task_name, "test")
  assert train["inputs"].shape == (300, length) and train["inputs"].min() >= 2 and train["inputs"].max() <= 20
  np.testing.assert_array_equal(train["positions"], np.broadcast_to(np.arange(length), (300, length)))
  np.testing.assert_array_equal(train["targets"][:, :-1], train["inputs"][:, 1:])   # full next-token loss
  assert test["positions"].shape == (50, 1) and (test["positions"] == length - 1).all()   # the answer only
  assert (test["inputs"][:, -1] != test["targets"][:, 0]).all()   # the answer is never the last input
  for split in (train, test):   # the answer: the queried key's value / the token after the first trigger
    inputs, answer = split["inputs"], split["targets"][:, -1]
    assert (inputs[:, -1 if task_name == "induction_head" else -2] == 20).all()   # "=>" is 19 + 1
    if task_name == "assoc_recall":
      after_key = inputs[:, 1:-2:2][inputs[:, 0:-2:2] == inputs[:, -1:]]
      counts = (inputs[:, 0:-2:2] == inputs[:, -1:]).sum(axis=1)
      np.testing.assert_array_equal(after_key, np.repeat(answer, counts))
    else:
      first = (inputs[:, :-1] == 20).argmax(axis=1)
      np.testing.assert_array_equal(answer, inputs[np.arange(len(inputs)), first + 1])
  last = load(root, task_name, "train", name="last")
  assert last["positions"].shape == (300, 1) and (last["positions"] == length - 1).all()


@pytest.mark.parametrize("task_name", ["mqar", "assoc_recall", "induction_head"])
def test_prepare_is_deterministic_and_splits_are_disjoint(tmp_path, task_name):
  task = tasks.get_task(task_name)
  for root, seed in (("a", 0), ("b", 0), ("c", 1)):
    task.prepare(str(tmp_path / root), seed=seed, **SMALL)
  splits = {root: [load(str(tmp_path / root), task_name, s) for s in recall.SPLIT_FILES] for root in "abc"}
  for x, y in zip(splits["a"], splits["b"]):
    assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
  assert not any(np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(splits["a"], splits["c"]))
  seen = [set(rows_of(split["inputs"])) for split in splits["a"]]
  assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])   # no example in two splits
  assert [len(s) for s in seen] == [300, 50, 50]


def test_duplicates_are_redrawn_and_too_small_spaces_refused(tmp_path):
  # induction_head with one ordinary token and seq_len 12 has exactly 10 sequences (the trigger position)
  task = tasks.get_task("induction_head")
  task.prepare(str(tmp_path), vocab_size=3, seq_len=12, num_train=5, num_val=3, num_test=2)
  meta = json.load(open(os.path.join(tmp_path, "recall", "induction_head-default.json")))
  splits = [load(str(tmp_path), "induction_head", s)["inputs"] for s in recall.SPLIT_FILES]
  assert len(set().union(*map(rows_of, splits))) == 10     # all ten, each once
  assert sum(meta["duplicates_redrawn"].values()) > 0
  with pytest.raises(DataError, match="too few different sequences"):
    task.prepare(str(tmp_path), name="big", vocab_size=3, seq_len=12, num_train=5, num_val=3, num_test=3)


def test_prepare_is_idempotent_and_refuses_other_options(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("assoc_recall")
  task.prepare(root, **SMALL)
  train = os.path.join(root, "recall", "assoc_recall-default_train.npz")
  mtime = os.path.getmtime(train)
  task.prepare(root, **SMALL)
  assert os.path.getmtime(train) == mtime                  # same options: nothing redone
  with pytest.raises(DataError, match=r"other options \(differing: seq_len.*another --name.*delete"):
    task.prepare(root, seq_len=20, **SMALL)
  task.prepare(root, name="short", seq_len=20, **SMALL)
  assert load(root, "assoc_recall", "train", name="short")["inputs"].shape == (300, 22)
  assert not [f for f in os.listdir(os.path.join(root, "recall")) if f.startswith(".tmp")]
  os.remove(train)                                          # a lost split file is made again
  task.prepare(root, **SMALL)
  assert os.path.exists(train)


@pytest.mark.parametrize("task_name, options, match", [
    ("mqar", dict(seq_len=63, vocab_size=100), "--seq_len is 63; it must be even"),
    ("mqar", dict(seq_len=64, vocab_size=64), "--vocab_size 64 must be greater than --seq_len 64"),
    ("mqar", dict(seq_len=16, vocab_size=100, num_kv_pairs=5), "--num_kv_pairs 5 needs --seq_len >= 4"),
    ("mqar", dict(num_kv_pairs=0), "--num_kv_pairs is 0"),
    ("mqar", dict(power_a=0.0), "--power_a must be a finite number > 0"),
    ("mqar", dict(power_a=float("nan")), "--power_a"),
    ("mqar", dict(power_a="0.01"), "--power_a"),
    ("mqar", dict(random_non_queries="yes"), "--random_non_queries"),
    ("mqar", dict(vocab_size=2), "--vocab_size is 2"),
    ("mqar", dict(seed=-1), "--seed is -1"),
    ("mqar", dict(seed=2**31), "--seed is 2147483648"),
    ("mqar", dict(num_train=0), "--num_train is 0"),
    ("mqar", dict(name="../x"), "--name '../x'"),
    ("assoc_recall", dict(vocab_size=3), "--vocab_size is 3; it must be >= 4"),
    ("assoc_recall", dict(train_targets="some"), "--train_targets is 'some'"),
    ("assoc_recall", dict(seq_len=1), "--seq_len is 1"),
    ("induction_head", dict(seq_len=2), "--seq_len is 2; it must be >= 3"),
    ("induction_head", dict(num_test=1.5), "--num_test must be an integer"),
])
def test_bad_options_are_named(tmp_path, task_name, options, match):
  with pytest.raises(DataError, match=match.replace("(", r"\(").replace("[", r"\[")):
    tasks.get_task(task_name).prepare(str(tmp_path), **{**SMALL, **options})
  assert not os.path.exists(tmp_path / "recall")           # refused before anything is written


# ----------------------------------------------------------------------------------------------------
# examples: tf.data round trip, lengths, missing data


def test_examples_round_trip(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("mqar")
  task.prepare(root, seq_len=32, num_kv_pairs=2, vocab_size=200, **SMALL)
  examples = task.examples(root, "validation", max_length=40)
  assert (examples.num_examples, examples.num_truncated, examples.vocab_size) == (50, 0, 201)
  assert examples.source.endswith("mqar-default_val.npz")
  batch = next(iter(dataset(task, root, "validation", 16, max_length=40).as_numpy_iterator()))
  assert set(batch) == {"inputs", "positions", "targets"}
  assert all(v.dtype == np.int32 for v in batch.values())
  assert batch["inputs"].shape == (16, 40) and batch["positions"].shape == batch["targets"].shape == (16, 2)
  val = load(root, "mqar", "validation")
  np.testing.assert_array_equal(batch["inputs"][:, :32], val["inputs"][:16])
  assert (batch["inputs"][:, 32:] == 0).all()              # padded with 0, after the sequence
  np.testing.assert_array_equal(batch["targets"], val["targets"][:16])
  train = next(iter(dataset(tasks.get_task("mqar"), root, "train", 8, max_length=32, repeat=True)
                    .as_numpy_iterator()))
  assert train["inputs"].shape == (8, 32) and train["inputs"].min() >= 1   # exact length: no padding


def test_examples_refuse_a_shorter_max_length(tmp_path):
  task = tasks.get_task("induction_head")
  task.prepare(str(tmp_path), **SMALL)
  with pytest.raises(DataError, match=r"max_length 30 is shorter .* \(31 tokens\).*never truncated"):
    task.examples(str(tmp_path), "test", max_length=30)


def test_missing_data_names_the_path_and_the_command(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("assoc_recall")
  with pytest.raises(MissingDataError, match="assoc_recall-default.json does not exist") as err:
    task.examples(root, "train", max_length=42)
  assert f"lra-bench data prepare assoc_recall --data_dir={root}" in str(err.value)
  with pytest.raises(MissingDataError, match="--name=other"):
    task.examples(root, "train", max_length=42, name="other")
  task.prepare(root, seq_len=10, **SMALL)
  os.remove(os.path.join(root, "recall", "assoc_recall-default_test.npz"))
  with pytest.raises(MissingDataError, match="assoc_recall-default_test.npz does not exist") as err:
    task.examples(root, "test", max_length=42)
  assert "--seq_len=10" in str(err.value) and "--num_train=300" in str(err.value)


def test_examples_refuse_edited_files(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("mqar")
  task.prepare(root, seq_len=16, num_kv_pairs=2, vocab_size=40, **SMALL)
  path = os.path.join(root, "recall", "mqar-default_test.npz")
  arrays = load(root, "mqar", "test")
  np.savez(path, **{**arrays, "inputs": arrays["inputs"][:10]})
  with pytest.raises(DataError, match="mqar-default_test.npz: damaged: its sha256.*regenerate it with: "
                     "lra-bench data prepare mqar"):
    task.examples(root, "test", max_length=16)
  # data prepared before the checksums were kept: the arrays are still checked against the metadata
  meta_path = os.path.join(root, "recall", "mqar-default.json")
  with open(meta_path) as f:
    meta = json.load(f)
  del meta["sha256"]
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  with pytest.raises(DataError, match="promises 50 examples.*regenerate it with: lra-bench data prepare mqar"):
    task.examples(root, "test", max_length=16)
  np.savez(path, **{**arrays, "inputs": arrays["inputs"] - 1})   # a 0 (padding) inside a sequence
  with pytest.raises(DataError, match="token ids outside 1..40"):
    task.examples(root, "test", max_length=16)


@pytest.mark.parametrize("with_checksums", [True, False])
def test_a_cut_split_file_is_named_when_read_and_made_again_by_prepare(tmp_path, caplog, with_checksums):
  """A split file cut to 100 bytes: reading it names the file and the prepare command (not numpy's
  ``BadZipFile``); that prepare does not call the data "already prepared" but generates it again, byte for
  byte. ``with_checksums=False``: metadata written before the checksums were kept (the file must load)."""
  root = str(tmp_path)
  task = tasks.get_task("mqar")
  options = dict(seq_len=16, num_kv_pairs=2, vocab_size=40, **SMALL)
  task.prepare(root, **options)
  path = os.path.join(root, "recall", "mqar-default_test.npz")
  meta_path = os.path.join(root, "recall", "mqar-default.json")
  with open(meta_path) as f:
    meta = json.load(f)
  assert set(meta["sha256"]) == {f"mqar-default_{s}.npz" for s in ("train", "val", "test")}
  assert meta["sha256"]["mqar-default_test.npz"] == recall.sha256(path)
  if not with_checksums:
    del meta["sha256"]
    with open(meta_path, "w") as f:
      json.dump(meta, f)
  with open(path, "rb") as f:
    whole = f.read()
  with open(path, "r+b") as f:
    f.truncate(100)
  with pytest.raises(DataError) as err:
    task.examples(root, "test", max_length=16)
  assert path in str(err.value) and "lra-bench data prepare mqar" in str(err.value)
  assert "--seq_len=16" in str(err.value)
  with caplog.at_level("INFO"):
    task.prepare(root, **options)
  assert f"{path}: " in caplog.text and "generating the mqar data 'default' again" in caplog.text
  assert "already prepared" not in caplog.text
  with open(path, "rb") as f:
    assert f.read() == whole
  assert task.examples(root, "test", max_length=16).num_examples == 50
  with open(meta_path) as f:
    assert json.load(f)["sha256"]["mqar-default_test.npz"] == recall.sha256(path)


def test_metadata_without_checksums_gets_them_when_the_files_are_whole(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("assoc_recall")
  task.prepare(root, **SMALL)
  meta_path = os.path.join(root, "recall", "assoc_recall-default.json")
  with open(meta_path) as f:
    meta = json.load(f)
  sums = meta.pop("sha256")
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  train = os.path.join(root, "recall", "assoc_recall-default_train.npz")
  mtime = os.path.getmtime(train)
  task.prepare(root, **SMALL)
  assert os.path.getmtime(train) == mtime                  # whole files: kept, not regenerated
  with open(meta_path) as f:
    assert json.load(f)["sha256"] == sums
