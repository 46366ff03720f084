"""Training: schedule values, a tiny end-to-end run with its record, exact resume after SIGKILL, NaN
loss, eval of partial batches, and the results file."""

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench.experiments import cell, results
from lra_bench.training import config as config_lib
from lra_bench.training import loop, objectives, optim, steps
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**extra):
  return config_lib.load_config("smoke", "listops", tiny_overrides(**extra))


def test_lra_rsqrt_schedule_values():
  opt = config_lib.load_config("lra", "listops").optimizer
  lr = optim.learning_rate_schedule(opt)
  assert float(lr(0)) == 0.0
  np.testing.assert_allclose(float(lr(500)), 0.05 * 0.5 / np.sqrt(1000), rtol=1e-6)
  np.testing.assert_allclose(float(lr(1000)), 1.58e-3, rtol=1e-2)   # LRA ListOps peak
  np.testing.assert_allclose(float(lr(5000)), 7.07e-4, rtol=1e-2)   # and at the last step


def test_cosine_schedule_values():
  opt = config_lib.load_config("lra", "listops", [
      "optimizer.schedule=constant * linear_warmup * cosine_decay", "optimizer.learning_rate=1e-3",
      "optimizer.warmup_steps=10", "optimizer.steps_per_cycle=100"]).optimizer
  lr = optim.learning_rate_schedule(opt)
  expected = [5e-4, 1e-3, 5e-4, 1e-3 * 0.5 * (1 + np.cos(0.9 * np.pi)), 1e-3]  # LRA's cosine is cyclic:
  np.testing.assert_allclose([float(lr(s)) for s in (5, 10, 60, 100, 110)], expected, atol=1e-9)  # restarts


def test_timm_cosine_schedule_values():
  # timm CosineLRScheduler(t_initial=100, lr_min=1e-4, warmup_t=10, t_in_epochs=False) at lr 1e-3: the
  # cosine counts from step 0 (at step 10 it is already cos(0.1 pi)) and ends at lr_min.
  opt = config_lib.load_config("lra", "listops", [
      "optimizer.schedule=constant * linear_warmup * timm_cosine", "optimizer.learning_rate=1e-3",
      "optimizer.warmup_steps=10", "optimizer.steps_per_cycle=100", "optimizer.cosine_floor=0.1"]).optimizer
  lr = optim.learning_rate_schedule(opt)
  timm = lambda t: 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + np.cos(np.pi * t / 100))
  expected = [5e-4, timm(10), timm(60), 1e-4, 1e-4]
  np.testing.assert_allclose([float(lr(s)) for s in (5, 10, 60, 100, 130)], expected, rtol=1e-5)


def test_pad_batch_counts_every_example_once():
  batch = {"inputs": np.ones((3, 4), np.int32), "targets": np.arange(3, dtype=np.int32)}
  padded = loop.pad_batch(batch, 8)
  assert padded["inputs"].shape == (8, 4) and padded["weights"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]


def test_end_to_end_record(listops_dir, tmp_path):
  results_dir = str(tmp_path / "results")
  record = cell.train_cell(tiny_config(), str(tmp_path / "run"), listops_dir, results_dir)
  assert record["status"] == "ok", record["error"]
  # Values, not keys (make_record fills every field, null where unknown): only these may be null here.
  # attention_implementation: flash models only; attention_dropout: benchmark points only
  assert {f for f in results.FIELDS if record[f] is None} <= {"error", "peak_memory_bytes", "attention_implementation",
                                                               "attention_dropout"}
  assert record["train_steps"] == 24 and record["best_step"] in (8, 16, 24)
  # Accuracies are counts of the 37 test examples; the best step's parameters are the last ones at 24.
  for key in ("test_accuracy", "test_accuracy_last"):
    assert round(record[key] * 37, 6).is_integer(), record[key]
  assert (record["test_accuracy"] == record["test_accuracy_last"]) or record["best_step"] != 24
  assert record["data"]["test"]["num_examples"] == 37 and record["test_examples"] == 37
  assert record["steps_per_second"] > 0 and record["compile_seconds"] > 0
  assert record["flops_per_step"] > 0 and record["compiled_memory_bytes"] > 0 and record["num_params"] > 0
  assert record["versions"]["jax"] == jax.__version__ and record["config"]["task"] == "listops"
  with open(tmp_path / "run" / "result.json") as f:
    assert json.load(f)["test_accuracy"] == record["test_accuracy"]
  assert os.listdir(tmp_path / "run" / "tensorboard")
  # A rerun of a finished run neither retrains nor duplicates the record.
  again = cell.train_cell(tiny_config(), str(tmp_path / "run"), listops_dir, results_dir)
  assert again["test_accuracy"] == record["test_accuracy"]
  assert len(results.load_records(results_dir)) == 1


def _restore_last_params(workdir):
  import orbax.checkpoint as ocp

  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints", "last")) as mngr:
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return restored["state"]["params"]


@pytest.mark.timeout(900)
def test_killed_run_resumes_exactly(listops_dir, tmp_path):
  """SIGKILL a run after its first checkpoint; rerunning the command ends where an uninterrupted run ends."""
  overrides = tiny_overrides(num_train_steps=400, eval_every=100, checkpoint_every=20, log_every=20)
  config = config_lib.load_config("smoke", "listops", overrides)
  reference = cell.train_cell(config, str(tmp_path / "straight"), listops_dir)
  assert reference["status"] == "ok"

  workdir = str(tmp_path / "killed")
  cmd = [sys.executable, "-m", "lra_bench", "train", "--task=listops", "--protocol=smoke",
         f"--workdir={workdir}", f"--data_dir={listops_dir}"] + [f"--set={o}" for o in overrides]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  last_dir = os.path.join(workdir, "checkpoints", "last")
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    if os.path.isdir(last_dir) and any(d.isdigit() for d in os.listdir(last_dir)):
      break
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL, "the run finished before it could be killed"
  assert not os.path.exists(os.path.join(workdir, "result.json"))
  killed_at = max(int(d) for d in os.listdir(last_dir) if d.isdigit())
  assert killed_at < 400

  resumed = cell.train_cell(config, workdir, listops_dir)
  assert resumed["status"] == "ok"
  for key in ("test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step", "train_steps"):
    assert resumed[key] == reference[key], key
  for a, b in zip(jax.tree.leaves(_restore_last_params(workdir)),
                  jax.tree.leaves(_restore_last_params(str(tmp_path / "straight")))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_nan_loss_stops_with_a_clear_failed_record(listops_dir, tmp_path):
  record = cell.train_cell(tiny_config(**{"optimizer.learning_rate": 1e30, "optimizer.warmup_steps": 1}),
                     str(tmp_path / "nan"), listops_dir)
  assert record["status"] == "failed"
  assert "loss became nan" in record["error"].lower() and "learning_rate" in record["error"]


def test_missing_data_is_a_no_data_record_with_the_fix(tmp_path):
  record = cell.train_cell(tiny_config(), str(tmp_path / "run"), str(tmp_path / "empty"))
  assert record["status"] == "no_data"
  assert "tiny_train.tsv" in record["error"]
  assert f"lra-bench data prepare listops --protocol smoke --data_dir {tmp_path / 'empty'}" in record["error"]


@pytest.mark.parametrize("override, message", [
    ("model.no_such_key=1", "unknown config key 'model.no_such_key'"),
    ("model.attention=nope", "unknown attention 'nope'"),
    ("batch_size=eight", "bad value for 'batch_size'"),
    ("model.attention_kwargs.nope=1", "no config field"),
    ("optimizer.schedule=constant * warp", None),
])
def test_bad_config_keys_fail_clearly(override, message):
  if message is None:
    with pytest.raises(config_lib.ConfigError, match="unknown schedule factor"):
      optim.learning_rate_schedule(config_lib.load_config("smoke", "listops", [override]).optimizer)
  else:
    with pytest.raises(config_lib.ConfigError, match=message):
      config_lib.load_config("smoke", "listops", [override])


def test_results_file_is_append_only_and_skips_bad_lines(tmp_path):
  rec = results.make_record(status="ok", task="listops", attention="vanilla", protocol="smoke", seed=0,
                            config_hash="abc", max_length=64, test_accuracy=float("nan"))
  assert results.append_record(str(tmp_path), rec)
  assert not results.append_record(str(tmp_path), rec)   # same run: not duplicated
  with open(tmp_path / results.RESULTS_FILE, "a") as f:
    f.write('{"truncated": \n')
  records = results.load_records(str(tmp_path))
  assert len(records) == 1 and records[0]["test_accuracy"] is None


def test_overrides_are_parsed_by_the_type_of_their_field():
  c = config_lib.load_config("smoke", "listops", [
      "precision=bfloat16", "batch_size=8", "optimizer.learning_rate=1", "data.options.name='tiny'",
      "model.attention_kwargs.nb_features=32"], attention="performer", seed=3)
  assert (c.precision, c.batch_size, c.data.options.name, c.seed) == ("bfloat16", 8, "tiny", 3)
  assert isinstance(c.optimizer.learning_rate, float) and c.optimizer.learning_rate == 1.0
  assert c.model.attention_kwargs.nb_features == 32
  assert config_lib.load_config("smoke", "text", ["data.options.limit=100"]).data.options.limit == 100
  # The attention and the seed are values, never formatted into an override and parsed back.
  assert config_lib.load_config("smoke", "listops", attention="axial").model.attention == "axial"


class _ScaledIdentity(nn.Module):
  """A core that returns ``scale * value`` and sows ``penalty * scale**2`` into ``losses`` (if > 0)."""

  config: "_PenaltyConfig"

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    scale = self.param("scale", nn.initializers.ones, ())
    if self.config.penalty:
      self.sow("losses", "penalty", self.config.penalty * scale ** 2)
    return value * scale


@dataclasses.dataclass(frozen=True)
class _PenaltyConfig(attention_zoo.AttentionConfig):
  penalty: float = 0.0


@dataclasses.dataclass(frozen=True)
class _PenaltyFiveConfig(_PenaltyConfig):
  penalty: float = 5.0


def test_sown_losses_are_added_to_the_training_loss():
  """A core's sown ``losses`` add to the loss and its gradient; nothing sown = the plain cross-entropy."""

  batch = {"inputs": np.arange(1, 17, dtype=np.int32).reshape(2, 8) % 10 + 1,
           "targets": np.array([1, 3], np.int32)}
  out = {}
  with registry.temporary({"test_plain": (_ScaledIdentity, _PenaltyConfig),
                           "test_penalty": (_ScaledIdentity, _PenaltyFiveConfig)}):
    for name in ("test_plain", "test_penalty"):
      config = config_lib.load_config("smoke", "listops", tiny_overrides(**{"model.dropout_rate": 0.0}),
                                      attention=name)
      objective = objectives.select(config)
      model = objective.create_model()
      tx = optim.make_optimizer(config.optimizer)
      state = steps.init_state(config, model, tx, batch)
      assert "losses" not in state.model_state
      _, metrics = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, terms=objective.terms))(
          state, batch)
      sums = steps.eval_step(state.params, state.model_state, dict(batch, weights=np.ones(2, np.float32)),
                             model=model, terms=objective.terms)
      out[name] = (float(metrics["loss"]), float(sums["loss"]) / 2, float(metrics["grad_norm"]))
  plain, penalty = out["test_plain"], out["test_penalty"]
  assert plain[0] == pytest.approx(plain[1], rel=1e-6)             # no aux loss: the cross-entropy
  assert penalty[0] - plain[0] == pytest.approx(5.0 * 1, rel=1e-6)  # + 5 * scale**2 per layer (1 layer)
  assert penalty[1] == pytest.approx(plain[1], rel=1e-6)           # evaluation collects no aux loss
  assert penalty[2] > max(plain[2], 9.0)  # d(5 scale^2)/d scale = 10 joins the gradient (norm ~10.6 vs ~3.6)


def test_the_loop_queues_at_most_its_time_bound_ahead_of_the_device(listops_dir, tmp_path, monkeypatch):
  """JAX dispatches steps ahead of the device. Unbounded, the loop queued every step up to the next log
  boundary and a Ctrl-C (read before each dispatch) took effect only when the device had run them all
  (minutes on a slow config). Here each step is a chain of matrix products (~tens of ms on a CPU)
  whose loss feeds the next step, as a train state does; at each dispatch the steps not finished yet
  are counted with ``is_ready``. With the bound at ~0 s of queued work, once the first log interval
  has timed a step only the step before may still run (unbounded, the count climbed to ~10 here)."""
  losses, pending = [], []
  work = jax.jit(lambda x, m: jax.lax.fori_loop(0, 40, lambda i, a: jnp.tanh(a @ m), x).mean())
  matrix = jnp.eye(256) * 0.5

  def make_step(state, batch):
    pending.append(sum(not loss.is_ready() for loss in losses))
    previous = losses[-1] if losses else jnp.zeros(())
    losses.append(work(jnp.full((256, 256), previous), matrix))
    return state.replace(step=state.step + 1), {"loss": losses[-1], "accuracy": np.float32(0.0),
                                                 "grad_norm": np.float32(0.0)}

  monkeypatch.setattr(loop, "compile_train_step",
                      lambda placed, state, shapes: (make_step, 0.5, {"flops": 1.0}))
  monkeypatch.setattr(loop.Run, "MAX_QUEUED_SECONDS", 1e-9)   # -> 2 in flight
  run = loop.Run(tiny_config(num_train_steps=40, log_every=4, eval_every=40, checkpoint_every=40),
                 str(tmp_path / "run"), listops_dir)
  run.train()
  assert len(pending) == 40
  assert max(pending[5:]) <= 1, pending   # from step 5 on: the interval after the first timed one
