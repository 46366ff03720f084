"""Shared test setup: hide accelerators from TensorFlow, keep JAX quiet and deterministic."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES_FOR_TF", "")
# Tests run tiny shapes where XLA's CPU compile time dominates; LLVM optimisation level 0 compiles the
# attention cores ~2-4x faster and does not change results.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# Many tests (and the runs they start as subprocesses) compile the same tiny programs: JAX's persistent
# compilation cache lets each program compile once per test run (tests/test_resume.py: 111 s -> 77 s on
# 2 CPUs). One folder per run: made by the first process that loads this file (pytest-xdist's controller,
# whose environment its workers and their subprocesses inherit) and removed when that process exits.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _JAX_CACHE = tempfile.mkdtemp(prefix="lra-bench-tests-jax-cache-")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
  atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest


@pytest.fixture
def x64():
  """Runs the test body with float64 enabled (exact reference comparisons)."""
  import jax

  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", False)


@pytest.fixture(scope="session")
def listops_dir(tmp_path_factory):
  """A tiny generated ListOps data root (name 'tiny': 120/40/37 examples of 11..63 tokens)."""
  from tasks import get_task

  root = str(tmp_path_factory.mktemp("lra_data"))
  get_task("listops").prepare(root, name="tiny", num_train=120, num_val=40, num_test=37, seed=0,
                              min_length=10, max_expression_length=64, progress=False)
  return root


def tiny_overrides(**extra):
  """Overrides that shrink the smoke protocol to seconds, for the tiny ListOps data above."""
  values = {"data.options.name": "tiny", "data.max_length": 64, "batch_size": 8,
            "num_train_steps": 24, "eval_every": 8, "checkpoint_every": 8, "log_every": 4,
            "model.num_layers": 1, "model.emb_dim": 16, "model.qkv_dim": 16, "model.mlp_dim": 32,
            "optimizer.warmup_steps": 4}
  values.update(extra)
  return [f"{k}={v}" for k, v in values.items()]


@pytest.fixture
def fast_compile(monkeypatch):
  """Compiles with most XLA optimizations off (much faster on CPU), here and in child processes."""
  import jax

  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", False)


def pytest_configure(config):
  config.addinivalue_line("markers", "slurm: needs a reachable SLURM (scripts/slurm_local.sh start); "
                          "skipped without one unless LRA_REQUIRE_SLURM=1")
