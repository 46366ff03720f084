"""MAD's recall tasks (in_context_recall, noisy_in_context_recall) and the macro accuracy MAD reports: the
generator's construction against a per-sequence reading of MAD's rules, its statistics, the layouts of the
splits, bad options, the macro metric (torchmetrics' rule, counted over the whole split), the per-class
counts of the eval step, the protocol and the report's cell."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tasks
from lra_bench.experiments import results
from lra_bench.report import recall as recall_report
from lra_bench.training import config as config_lib
from lra_bench.training import loop, objectives, steps
from tasks import recall
from tasks.base import IGNORE, DataError


def _reference_labels(seq: np.ndarray, plain: int) -> np.ndarray:
  """MAD's test labels of one sequence, read slot by slot: the value of a key-value slot whose key was
  shown in an earlier key-value slot (noise slots are neither), and the final slot's value."""
  labels = np.full(len(seq), IGNORE)
  seen = set()
  for i in range(0, len(seq) - 2, 2):
    key, value = int(seq[i]), int(seq[i + 1])
    if key >= plain:   # a noise slot: two noise tokens
      continue
    if key in seen:
      labels[i + 1] = value
    seen.add(key)
  labels[-1] = seq[-1]
  return labels


@pytest.mark.parametrize("vocab,noise,frac", [(16, 0, 0.0), (32, 16, 0.2), (48, 16, 0.6), (9, 3, 0.5)])
def test_construction_follows_mads_rules(vocab, noise, frac):
  out = recall.generate_mad_recall(np.random.default_rng(1), 300, vocab_size=vocab, seq_len=64,
                                   noise_vocab_size=noise, frac_noise=frac)
  seq, labels = out["sequences"], out["labels"]
  ids = recall.mad_vocab(vocab, noise)
  keys_n, plain = ids["keys"], ids["plain"]
  assert seq.shape == labels.shape == (300, 64)
  for row, lab in zip(seq, labels):
    np.testing.assert_array_equal(lab, _reference_labels(row, plain))
    kv, mapping = [], {}
    for i in range(0, 64, 2):
      key, value = int(row[i]), int(row[i + 1])
      if key >= plain:                                   # noise: both tokens from the noise vocabulary
        assert plain <= value < vocab and i < 62
        continue
      assert 0 <= key < keys_n and keys_n <= value < plain
      assert mapping.setdefault(key, value) == value     # a key's value is fixed within the sequence
      kv.append(key)
    assert len(kv) >= 2                                  # at least one context pair, and the final query
    assert kv[-1] in kv[:-1]                             # the final slot repeats a key of the context
    if noise == 0:
      assert row.max() < plain


def test_statistics_of_the_baseline():
  out = recall.generate_mad_recall(np.random.default_rng(0), 4000, vocab_size=16, seq_len=128)
  labelled = (out["labels"][:, 1:] != IGNORE).sum(1)
  # 63 context slots over 8 keys: all but the first showing of each key (≈ 8) are labelled, plus the query
  assert labelled.mean() == pytest.approx(56.0, abs=0.1)
  keys = out["sequences"][:, 0:126:2]
  assert np.bincount(keys.ravel(), minlength=8) / keys.size == pytest.approx(np.full(8, 1 / 8), abs=0.005)
  # the query key is uniform over the distinct keys shown (here almost always all 8)
  query = out["sequences"][:, -2]
  assert np.bincount(query, minlength=8) / len(query) == pytest.approx(np.full(8, 1 / 8), abs=0.02)


def test_noise_fraction_and_the_guaranteed_pair():
  out = recall.generate_mad_recall(np.random.default_rng(0), 3000, vocab_size=32, seq_len=128,
                                   noise_vocab_size=16, frac_noise=0.2)
  noise_slots = out["sequences"][:, 0:126:2] >= 16
  assert noise_slots.mean() == pytest.approx(0.2 * 62 / 63, abs=0.005)   # one slot per row is kept a pair
  heavy = recall.generate_mad_recall(np.random.default_rng(0), 2000, vocab_size=32, seq_len=8,
                                     noise_vocab_size=16, frac_noise=0.99)
  assert ((heavy["sequences"][:, 0:6:2] < 16).sum(1) >= 1).all()         # MAD's generator crashed here


def test_the_splits_layouts(tmp_path):
  task = tasks.get_task("noisy_in_context_recall")
  task.prepare(str(tmp_path), num_train=40, num_val=20, num_test=20, seq_len=32)
  train = dict(np.load(tmp_path / "recall" / "noisy_in_context_recall-default_train.npz"))
  test = dict(np.load(tmp_path / "recall" / "noisy_in_context_recall-default_test.npz"))
  for split in (train, test):
    assert split["inputs"].shape == split["positions"].shape == split["targets"].shape == (split["inputs"].shape[0], 31)
    np.testing.assert_array_equal(split["positions"][0], np.arange(31))
    assert split["inputs"].min() >= 1 and split["inputs"].max() <= 32      # ids + 1: 0 stays padding
  np.testing.assert_array_equal(train["targets"][:, :-1], train["inputs"][:, 1:])  # every next token
  labelled = test["targets"] != IGNORE
  assert labelled[:, -1].all() and 0 < labelled.mean() < 0.5
  assert (test["targets"][labelled] >= 9).all() and (test["targets"][labelled] <= 16).all()  # values only
  assert not np.isin(_rows(test["inputs"]), _rows(train["inputs"])).any()
  meta = json.loads((tmp_path / "recall" / "noisy_in_context_recall-default.json").read_text())
  assert meta["vocab_size"] == 33 and meta["options"]["frac_noise"] == 0.2 and meta["length"] == 31


def _rows(a):
  return np.array([row.tobytes() for row in a])


@pytest.mark.parametrize("options,match", [
    ({"seq_len": 7}, "even"), ({"seq_len": 2}, ">= 4"), ({"vocab_size": 17, "noise_vocab_size": 16}, "at least 2"),
    ({"frac_noise": 1.0}, r"\[0, 1\)"), ({"frac_noise": 0.3, "noise_vocab_size": 0}, "noise_vocab_size > 0"),
    ({"noise_vocab_size": -1}, "noise_vocab_size")])
def test_bad_options_are_named(tmp_path, options, match):
  with pytest.raises(DataError, match=match):
    tasks.get_task("noisy_in_context_recall").prepare(str(tmp_path), num_train=4, num_val=2, num_test=2, **options)
  assert not os.path.exists(tmp_path / "recall" / "noisy_in_context_recall-default.json")


# ----------------------------------------------------------------------------------------------------
# the macro accuracy


def _torchmetrics_macro(targets, preds, num_classes):
  """torchmetrics' MulticlassAccuracy(average="macro") written out: per class tp / (tp + fn), averaged over
  the classes with tp + fp + fn > 0 (a class with no label scores 0 when it was predicted)."""
  scores, weights = [], []
  for c in range(num_classes):
    tp = np.sum((preds == c) & (targets == c))
    fp = np.sum((preds == c) & (targets != c))
    fn = np.sum((preds != c) & (targets == c))
    scores.append(tp / (tp + fn) if tp + fn else 0.0)
    weights.append(float(tp + fp + fn > 0))
  return float(np.dot(scores, weights) / sum(weights))


def _counts(targets, preds, num_classes):
  one = lambda x: np.eye(num_classes)[x]
  return {"class_correct": (one(targets) * one(preds)).sum(0), "class_labels": one(targets).sum(0),
          "class_predicted": one(preds).sum(0)}


def test_macro_accuracy_is_torchmetrics_rule():
  # torchmetrics' docstring example: macro 0.8333 where micro is 0.75
  c = _counts(np.array([2, 1, 0, 0]), np.array([2, 1, 0, 1]), 3)
  assert loop.macro_accuracy(c["class_correct"], c["class_labels"], c["class_predicted"]) == pytest.approx(5 / 6)
  # a class predicted but never a label stays in the mean with 0
  c = _counts(np.array([1, 1]), np.array([1, 2]), 4)
  assert loop.macro_accuracy(c["class_correct"], c["class_labels"], c["class_predicted"]) == pytest.approx(0.25)
  rng = np.random.default_rng(0)
  for _ in range(20):
    targets, preds = rng.integers(3, 9, 200), rng.integers(0, 12, 200)
    c = _counts(targets, preds, 12)
    assert loop.macro_accuracy(c["class_correct"], c["class_labels"], c["class_predicted"]) == \
        pytest.approx(_torchmetrics_macro(targets, preds, 12))


def test_evaluate_takes_the_macro_over_the_whole_split():
  """Per-class counts are summed over the batches before the mean (the mean of per-batch macros differs)."""
  rng = np.random.default_rng(1)
  batches = [(rng.integers(0, 4, 30), rng.integers(0, 4, 30)) for _ in range(3)] + [(np.array([3]), np.array([0]))]

  def eval_fn(params, model_state, batch):
    targets, preds = batches[int(batch["index"][0])]
    correct = float(np.sum(targets == preds))
    return {"loss": 0.0, "correct": correct, "count": float(len(targets)), "examples": 1.0,
            **_counts(targets, preds, 4)}

  feed = [{"index": np.array([i]), "targets": np.array([0])} for i in range(len(batches))]
  out = loop.evaluate(eval_fn, None, None, feed, batch_size=1)
  targets = np.concatenate([t for t, _ in batches])
  preds = np.concatenate([p for _, p in batches])
  assert out["metric"] == "macro"
  assert out["accuracy"] == pytest.approx(_torchmetrics_macro(targets, preds, 4))
  assert out["accuracy_micro"] == pytest.approx(np.mean(targets == preds))


class _Fixed:
  """A model whose logits are given: ``steps.eval_step``'s per-class counts read only them."""

  def __init__(self, logits):
    self.logits = logits

  def apply(self, variables, batch, deterministic):
    return self.logits


def test_eval_step_counts_per_class_over_labelled_slots_of_real_examples():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(3, 5, 6)).astype(np.float32)
  targets = rng.integers(1, 6, (3, 5))
  targets[0, :2] = IGNORE
  weights = np.array([1.0, 1.0, 0.0], np.float32)          # the third example is padding
  batch = {"targets": targets, "weights": weights}
  terms = lambda outputs, batch: objectives.per_label(outputs, batch["targets"])
  sums = steps.eval_step({}, {}, batch, model=_Fixed(logits), terms=terms, num_classes=6)
  keep = (targets >= 0) & (weights[:, None] > 0)
  expected = _counts(targets[keep], logits.argmax(-1)[keep], 6)
  for key, value in expected.items():
    np.testing.assert_allclose(np.asarray(sums[key]), value)
  assert float(sums["count"]) == keep.sum()
  assert "class_labels" not in steps.eval_step({}, {}, batch, model=_Fixed(logits), terms=terms)


# ----------------------------------------------------------------------------------------------------
# protocol and report


def test_the_mad_protocol():
  for task, vocab, noise in (("in_context_recall", 16, 0), ("noisy_in_context_recall", 32, 16)):
    c = config_lib.load_config("mad", task, attention="vanilla")
    assert (c.data.prepare.vocab_size, c.data.prepare.noise_vocab_size, c.data.max_length) == (vocab, noise, 127)
    assert (c.batch_size, c.num_train_steps, c.model.emb_dim, c.model.num_heads, c.model.num_layers) == \
        (128, 20_000, 128, 16, 2)
    assert c.optimizer.learning_rate == 5e-4 and c.optimizer.weight_decay == 0.0 and c.model.attention_kwargs.causal
  from configs import mad
  assert len(mad.sweep("in_context_recall")["lr"]) * len(mad.sweep("in_context_recall")["wd"]) == 6
  assert tasks.get_task("in_context_recall").metric == "macro" and tasks.get_task("mqar").metric == "accuracy"


def test_report_gives_macro_cells_no_interval_and_says_so(tmp_path):
  config = config_lib.load_config("mad", "in_context_recall", attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.9, test_examples=1280, test_labels=71000, train_steps=10,
                                metric="macro", test_accuracy_micro=0.91)
  report = recall_report.recall_tables(recall_report.recall_frame([record]), "mad",
                                       recall_report.load_reference(None))
  row = report.tables[0].rows[0]
  assert row[0] == "vanilla" and row[1] == "90.0 (1 run)"          # a value, no Wilson interval
  assert any("Macro accuracy" in note for note in report.tables[0].footnotes)


def test_a_setting_without_kv_pairs_shows_its_value(tmp_path):
  """assoc_recall has no kv axis: its cell was once looked up with kv == NaN and printed "—"."""
  config = config_lib.load_config("seq_icl", "assoc_recall", attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.5, test_examples=500, test_labels=500, train_steps=10)
  report = recall_report.recall_tables(recall_report.recall_frame([record]), "seq_icl",
                                       recall_report.load_reference(None))
  assert report.tables[0].rows[0][1].startswith("50.0 [")
