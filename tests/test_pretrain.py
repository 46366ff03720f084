"""Self-pretraining (SPT: the objectives ``masked`` and ``causal`` of ``lra_bench.training.objectives``, the two
runs of ``lra_bench.training.pretrain``): the masking (rates, which positions, what they become), no label
leakage, the pixel and causal objectives, the config section, the parameter transfer, and the two stages:
records linked by the pretraining's config hash, a finished pretraining never repeated, and a run killed in
either stage resuming there to the numbers of an uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tasks as tasks_lib
from lra_bench.errors import ConfigError
from lra_bench.experiments import cell, results
from lra_bench.training import config as config_lib
from lra_bench.training import loop, models, objectives, optim, pretrain, steps
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IGNORE = tasks_lib.base.IGNORE


def _config(task="listops", protocol="smoke", sets=(), attention=None):
  return config_lib.load_config(protocol, task, list(sets), attention=attention)


def _tokens(rows=64, length=200, vocab=20, seed=0, pad_from=150):
  """Token rows of ids 1..vocab-1 with padding (0) from ``pad_from`` on in every other row."""
  x = np.random.default_rng(seed).integers(1, vocab, size=(rows, length)).astype(np.int32)
  x[::2, pad_from:] = 0
  return x


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize("task, rate", [("listops", 0.10), ("text", 0.15), ("retrieval", 0.15),
                                        ("image", 0.50), ("pathfinder", 0.50)])
def test_default_mask_rates_are_the_papers(task, rate):
  config = _config(task, sets=["pretrain.objective=masked"])
  assert config.pretrain.mask_rate == rate
  assert config.pretrain.num_train_steps == config.num_train_steps


def test_the_section_changes_nothing_for_a_run_from_scratch():
  preset = _config()
  scratch = _config(sets=["pretrain.objective=none"])
  assert "pretrain" not in scratch and config_lib.config_hash(scratch) == config_lib.config_hash(preset)
  spt = _config(sets=["pretrain.objective=masked", "pretrain.num_train_steps=7", "num_train_steps=9"])
  assert spt.pretrain.to_dict() == {"objective": "masked", "mask_rate": 0.1, "num_train_steps": 7}
  pre = pretrain.pretrain_config(spt)
  assert pre.num_train_steps == 7
  # the fine-tuning's length is not the pretraining's: one pretraining serves both fine-tunings
  other = _config(sets=["pretrain.objective=masked", "pretrain.num_train_steps=7", "num_train_steps=30"])
  assert config_lib.config_hash(pretrain.pretrain_config(other)) == config_lib.config_hash(pre)


@pytest.mark.parametrize("sets, match", [
    (["pretrain.objective=masks"], r"pretrain.objective='masks' is not allowed; expected one of none, masked, causal"),
    (["pretrain.objective=masked", "pretrain.mask_rate=1.0"], r"pretrain.mask_rate=1.0 is not allowed"),
    (["pretrain.objective=masked", "pretrain.mask_rate=0"],
     r"pretrain.mask_rate=0.0 is not allowed; expected a number in \(0, 1\)"),
    (["pretrain.objective=masked", "pretrain.num_train_steps=0"], r"pretrain.num_train_steps=0"),
    (["pretrain.rate=0.1"], r"unknown config key 'pretrain.rate'; pretrain takes: objective, mask_rate"),
    (["pretrain.objective=none", "pretrain.mask_rate=0.2"], r"takes no other pretrain key"),
    (["pretrain.objective=causal"], r"model.attention_kwargs.causal=None is not allowed; expected True: "
                                    r"causal SPT trains a causal model"),
    (["pretrain.objective=causal", "model.attention_kwargs.causal=True"], r"model.pooling='CLS' is not allowed"),
    (["pretrain.objective=causal", "pretrain.mask_rate=0.1", "model.attention_kwargs.causal=True",
      "model.pooling=MEAN"], r"pretrain.mask_rate=0.1 is not allowed; expected no value"),
])
def test_bad_sections_are_one_line_errors(sets, match):
  with pytest.raises(ConfigError, match=match):
    _config(sets=sets)


def test_a_core_without_a_causal_form_cannot_do_causal_spt():
  with pytest.raises(ConfigError, match=r"'linformer' has no causal form, so it cannot do causal SPT .*"
                                        r"use --pretrain masked"):
    _config(attention="linformer", sets=["pretrain.objective=causal", "model.pooling=MEAN"])
  ok = _config(sets=["pretrain.objective=causal", "model.attention_kwargs.causal=True", "model.pooling=MEAN"])
  assert "mask_rate" not in ok.pretrain


def test_a_next_token_task_has_nothing_to_fine_tune():
  with pytest.raises(ConfigError, match=r"task 'mqar' is itself next-token prediction"):
    _config("mqar", protocol="recall_cpu", sets=["pretrain.objective=masked"])


# ----------------------------------------------------------------------------------------------- masking


def _pretraining(config):
  return objectives.select(config, objectives.PRETRAIN)


def _prepare(config, batch, key=jax.random.PRNGKey(3), vocab=20):
  return jax.tree.map(np.asarray, _pretraining(config).batch_transform(vocab)(batch, key))


@pytest.mark.parametrize("rate", [0.1, 0.15, 0.5])
def test_masked_tokens_rate_positions_and_targets(rate):
  config = _config(sets=["pretrain.objective=masked", f"pretrain.mask_rate={rate}"])
  x = _tokens()
  batch = {"inputs": x, "targets": np.arange(len(x)) % 10, "index": np.arange(len(x), dtype=np.int32)}
  out = _prepare(config, batch)
  chosen = out["inputs"] == 20
  real = x > 0
  assert not (chosen & ~real).any()                                   # padding is never masked
  n, k = real.sum(), chosen.sum()
  assert abs(k / n - rate) < 4 * np.sqrt(rate * (1 - rate) / n)       # i.i.d. Bernoulli(rate)
  np.testing.assert_array_equal(out["inputs"][~chosen], x[~chosen])   # the rest is untouched
  np.testing.assert_array_equal(out["targets"][chosen], x[chosen])    # masked positions: their token
  assert (out["targets"][~chosen] == IGNORE).all()                    # every other position: no label
  assert set(out) == {"inputs", "targets"}                            # the class label is gone
  # each row's mask is its own: rows with equal tokens and different indices differ
  same = {"inputs": np.repeat(x[1:2], 8, 0), "index": np.arange(8, dtype=np.int32)}
  masks = _prepare(config, same)["inputs"] == 20
  assert len({m.tobytes() for m in masks}) == 8


def test_evaluation_masks_are_fixed_and_keyed_by_the_example():
  config = _config(sets=["pretrain.objective=masked"])
  x = _tokens(rows=8)
  batch = {"inputs": x, "index": np.arange(8, dtype=np.int32), "weights": np.ones(8, np.float32)}
  key = _pretraining(config).eval_key()
  a, b = _prepare(config, batch, key), _prepare(config, batch, key)
  np.testing.assert_array_equal(a["inputs"], b["inputs"])
  # an example masks the same wherever it sits in a batch
  shuffled = {k: v[::-1].copy() for k, v in batch.items()}
  np.testing.assert_array_equal(_prepare(config, shuffled, key)["inputs"][::-1], a["inputs"])
  np.testing.assert_array_equal(a["weights"], batch["weights"])


def test_two_inputs_are_both_masked_and_predicted():
  config = _config("retrieval", sets=["pretrain.objective=masked"])
  x1, x2 = _tokens(rows=4, seed=1), _tokens(rows=4, seed=2)
  out = _prepare(config, {"inputs1": x1, "inputs2": x2, "targets": np.zeros(4, np.int32),
                          "index": np.arange(4, dtype=np.int32)}, vocab=257)
  assert out["targets"].shape == (4, 400)
  for j, x in enumerate((x1, x2)):
    chosen = out[f"inputs{j + 1}"] == 257
    np.testing.assert_array_equal(out["targets"][:, 200 * j:200 * (j + 1)][chosen], x[chosen])
  assert (out["inputs1"] == 257).any() and (out["inputs2"] == 257).any()


def test_masked_pixels_are_zeroed_flagged_and_regressed():
  config = _config("image", sets=["pretrain.objective=masked", "model.input_kind=pixels"])
  x = np.random.default_rng(0).normal(size=(16, 100)).astype(np.float32)
  out = _prepare(config, {"inputs": x, "targets": np.zeros(16, np.int32), "index": np.arange(16, dtype=np.int32)})
  chosen = out["inputs_pixel_mask"]
  assert abs(chosen.mean() - 0.5) < 4 * np.sqrt(0.25 / chosen.size)
  assert (out["inputs"][chosen] == 0).all()
  np.testing.assert_array_equal(out["inputs"][~chosen], x[~chosen])
  np.testing.assert_array_equal(out["targets"], x)
  np.testing.assert_array_equal(out["target_weights"], chosen.astype(np.float32))
  # the objective's terms (the config's, not the model's): L1 on the masked pixels; "correct" within half an
  # intensity level (0.5 / 61 for CIFAR's std)
  offsets = np.array([0.0, 0.5, 0.49 / 61, 0.51 / 61], np.float32)[np.arange(100) % 4]
  predictions = x + offsets
  error, correct, weight = _pretraining(config).terms(jnp.asarray(predictions), out)
  np.testing.assert_allclose(np.asarray(error), np.abs(predictions - x), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(correct), (np.arange(100) % 2 == 0)[None].repeat(16, 0))
  np.testing.assert_array_equal(np.asarray(weight), out["target_weights"])


def test_causal_targets_are_the_next_real_token():
  config = _config(sets=["pretrain.objective=causal", "model.attention_kwargs.causal=True", "model.pooling=MEAN"])
  x = np.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9]], np.int32)
  out = _prepare(config, {"inputs": x, "targets": np.array([3, 4]), "index": np.arange(2, dtype=np.int32)})
  np.testing.assert_array_equal(out["inputs"], x)
  np.testing.assert_array_equal(out["targets"], [[6, 7, IGNORE, IGNORE, IGNORE], [2, 3, 4, 9, IGNORE]])


def test_the_label_never_enters_pretraining():
  """One pretraining step from the same state on batches that differ only in their class labels: the
  same parameters (a mutation that kept ``targets`` would train on the labels' tokens)."""
  config = config_lib.load_config("smoke", "listops", tiny_overrides(**{"pretrain.objective": "masked"}))
  task = tasks_lib.get_task("listops")
  objective = _pretraining(config)
  model, prepare = objective.create_model(), objective.batch_transform()
  tx = optim.make_optimizer(config.optimizer)
  x = _tokens(rows=8, length=64, vocab=task.vocab_size, pad_from=40)
  batch = {"inputs": x, "targets": np.zeros(8, np.int32), "index": np.arange(8, dtype=np.int32)}
  example = jax.tree.map(np.asarray, prepare(batch, jax.random.PRNGKey(0)))
  state = steps.init_state(config, model, tx, example)
  step = jax.jit(lambda s, b: steps.train_step(s, b, model=model, tx=tx, terms=objective.terms, prepare=prepare))
  a, metrics = step(state, batch)
  b, _ = step(state, dict(batch, targets=np.full(8, 9, np.int32)))
  for u, v in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
  assert np.isfinite(float(metrics["loss"]))
  # the loss is the masked positions' cross-entropy over the token vocabulary, near log(vocab) at init
  assert 0.5 * np.log(task.vocab_size) < float(metrics["loss"]) < 2 * np.log(task.vocab_size)


# ------------------------------------------------------------------------------------------------ transfer


def test_transfer_takes_the_encoder_and_drops_the_mask_row():
  config = config_lib.load_config("smoke", "listops", tiny_overrides(**{"pretrain.objective": "masked"}))
  batch = {"inputs": np.ones((2, 64), np.int32), "targets": np.zeros(2, np.int32)}
  pre = _pretraining(config).create_model().init(jax.random.PRNGKey(1), batch)["params"]
  fresh = objectives.select(config).create_model().init(jax.random.PRNGKey(2), batch)["params"]
  params, taken, kept = pretrain.transfer(pre, fresh)
  assert sorted(kept) == sorted(k for k in map(jax.tree_util.keystr, _paths(fresh)) if "head" in k)
  assert all("encoder" in k for k in taken) and len(taken) == len(_paths(fresh)) - len(kept)
  embed = params["encoder"]["embed"]["embedding"]
  np.testing.assert_array_equal(np.asarray(embed), np.asarray(pre["encoder"]["embed"]["embedding"][:-1]))
  np.testing.assert_array_equal(np.asarray(params["head_out"]["kernel"]), np.asarray(fresh["head_out"]["kernel"]))
  assert isinstance(models.Pretrainer, type)


def _paths(tree):
  return [path for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


# ------------------------------------------------------------------------------------------- two stages

SPT = tiny_overrides(**{"pretrain.objective": "masked", "pretrain.num_train_steps": 8, "num_train_steps": 8,
                        "eval_every": 4, "checkpoint_every": 4})
COMPARED = ("test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step", "train_steps")


def killed_spt(stage: str, step: int, workdir: str, data_dir: str) -> None:
  """Runs the SPT config and exits the process (``os._exit(9)``, like a SIGKILL) right after the ``last``
  commit of ``step`` in ``stage`` (``pretrain`` or ``train``). Called in a subprocess."""
  from lra_bench.training import checkpoints

  committed = checkpoints.Checkpoints._committed

  def dying(self, s, progress):
    committed(self, s, progress)
    if s == step and (os.sep + "pretrain" + os.sep in self.root) == (stage == "pretrain"):
      os._exit(9)

  checkpoints.Checkpoints._committed = dying
  cell.train_cell(config_lib.load_config("smoke", "listops", SPT), workdir, data_dir)
  sys.exit(0)


@pytest.fixture(scope="module")
def straight(listops_dir, tmp_path_factory):
  """The uninterrupted two-stage run, with a results file."""
  workdir = str(tmp_path_factory.mktemp("spt"))
  results_dir = os.path.join(workdir, "results")
  record = cell.train_cell(config_lib.load_config("smoke", "listops", SPT), workdir, listops_dir, results_dir)
  assert record["status"] == "ok", record["error"]
  return record, results_dir


def test_the_records_are_linked(straight):
  record, results_dir = straight
  with open(os.path.join(record["workdir"], "pretrain", "result.json")) as f:
    pre = json.load(f)
  assert pre["kind"] == "pretrain" and pre["status"] == "ok" and pre["train_steps"] == 8
  assert pre["config"]["num_train_steps"] == 8 and pre["config"]["pretrain"]["objective"] == "masked"
  link = record["pretrain"]
  assert link["config_hash"] == pre["config_hash"] == config_lib.config_hash(
      pretrain.pretrain_config(config_lib.load_config("smoke", "listops", SPT)))
  assert link["workdir"] == pre["workdir"] and link["best_step"] == pre["best_step"]
  assert link["best_val_accuracy"] == pre["best_val_accuracy"] and link["objective"] == "masked"
  assert link["mask_rate"] == 0.1 and link["train_steps"] == 8
  # the masked positions' cross-entropy over the 17-token vocabulary: below a uniform guess's log(17)
  assert link["test_loss"] == pre["test_loss"] and 0.5 < pre["test_loss"] < np.log(17)
  assert results.pretrain_objective(record) == "masked" and record["config_hash"] != pre["config_hash"]
  # the classifier started from the encoder: every parameter but the head's was taken
  assert record["transferred_params"] > 0 and record["fresh_params"] > 0
  kinds = [r.get("kind", "train") for r in results.load_records(results_dir)]
  assert kinds == ["pretrain", "train"]


def test_a_finished_pretraining_is_not_repeated(straight, listops_dir, tmp_path, caplog):
  import logging

  record, _ = straight
  caplog.set_level(logging.INFO)
  # another fine-tuning (longer) from the same pretraining: the pretraining is read, not rerun
  config = config_lib.load_config("smoke", "listops", [*SPT, "num_train_steps=4"])
  again = cell.train_cell(config, str(tmp_path / "other"), listops_dir,
                          pretrain_workdir=os.path.join(record["workdir"], "pretrain"))
  assert again["status"] == "ok", again["error"]
  assert again["pretrain"]["config_hash"] == record["pretrain"]["config_hash"]
  messages = [r.getMessage() for r in caplog.records]
  assert any("already holds a 'ok' pretraining for this config; not rerunning" in m for m in messages)
  assert not any("self-pretraining (masked) in" in m for m in messages)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage, step", [("pretrain", 4), ("train", 4)])
def test_killed_in_either_stage_resumes_there(stage, step, straight, listops_dir, tmp_path, caplog):
  import logging

  record, _ = straight
  workdir = str(tmp_path / "run")
  code = (f"from tests.test_pretrain import killed_spt; killed_spt({stage!r}, {step}, {workdir!r}, "
          f"{listops_dir!r})")
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 9, f"the run was not killed in {stage} at step {step}:\n{proc.stderr[-3000:]}"
  assert os.path.exists(os.path.join(workdir, "pretrain", "result.json")) == (stage == "train")
  caplog.set_level(logging.INFO)
  resumed = cell.train_cell(config_lib.load_config("smoke", "listops", SPT), workdir, listops_dir)
  assert resumed["status"] == "ok", resumed["error"]
  assert {k: resumed[k] for k in COMPARED} == {k: record[k] for k in COMPARED}
  where = os.path.join(workdir, "pretrain") if stage == "pretrain" else workdir
  shown = [r.getMessage() for r in caplog.records]
  assert f"resumed from step {step} of the checkpoint in {where}/checkpoints" in shown
  assert {k: resumed["pretrain"][k] for k in ("best_val_accuracy", "test_accuracy", "config_hash")} == \
      {k: record["pretrain"][k] for k in ("best_val_accuracy", "test_accuracy", "config_hash")}


def test_a_failed_pretraining_fails_the_fine_tuning_with_its_reason(listops_dir, tmp_path, monkeypatch):
  def broken(self, *args, **kwargs):
    raise loop.TrainingError("loss became nan by step 4")

  train = loop.Run.train
  monkeypatch.setattr(loop.Run, "train",
                      lambda self: broken(self) if self.objective.phase == objectives.PRETRAIN else train(self))
  record = cell.train_cell(config_lib.load_config("smoke", "listops", SPT), str(tmp_path / "w"), listops_dir)
  assert record["status"] == "failed"
  assert record["error"].startswith(f"the self-pretraining run in {tmp_path / 'w' / 'pretrain'} ended 'failed': "
                                    "loss became nan by step 4")
  assert record["pretrain"]["status"] == "failed"


# ------------------------------------------------------------------------------- every layer, both objectives


def _layers():
  import attention_zoo

  return attention_zoo.list_layers()


@pytest.mark.parametrize("name", _layers())
def test_every_layer_pretrains_masked_and_causal_where_it_has_a_causal_form(name):
  """Each registered attention core and sequence mixer: one masked pretraining step traces (shapes only,
  nothing compiled) at the smoke size; causal SPT is either accepted and traces too, or refused in one
  line saying the layer has no causal form."""
  sizes = tiny_overrides(**{"model.pooling": "MEAN"})
  configs = [config_lib.load_config("smoke", "listops", [*sizes, "pretrain.objective=masked"], attention=name)]
  try:
    configs.append(config_lib.load_config("smoke", "listops", [*sizes, "pretrain.objective=causal",
                                                               "model.attention_kwargs.causal=True"],
                                          attention=name))
  except ConfigError as err:
    assert str(err).startswith(f"{name!r} has no causal form, so it cannot do causal SPT") or \
        "model.attention_kwargs: " in str(err), str(err)
    assert "\n" not in str(err)
  for config in configs:
    objective = _pretraining(config)
    model, prepare = objective.create_model(), objective.batch_transform()
    tx = optim.make_optimizer(config.optimizer)
    batch = {"inputs": np.ones((2, 64), np.int32), "targets": np.zeros(2, np.int32),
             "index": np.arange(2, dtype=np.int32)}
    example = jax.eval_shape(prepare, batch, jax.random.PRNGKey(0))
    example = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), example)
    state = jax.eval_shape(steps.state_initializer(config, model, tx, example))
    _, metrics = jax.eval_shape(lambda s, b: steps.train_step(s, b, model=model, tx=tx, terms=objective.terms,
                                                              prepare=prepare), state, batch)
    assert metrics["loss"].shape == ()


# ---------------------------------------------------------------------------------------------------- suite


def test_the_suite_runs_each_cell_from_scratch_and_after_spt_sharing_pretrainings(tmp_path):
  from lra_bench.experiments import suite

  results_dir = str(tmp_path)
  sweeps = suite.parse_sweeps([], pretrain="none,masked")
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla", "s4d"], [0], results_dir, sweeps=sweeps)
  assert [c.name for c in cells] == ["listops/vanilla/seed0[pretrain=none]", "listops/vanilla/seed0[pretrain=masked]",
                                     "listops/s4d/seed0[pretrain=none]", "listops/s4d/seed0[pretrain=masked]"]
  scratch, spt = cells[0], cells[1]
  assert "pretrain" not in scratch.config and scratch.pretrain_workdir is None
  assert config_lib.config_hash(scratch.config) == config_lib.config_hash(config_lib.load_config("smoke", "listops"))
  pre_hash = config_lib.config_hash(pretrain.pretrain_config(spt.config))
  assert spt.pretrain_workdir == os.path.join(results_dir, "runs", "smoke", "listops", "vanilla", "pretrain",
                                              f"seed0_{pre_hash}")
  # fine-tunings of another length share the pretraining (its length given: by default it is the run's);
  # another mask rate does not
  assert spt.config.pretrain.num_train_steps == 60
  longer, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir,
                         ["num_train_steps=90", "pretrain.num_train_steps=60"],
                         suite.parse_sweeps([], pretrain="masked"))
  other, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir, ["pretrain.mask_rate=0.3"],
                        suite.parse_sweeps([], pretrain="masked"))
  assert longer[0].workdir != spt.workdir and longer[0].pretrain_workdir == spt.pretrain_workdir
  assert other[0].pretrain_workdir != spt.pretrain_workdir
  with pytest.raises(ConfigError, match=r"--pretrain 'masked,mlm': expected a comma list of none, masked, causal"):
    suite.parse_sweeps([], pretrain="masked,mlm")


def test_a_pretraining_that_changes_nothing_reproduces_the_run_from_scratch(listops_dir, tmp_path):
  """One pretraining step at learning rate 0 (the warmup's first) leaves the initial parameters as they
  are, and the classifier's parameters are initialised from the same key: its encoder taken from that
  pretraining (the embedding without its mask row, which the same random stream fills first) must be the
  from-scratch run's, so the fine-tuning must end exactly where the run from scratch does. A transfer that
  moved, dropped a row wrongly or re-cast a parameter, or a fine-tuning that started anywhere but step 0,
  would not."""
  scratch_config = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=8, eval_every=4))
  spt_config = config_lib.load_config("smoke", "listops", tiny_overrides(
      num_train_steps=8, eval_every=4, **{"pretrain.objective": "masked", "pretrain.num_train_steps": 1}))
  scratch = cell.train_cell(scratch_config, str(tmp_path / "scratch"), listops_dir)
  spt = cell.train_cell(spt_config, str(tmp_path / "spt"), listops_dir)
  assert scratch["status"] == spt["status"] == "ok", (scratch["error"], spt["error"])
  assert spt["pretrain"]["train_steps"] == 1 and spt["transferred_params"] > 0
  assert {k: spt[k] for k in COMPARED} == {k: scratch[k] for k in COMPARED}
  import orbax.checkpoint as ocp

  def last_params(workdir):
    with ocp.CheckpointManager(os.path.join(workdir, "checkpoints", "last")) as mngr:
      state = mngr.restore(8, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    return jax.tree.leaves(state["params"])

  for a, b in zip(last_params(spt["workdir"]), last_params(scratch["workdir"])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
