"""Shared test setup: hide accelerators from TensorFlow, keep JAX quiet and deterministic."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES_FOR_TF", "")
# Tests run tiny shapes where XLA's CPU compile time dominates; LLVM optimisation level 0 compiles the
# attention cores ~2-4x faster and does not change results.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import pytest  # noqa: E402


@pytest.fixture
def x64():
  """Runs the test body with float64 enabled (exact reference comparisons)."""
  import jax

  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", False)
