"""The workaround for XLA's CPU crash (attention_zoo/_xla_cpu.py): what it does to XLA_FLAGS, and the program
that crashed (a segmentation fault on an AVX2-only host with jaxlib 0.10.2) running in a fresh process that
imports attention_zoo first, its gradient checked against numpy's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attention_zoo import _xla_cpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(("flags", "version", "want"), [
    ("", "0.10.2", "--xla_cpu_experimental_ynn_fusion_type="),
    # first: XLA ignores every flag after a word that is not one (the single-thread recipe's trailing word)
    ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1", "0.8.1",
     "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"),
    ("--xla_cpu_experimental_ynn_fusion_type=dot", "0.10.2", "--xla_cpu_experimental_ynn_fusion_type=dot"),
    ("--xla_backend_optimization_level=0", "0.8.0", "--xla_backend_optimization_level=0"),  # no such flag yet
    ("", "0.7.2", ""),
    ("", None, ""),
    ("", "0.11.0rc1", "--xla_cpu_experimental_ynn_fusion_type="),
])
def test_flag_set_only_where_jaxlib_has_it_and_the_user_did_not(flags, version, want):
  assert _xla_cpu.flags_with_workaround(flags, version) == want


CRASHED = """
import attention_zoo  # noqa: F401  (sets XLA_FLAGS before the first computation)
import jax, jax.numpy as jnp, numpy as np
x, y = (np.random.default_rng(s).normal(size=(2, 2, 1, 2, 8, 16)).astype(np.float32) for s in (0, 1))
f = lambda x, y: jnp.sum(jnp.sin(jnp.sum(x[..., :, None, :] * y[..., None, :, :], axis=-1)))
gx, gy = jax.jit(jax.grad(f, argnums=(0, 1)))(x, y)
d = np.cos(np.einsum("...ik,...jk->...ij", x.astype(np.float64), y.astype(np.float64)))
np.testing.assert_allclose(gx, np.einsum("...ij,...jk->...ik", d, y), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(gy, np.einsum("...ij,...ik->...jk", d, x), rtol=1e-4, atol=1e-4)
print("gradient ok")
"""


def test_the_program_that_crashed_runs_and_is_right():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  done = subprocess.run([sys.executable, "-c", CRASHED], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0 and "gradient ok" in done.stdout, (done.returncode, done.stderr[-2000:])
