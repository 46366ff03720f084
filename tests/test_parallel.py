"""Scale-out: batch layout errors, multi-host start-up logic, FSDP placement; and, in subprocesses with
simulated CPU devices, data parallelism == one device, accumulation == the full batch, a bf16 +
accumulation run of the real loop that counts every test example once, and a two-process
(jax.distributed) run."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from lra_bench.training import parallel
from lra_bench.training.config import ConfigError, load_config
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(num_devices: int) -> dict:
  # Cheap XLA CPU compiles (about 3x faster; the comparisons are within one process or one program).
  flags = (f"--xla_force_host_platform_device_count={num_devices} --xla_backend_optimization_level=0 "
           "--xla_llvm_disable_expensive_passes=true")
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    env.pop(var, None)
  return env


def test_batch_split_and_indivisible_batches():
  assert parallel.batch_split(32, 2, 8, 2) == {"per_process_batch_size": 16, "per_device_batch_size": 2,
                                               "micro_batch_size": 16}
  with pytest.raises(ConfigError, match=r"batch_size 6 .* not divisible by the 4 devices"):
    parallel.batch_split(6, 1, 4, 1)
  with pytest.raises(ConfigError, match=r"batch_size 16 / accumulate_steps 4 = 4\) is not divisible by the 8"):
    parallel.batch_split(16, 4, 8, 2)
  with pytest.raises(ConfigError, match="not divisible by accumulate_steps 3"):
    parallel.batch_split(16, 3, 1, 1)
  with pytest.raises(ConfigError, match="unknown precision 'float16'"):
    load_config("smoke", "listops", ["precision=float16"])
  with pytest.raises(ConfigError, match="accumulate_steps 3"):
    load_config("smoke", "listops", ["accumulate_steps=3"])


def test_distributed_arguments_from_flags_and_environment():
  args = parallel.distributed_arguments
  assert args(environ={}) is None                                  # one process: nothing to start
  assert args(distributed=False, environ={"JAX_COORDINATOR_ADDRESS": "h:1"}) is None
  assert args("10.0.0.1:1234", 2, 1, environ={}) == {"coordinator_address": "10.0.0.1:1234",
                                                     "num_processes": 2, "process_id": 1}
  assert args(environ={"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "4",
                       "JAX_PROCESS_ID": "3"}) == {"coordinator_address": "h:1", "num_processes": 4,
                                                   "process_id": 3}
  assert args(environ={"SLURM_NTASKS": "8"}) == {}                # JAX detects the rest itself
  assert args(environ={"SLURM_NTASKS": "1"}) is None
  assert args(distributed=True, environ={}) == {}                  # e.g. a TPU pod slice
  with pytest.raises(ConfigError, match="process_id 2 is not in"):
    args("h:1", 2, 2, environ={})


def test_fsdp_splits_large_arrays_only():
  assert parallel._fsdp_spec((128, 512), 4) == parallel.P(None, parallel.DATA)
  assert parallel._fsdp_spec((4096, 6), 4) == parallel.P(parallel.DATA)
  assert parallel._fsdp_spec((3, 4099), 4) == parallel.P()         # nothing divisible
  assert parallel._fsdp_spec((64,), 4) == parallel.P()             # small: replicated
  assert parallel._fsdp_spec((128, 512), 1) == parallel.P()


@pytest.mark.timeout(700)  # subprocess(es)
def test_four_devices(listops_dir, tmp_path):
  """4 simulated devices in one process (tests/spmd_checks.py)."""
  proc = subprocess.run([sys.executable, "-m", "tests.spmd_checks", listops_dir, str(tmp_path)], cwd=REPO,
                        env=_env(4), capture_output=True, text=True, timeout=600)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("SPMD_CHECKS ")]
  assert proc.returncode == 0 and lines, proc.stderr[-4000:]
  out = json.loads(lines[-1].split(" ", 1)[1])

  dp = out["data_parallel"]  # same loss curve and parameters on 1 and 4 devices, replicated or FSDP
  np.testing.assert_allclose(dp["losses_four"], dp["losses_one"], rtol=1e-5)
  np.testing.assert_allclose(dp["losses_fsdp"], dp["losses_one"], rtol=1e-5)
  assert dp["fsdp_sharded"] and dp["params_diff_four"] < 1e-5 and dp["params_diff_fsdp"] < 1e-5

  acc = out["accumulation"]  # 4 x batch/4 == one step on the whole batch
  np.testing.assert_allclose(acc["loss_accumulated"], acc["loss_full"], rtol=1e-5)
  assert acc["update_size"] > 1e-3 and acc["params_diff"] < 1e-5 * max(1.0, acc["update_size"])

  record, bad = out["end_to_end"]["record"], out["end_to_end"]["bad"]
  assert record["status"] == "ok", record["error"]
  assert (record["num_devices"], record["per_device_batch_size"], record["accumulate_steps"],
          record["precision"], record["test_examples"]) == (4, 1, 2, "bfloat16", 37)  # every example once
  assert round(record["test_accuracy"] * 37, 6).is_integer() and record["flops_per_step"] > 0  # k of 37
  resumed = out["end_to_end"]["resumed"]  # stopped after its step-4 checkpoint, then rerun: same numbers
  assert out["end_to_end"]["resumed_from"] == [4]
  for key in ("test_accuracy", "test_accuracy_last", "best_val_accuracy", "best_step", "train_steps"):
    assert resumed[key] == record[key], key
  assert bad["status"] == "failed" and "batch_size 6" in bad["error"] and "4 devices" in bad["error"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.timeout(700)  # subprocess(es)
def test_two_processes_on_localhost(listops_dir, tmp_path):
  """The multi-host path for real: 2 processes x 2 CPU devices, jax.distributed with a local coordinator,
  each reading its own shard of the data; one record, written by process 0, counting all 37 test examples."""
  workdir = tmp_path / "run"
  overrides = tiny_overrides(num_train_steps=4, eval_every=4, checkpoint_every=4, log_every=2)
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, "-m", "lra_bench", "train", "--task=listops", "--protocol=smoke",
       f"--workdir={workdir}", f"--data_dir={listops_dir}", f"--coordinator_address=127.0.0.1:{port}",
       "--num_processes=2", f"--process_id={i}"] + [f"--set={o}" for o in overrides],
      cwd=REPO, env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=600)[0] for p in procs]
  for p, output in zip(procs, outputs):
    assert p.returncode == 0, output[-4000:]
  with open(workdir / "result.json") as f:
    record = json.load(f)
  assert record["status"] == "ok" and record["num_processes"] == 2 and record["num_devices"] == 4
  assert record["per_device_batch_size"] == 2 and record["test_examples"] == 37
  assert record["train_steps"] == 4
  # each process keeps its own tf.data iterator state beside the shared orbax checkpoint
  assert sorted(os.listdir(workdir / "checkpoints" / "data")) == ["process_0", "process_1"]
