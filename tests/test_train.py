"""Training: schedule values, a tiny end-to-end run with its record, exact resume after SIGKILL, NaN
loss, eval of partial batches, and the results file."""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from lra_bench import config as config_lib
from lra_bench import results, train
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**extra):
  return config_lib.load_config("smoke", "listops", tiny_overrides(**extra))


def test_lra_rsqrt_schedule_values():
  opt = config_lib.load_config("lra", "listops").optimizer
  lr = train.learning_rate_schedule(opt)
  assert float(lr(0)) == 0.0
  np.testing.assert_allclose(float(lr(500)), 0.05 * 0.5 / np.sqrt(1000), rtol=1e-6)
  np.testing.assert_allclose(float(lr(1000)), 1.58e-3, rtol=1e-2)   # LRA ListOps peak
  np.testing.assert_allclose(float(lr(5000)), 7.07e-4, rtol=1e-2)   # and at the last step


def test_cosine_schedule_values():
  opt = config_lib.load_config("lra", "listops", [
      "optimizer.schedule='constant * linear_warmup * cosine_decay'", "optimizer.learning_rate=1e-3",
      "optimizer.warmup_steps=10", "optimizer.steps_per_cycle=100"]).optimizer
  lr = train.learning_rate_schedule(opt)
  expected = [5e-4, 1e-3, 5e-4, 1e-3 * 0.5 * (1 + np.cos(0.9 * np.pi)), 1e-3]  # LRA's cosine is cyclic:
  np.testing.assert_allclose([float(lr(s)) for s in (5, 10, 60, 100, 110)], expected, atol=1e-9)  # restarts


def test_pad_batch_counts_every_example_once():
  batch = {"inputs": np.ones((3, 4), np.int32), "targets": np.arange(3, dtype=np.int32)}
  padded = train.pad_batch(batch, 8)
  assert padded["inputs"].shape == (8, 4) and padded["weights"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]


def test_end_to_end_record(listops_dir, tmp_path):
  results_dir = str(tmp_path / "results")
  record = train.run(tiny_config(), str(tmp_path / "run"), listops_dir, results_dir)
  assert record["status"] == "ok", record["error"]
  for field in results.FIELDS:
    assert field in record
  assert 0.0 <= record["test_accuracy"] <= 1.0 and 0.0 <= record["test_accuracy_last"] <= 1.0
  assert record["train_steps"] == 24 and record["best_step"] in (8, 16, 24)
  assert record["data"]["test"]["num_examples"] == 37 and record["test_examples"] == 37
  assert record["steps_per_second"] > 0 and record["compile_seconds"] > 0
  assert record["flops_per_step"] > 0 and record["compiled_memory_bytes"] > 0 and record["num_params"] > 0
  assert record["versions"]["jax"] == jax.__version__ and record["config"]["task"] == "listops"
  with open(tmp_path / "run" / "result.json") as f:
    assert json.load(f)["test_accuracy"] == record["test_accuracy"]
  assert os.listdir(tmp_path / "run" / "tensorboard")
  # A rerun of a finished run neither retrains nor duplicates the record.
  again = train.run(tiny_config(), str(tmp_path / "run"), listops_dir, results_dir)
  assert again["test_accuracy"] == record["test_accuracy"]
  assert len(results.load_records(results_dir)) == 1


def _restore_last_params(workdir):
  import orbax.checkpoint as ocp

  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints", "last")) as mngr:
    restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  return restored["state"]["params"]


def test_killed_run_resumes_exactly(listops_dir, tmp_path):
  """SIGKILL a run after its first checkpoint; rerunning the command ends where an uninterrupted run ends."""
  overrides = tiny_overrides(num_train_steps=400, eval_every=100, checkpoint_every=20, log_every=20)
  config = config_lib.load_config("smoke", "listops", overrides)
  reference = train.run(config, str(tmp_path / "straight"), listops_dir)
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

  resumed = train.run(config, workdir, listops_dir)
  assert resumed["status"] == "ok"
  for key in ("test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step", "train_steps"):
    assert resumed[key] == reference[key], key
  for a, b in zip(jax.tree.leaves(_restore_last_params(workdir)),
                  jax.tree.leaves(_restore_last_params(str(tmp_path / "straight")))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_nan_loss_stops_with_a_clear_failed_record(listops_dir, tmp_path):
  record = train.run(tiny_config(**{"optimizer.learning_rate": 1e30, "optimizer.warmup_steps": 1}),
                     str(tmp_path / "nan"), listops_dir)
  assert record["status"] == "failed"
  assert "loss became nan" in record["error"].lower() and "learning_rate" in record["error"]


def test_missing_data_is_a_no_data_record_with_the_fix(tmp_path):
  record = train.run(tiny_config(), str(tmp_path / "run"), str(tmp_path / "empty"))
  assert record["status"] == "no_data"
  assert "tiny_train.tsv" in record["error"]
  assert f"lra-bench data prepare listops --protocol smoke --data_dir {tmp_path / 'empty'}" in record["error"]


@pytest.mark.parametrize("override, message", [
    ("model.no_such_key=1", "unknown config key 'model.no_such_key'"),
    ("model.attention='nope'", "unknown attention 'nope'"),
    ("model.attention_kwargs.nope=1", "no config field"),
    ("optimizer.schedule='constant * warp'", None),
])
def test_bad_config_keys_fail_clearly(override, message):
  if message is None:
    with pytest.raises(config_lib.ConfigError, match="unknown schedule factor"):
      train.learning_rate_schedule(config_lib.load_config("smoke", "listops", [override]).optimizer)
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
