"""Tests that catch a wrong number: each compares a measured value with one predicted independently of
the code under test, on a case where the likely bugs give another, also predicted, number.

- every optimizer step moves the parameters as AdamW with the scheduled learning rate of that step (a
  numpy transcription), and an optimizer that skips every other update or ignores the schedule does not;
- evaluation of a padded batch gives the accuracy of the real rows alone;
- a run's ``test_accuracy`` is the test split scored with the best-validation parameters: the
  parameters of each step are set by hand so that validation peaks before the last step and each split
  has its own labels, so test-from-validation and last-parameter numbers are known and different; and
  every field of that run's record holds its value (not only its key);
- the labels read back from disk are the generators' (Pathfinder, ListOps), and ListOps' MED truncates
  where rounding half-to-even would not;
- Newcombe's interval of a difference, with unequal n, through the report's table.
"""

from __future__ import annotations

import csv
import math
import os
import statistics

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tasks
from lra_bench.experiments import cell, results
from lra_bench.report import accuracy
from lra_bench.training import config as config_lib
from lra_bench.training import loop, objectives, optim, steps, xla_stats
from tasks import listops, pathfinder, pathfinder_gen
from tests.conftest import tiny_overrides

def classification_terms(logits, batch):
  """The classification objective's terms (cross-entropy at the label) for the hand-built models below."""
  return objectives.per_label(logits, batch["targets"])


# ----------------------------------------------------------------------------------------------------
# The optimizer: every step, the scheduled learning rate


class LinearLogits(nn.Module):
  """logits = inputs @ W: a model whose cross-entropy gradient numpy computes in one line."""

  num_classes: int = 3

  @nn.compact
  def __call__(self, batch, *, deterministic: bool = True):
    del deterministic
    w = self.param("w", nn.initializers.normal(0.5), (batch["inputs"].shape[-1], self.num_classes))
    return batch["inputs"] @ w


def _adamw_reference(w, x, targets, opt, num_steps: int) -> list[np.ndarray]:
  """float64 AdamW as flax.optim / optax.adamw define it: bias-corrected moments, decoupled weight decay
  scaled by the learning rate, the update of step s (0-based) with learning_rate_schedule(s)."""
  lr = optim.learning_rate_schedule(opt)
  m, v, out = np.zeros_like(w), np.zeros_like(w), []
  onehot = np.eye(w.shape[1])[targets]
  for s in range(num_steps):
    logits = x @ w
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    g = x.T @ (p - onehot) / len(x)
    if opt.grad_clip_norm and opt.grad_clip_norm > 0:
      g = g * min(1.0, opt.grad_clip_norm / np.linalg.norm(g))
    m = opt.b1 * m + (1 - opt.b1) * g
    v = opt.b2 * v + (1 - opt.b2) * g * g
    m_hat, v_hat = m / (1 - opt.b1 ** (s + 1)), v / (1 - opt.b2 ** (s + 1))
    w = w - float(lr(s)) * (m_hat / (np.sqrt(v_hat) + opt.eps) + opt.weight_decay * w)
    out.append(w)
  return out


def _trajectory(tx, opt_config, num_steps: int):
  """(parameters after each of ``num_steps`` real train steps with ``tx``, the float64 AdamW reference)."""
  rng = np.random.default_rng(0)
  batch = {"inputs": rng.normal(size=(16, 4)).astype(np.float32),
           "targets": rng.integers(0, 3, 16).astype(np.int32)}
  model = LinearLogits()
  params = model.init(jax.random.key(0), batch)["params"]
  state = steps.TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params),
                           model_state={}, rng=jax.random.PRNGKey(0))
  step = jax.jit(lambda state, batch: steps.train_step(state, batch, model=model, tx=tx, terms=classification_terms))
  got = []
  for _ in range(num_steps):
    state, _ = step(state, batch)
    got.append(np.asarray(state.params["w"], np.float64))
  want = _adamw_reference(np.asarray(params["w"], np.float64), batch["inputs"].astype(np.float64),
                          batch["targets"], opt_config, num_steps)
  return got, want


def _worst_error(got, want) -> float:
  return max(float(np.max(np.abs(g - w))) for g, w in zip(got, want))


def test_every_step_updates_with_the_scheduled_learning_rate():
  """8 steps through a 4-step warmup then rsqrt decay (the LRA schedule): each step's parameters equal
  AdamW's with that step's learning rate; an optimizer that skips every other update, or that uses the
  peak rate throughout, misses by orders of magnitude more than the tolerance."""
  opt = config_lib.load_config("lra", "listops", ["optimizer.warmup_steps=4", "optimizer.learning_rate=0.5",
                                                  "optimizer.weight_decay=0.1"]).optimizer
  lr = optim.learning_rate_schedule(opt)
  assert len({round(float(lr(s)), 6) for s in range(8)}) == 8  # a different rate at every step
  got, want = _trajectory(optim.make_optimizer(opt), opt, 8)
  assert _worst_error(got, want) < 1e-5

  # The broken variants, to show the comparison catches them.
  skipping = optax.MultiSteps(optim.make_optimizer(opt), every_k_schedule=2)
  unscheduled = optax.adamw(float(lr(4)), b1=opt.b1, b2=opt.b2, eps=opt.eps, weight_decay=opt.weight_decay)
  for broken in (skipping, unscheduled):
    assert _worst_error(*_trajectory(broken, opt, 8)) > 1e-3


# ----------------------------------------------------------------------------------------------------
# Evaluation of a padded batch


class FirstTokenClassifier(nn.Module):
  """Predicts class ``inputs[:, 0]`` (logits 10 there, 0 elsewhere): padded rows (all zeros) predict
  class 0, which is also their (padded) target, so counting them would raise the accuracy."""

  num_classes: int = 3

  def __call__(self, batch, *, deterministic: bool = True):
    del deterministic
    return 10.0 * jax.nn.one_hot(batch["inputs"][:, 0], self.num_classes)


def _batches(first_tokens, targets, batch_size):
  rows = [{"inputs": np.array([[t, 1]], np.int32), "targets": np.array([y], np.int32)}
          for t, y in zip(first_tokens, targets)]
  return [{k: np.concatenate([r[k] for r in rows[i:i + batch_size]]) for k in rows[0]}
          for i in range(0, len(rows), batch_size)]


def test_padded_rows_do_not_count():
  """6 examples in batches of 4 (the second has 2 real rows and 2 padded ones): 3 right, so 0.5, and
  the loss is the mean over the 6 real rows. Counting the padded rows would give 5/8."""
  model = FirstTokenClassifier()
  eval_fn = jax.jit(lambda params, model_state, batch: steps.eval_step(params, model_state, batch, model=model,
                                                                       terms=classification_terms))
  batches = _batches([1, 2, 0, 1, 2, 2], [1, 0, 0, 2, 1, 2], 4)  # right: examples 0, 2, 5
  right, wrong = math.log(1 + 2 * math.exp(-10)), math.log(math.exp(10) + 2)
  out = loop.evaluate(eval_fn, {}, {}, batches, 4)
  assert out == {"accuracy": 0.5, "loss": pytest.approx((3 * right + 3 * wrong) / 6, rel=1e-6), "count": 6,
                 "examples": 6}
  # Multi-host form: a process whose shard ran out feeds empty batches up to the common count.
  empty = {"inputs": np.zeros((0, 2), np.int32), "targets": np.zeros((0,), np.int32)}
  assert loop.evaluate(eval_fn, {}, {}, batches, 4, num_batches=3, empty_batch=empty)["accuracy"] == 0.5

  def unweighted(params, model_state, batch):  # the broken variant: padded rows counted
    return eval_fn(params, model_state, dict(batch, weights=np.ones_like(batch["weights"])))
  assert loop.evaluate(unweighted, {}, {}, batches, 4)["accuracy"] == 5 / 8


# ----------------------------------------------------------------------------------------------------
# test_accuracy: the test split, the best-validation parameters; and every record field's value


def split_labels(data_dir: str, split: str, name: str = "tiny") -> list[int]:
  """The Target column of a ListOps TSV, read with csv (not with the task's reader)."""
  with open(os.path.join(data_dir, listops.SUBDIR, f"{name}_{listops.SPLIT_FILES[split]}.tsv"),
            newline="") as f:
    return [int(row["Target"]) for row in csv.DictReader(f, delimiter="\t")]


def constant_class(params, label: int):
  """``params`` of the Classifier with a head that predicts ``label`` for every input."""
  head = dict(params["head_out"])
  head["kernel"] = jnp.zeros_like(head["kernel"])
  head["bias"] = 10.0 * jax.nn.one_hot(label, head["bias"].shape[0], dtype=head["bias"].dtype)
  return dict(params, head_out=head)


def scripted_steps(monkeypatch, make_step):
  """Replaces the compiled train step of ``loop.Run`` with ``make_step(initial state)``; the compile
  statistics become known numbers (compile 0.5 s, 123 FLOPs, 456 bytes compiled, 78 temporary)."""
  analysis = {"flops": 123.0, "compiled_memory_bytes": 456, "temp_bytes": 78}
  monkeypatch.setattr(loop, "compile_train_step",
                      lambda placed, state, shapes: (make_step(state), 0.5, analysis))
  return analysis


def _frequency(labels, label):
  return sum(y == label for y in labels) / len(labels)


def test_test_accuracy_is_the_test_split_with_the_best_validation_parameters(listops_dir, tmp_path,
                                                                            monkeypatch):
  """Step s sets the head to predict one class c_s for every input: the accuracy of a split is then
  the frequency of c_s in its labels (read from the files). c_2 is validation's most frequent class, c_3
  a rarer one: the best step is 2 and the last is 3. The record must say test = freq_test(c_2); scoring
  the validation split instead gives freq_val(c_2), the last parameters freq_test(c_3), all different."""
  val, test = split_labels(listops_dir, "validation"), split_labels(listops_dir, "test")
  classes = sorted(range(10), key=lambda c: (-_frequency(val, c), c))
  best = classes[0]
  last = next(c for c in classes[1:] if _frequency(test, c) != _frequency(test, best)
              and _frequency(val, c) < _frequency(val, best))
  first = next(c for c in classes[1:] if c != last)
  schedule = {1: first, 2: best, 3: last}
  want = {"test_accuracy": _frequency(test, best), "test_accuracy_last": _frequency(test, last),
          "best_val_accuracy": _frequency(val, best)}
  assert len(set(want.values())) == 3  # the three candidate numbers differ: the test can tell them apart

  def make_step(initial):
    def step(state, batch):
      s = int(state.step) + 1
      metrics = {"loss": np.float32(1.0), "accuracy": np.float32(0.0), "grad_norm": np.float32(0.0)}
      params = constant_class(initial.params, schedule[s])
      return state.replace(step=jnp.asarray(s, jnp.int32), params=params), metrics
    return step

  analysis = scripted_steps(monkeypatch, make_step)
  config = config_lib.load_config("smoke", "listops", tiny_overrides(
      num_train_steps=3, eval_every=1, checkpoint_every=3, log_every=1, num_eval_batches=-1))
  results_dir = str(tmp_path / "results")
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir, results_dir)
  assert record["status"] == "ok", record["error"]
  assert {k: record[k] for k in want} == pytest.approx(want, abs=1e-12)
  assert record["best_step"] == 2 and record["train_steps"] == 3

  # Every field's value (make_record fills missing ones with null, so a dropped field shows as None).
  model = objectives.select(config).create_model()
  params = jax.eval_shape(model.init, jax.random.key(0), {"inputs": np.zeros((1, 64), np.int32)})["params"]
  sps = record["steps_per_second"]
  expected = dict(
      want, task="listops", attention="vanilla", layer_kind="attention", attention_module="attention_zoo.vanilla",
      protocol="smoke",
      seed=0, status="ok", error=None, test_examples=37, test_labels=37, best_step=2, train_steps=3,
      num_params=sum(x.size for x in jax.tree.leaves(params)), steps_per_second=sps,
      examples_per_second=sps * 8, compile_seconds=0.5, peak_memory_bytes=xla_stats.peak_memory_bytes(),
      compiled_memory_bytes=analysis["compiled_memory_bytes"], flops_per_step=analysis["flops"], max_length=64,
      batch_size=8, backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind, num_devices=1,
      num_processes=1, per_device_batch_size=8, accumulate_steps=1, precision="float32",
      compute_dtype="float32", matmul_precision="default (cpu: float32)", attention_implementation=None,
      attention_dropout=None,
      versions=results.versions(), git_sha=results.git_sha(), config=config.to_dict(),
      config_hash=results.config_hash(config))
  assert set(expected) == set(results.FIELDS) - {"wall_seconds"}
  assert {k: record[k] for k in expected} == expected
  assert isinstance(sps, float) and sps > 0 and 0 < record["wall_seconds"] < 600
  assert record["compiled_temp_bytes"] == analysis["temp_bytes"]
  assert (record["data"]["test"]["num_examples"], record["data"]["test"]["num_truncated"]) == (37, 0)
  assert results.load_records(results_dir) == [record]


# ----------------------------------------------------------------------------------------------------
# Labels on disk are the generators'


def test_pathfinder_labels_read_back_are_the_generators(tmp_path):
  """Every image read back through the task (all three splits) carries the label the generator drew
  for that image (regenerated here in memory from the same per-batch seeds)."""
  options = dict(contour_length=6, num_images=40, images_per_batch=20, seed=3, workers=1, name="tiny")
  task = tasks.get_task("pathfinder")
  task.prepare(str(tmp_path), progress=False, **options)
  drawn = {}
  for batch in range(2):
    rng, pools = pathfinder.batch_seed(3, 32, 6, batch), {}
    for _ in range(20):
      sample = pathfinder_gen.generate_image(32, 6, rng, pools)
      drawn[sample.image.tobytes()] = sample.label
  assert len(drawn) == 40 and 5 < sum(drawn.values()) < 35
  seen = 0
  for split in tasks.SPLITS:
    examples = task.examples(str(tmp_path), split, max_length=1024, contour_length=6, name="tiny")
    for example in examples.dataset.as_numpy_iterator():
      pixels = (example["inputs"] - 1).astype(np.uint8).reshape(32, 32)  # token = pixel + 1
      assert example["targets"] == drawn[pixels.tobytes()]
      seen += 1
  assert seen == 40


def _evaluate_tokens(ids) -> int:
  """The value of a tokenized ListOps expression (prefix form, ``X`` closes), by a stack machine written
  from the task's definition: MIN, MAX, MED = floor of the median, SM = sum mod 10."""
  words = [listops.VOCAB[i - 1] for i in ids if i > 0]
  stack: list = []
  for word in words:
    if word in listops.OPERATORS:
      stack.append([word])
    elif word == "X":
      op, *args = stack.pop()
      value = {"[MIN": min, "[MAX": max, "[MED": lambda a: math.floor(statistics.median(a)),
               "[SM": lambda a: sum(a) % 10}[op](args)
      stack[-1].append(value) if stack else stack.append(value)
    else:
      stack[-1].append(int(word)) if stack else stack.append(int(word))
  assert len(stack) == 1
  return stack[0]


def _halves_that_round_up(tree) -> int:
  """MED nodes whose median is k + 0.5 with k odd: there truncation gives k, rounding half-to-even k+1."""
  if not isinstance(tree, tuple):
    return 0
  op, args = tree
  here = 0
  if op == "[MED":
    m = statistics.median(listops.evaluate(a) for a in args)
    here = int(m != math.floor(m) and round(m) != math.floor(m))
  return here + sum(_halves_that_round_up(a) for a in args)


def test_listops_med_truncates_where_rounding_would_not():
  assert listops.evaluate(("[MED", [3, 4])) == 3        # median 3.5: round-half-to-even gives 4
  assert listops.evaluate(("[MED", [1, 2])) == 1        # 1.5: 2
  assert listops.evaluate(("[MED", [2, 3])) == 2        # 2.5: 2 both ways
  assert listops.evaluate(("[MED", [7, 1, 9, 9])) == 8  # 8.0
  assert listops.evaluate(("[SM", [("[MED", [5, 6]), 9])) == 4  # (5 + 9) % 10; rounding gives 5


def test_listops_labels_read_back_are_the_generators(tmp_path):
  """The targets read back through the task, in file order, are the generator's labels for that split,
  and each is the value of its expression (evaluated from the token ids by the stack machine above)."""
  counts = dict(num_train=40, num_val=20, num_test=20)
  tasks.get_task("listops").prepare(str(tmp_path), name="tiny", seed=5, min_length=10, max_expression_length=60,
                                    progress=False, **counts)
  pairs = listops.generate(80, seed=5, min_length=10, max_expression_length=60, progress=False)
  cuts = {"train": pairs[:40], "validation": pairs[40:60], "test": pairs[60:]}
  for split, rows in cuts.items():
    examples = tasks.get_task("listops").examples(str(tmp_path), split, max_length=64, name="tiny")
    read = list(examples.dataset.as_numpy_iterator())
    assert [int(e["targets"]) for e in read] == [label for _, label in rows]
    assert [_evaluate_tokens(e["inputs"]) for e in read] == [label for _, label in rows]


def test_generated_listops_has_meds_where_truncation_matters():
  """The generator's own trees contain MEDs whose rounding rule changes the value, so the end-to-end
  label check above sees the rule (not only the hand-written cases)."""
  import random

  rng = random.Random(0)
  trees = [listops.generate_tree(rng)[0] for _ in range(200)]
  assert sum(_halves_that_round_up(t) for t in trees) > 0


# ----------------------------------------------------------------------------------------------------
# Newcombe's interval of a difference with unequal n, through the report


# Hand-computed (Newcombe 1998, method 10, z = 1.959964) for p1 = 45/150 = 0.30, p2 = 74/200 = 0.37,
# with Wilson's bounds in the closed form (2np + z^2 -/+ z sqrt(z^2 + 4np(1-p))) / (2(n + z^2)):
# [0.232408, 0.377580] and [0.306126, 0.438774]; d = -0.07, low = d - sqrt((0.30 - 0.232408)^2 +
# (0.438774 - 0.37)^2) = -0.166429, high = d + sqrt((0.377580 - 0.30)^2 + (0.37 - 0.306126)^2) = 0.030491.
NEWCOMBE_UNEQUAL = (-0.1664, 0.0305)


def test_newcombe_difference_with_unequal_n_in_the_report():
  low, high = accuracy.newcombe_difference(0.30, 150, 0.37, 200)
  assert (round(low, 4), round(high, 4)) == NEWCOMBE_UNEQUAL
  swapped = accuracy.newcombe_difference(0.30, 200, 0.37, 150)  # the bug a test with equal n cannot see
  assert (round(swapped[0], 4), round(swapped[1], 4)) != NEWCOMBE_UNEQUAL
  records = [{"kind": "train", "task": "listops", "attention": name, "protocol": "smoke", "seed": 0,
              "status": "ok", "error": None, "test_accuracy": acc, "config_hash": "h", "max_length": 10,
              "test_examples": n} for name, acc, n in (("vanilla", 0.37, 200), ("performer", 0.30, 150))]
  row = accuracy.accuracy_cells(records, "smoke").set_index(["attention", "task"]).loc[("performer", "listops")]
  assert [round(row[k] / 100, 4) for k in ("vs_vanilla_low", "vs_vanilla_high")] == list(NEWCOMBE_UNEQUAL)
  assert row["vs_vanilla"] == "≈" and row["test_examples"] == 150
