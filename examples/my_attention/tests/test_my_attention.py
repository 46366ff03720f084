"""``my_attention``: the lra-bench conformance kit, and the core against a float64 numpy reference of
scaled cosine attention (Swin Transformer V2, Eq. 2)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_bench.testing import assert_conformant
from my_attention import core  # registers "my_attention" (also when the package is not installed)


def test_my_attention_is_conformant():
  assert_conformant("my_attention")


def reference(q, k, v, mask, scale, causal):
  """float64: softmax_j(scale_h * cos(q_i, k_j)) over real keys j (and j <= i when causal), times v."""
  qn = q / np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), core.EPS)
  kn = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), core.EPS)
  logits = np.einsum("bqhd,bkhd->bhqk", qn, kn) * scale[None, :, None, None]
  allowed = np.broadcast_to(mask[:, None, None, :], logits.shape).copy()
  if causal:
    allowed &= np.tril(np.ones(logits.shape[-2:], bool))
  logits = np.where(allowed, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  return np.einsum("bhqk,bkhv->bqhv", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_reference(causal):
  rng = np.random.default_rng(0)
  q, k = rng.normal(size=(2, 2, 13, 3, 8))
  v = rng.normal(size=(2, 13, 3, 5))
  mask = np.ones((2, 13), bool)
  mask[0, 9:] = False
  # One head's learned scale above the clip: the core must use max_scale (100) there.
  log_scale = np.log(np.array([10.0, 3.0, 400.0]))
  jax.config.update("jax_enable_x64", True)
  try:
    attention = core.CosineAttention(core.CosineConfig(causal=causal))
    variables = attention.init(jax.random.key(0), q, k, v, jnp.asarray(mask))
    assert np.allclose(variables["params"]["log_scale"], np.log(10.0))
    variables = {"params": {"log_scale": jnp.asarray(log_scale)}}
    got = np.asarray(attention.apply(variables, q, k, v, jnp.asarray(mask)))
  finally:
    jax.config.update("jax_enable_x64", False)
  want = reference(q, k, v, mask, np.minimum(np.exp(log_scale), 100.0), causal)
  # log_scale is a float32 parameter, so the scales carry float32 rounding (~1e-7 relative).
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-5, atol=1e-6)


def test_zero_query_has_finite_gradient():
  """A zero query (e.g. a padded position after a bias-free projection) gives uniform weights and a
  finite gradient: the norm is clamped before the square root."""
  q = jnp.zeros((1, 4, 1, 8))
  k = jax.random.normal(jax.random.key(1), (1, 4, 1, 8))
  v = jax.random.normal(jax.random.key(2), (1, 4, 1, 3))
  attention = core.CosineAttention(core.CosineConfig())
  variables = attention.init(jax.random.key(0), q, k, v)
  grad = jax.grad(lambda q: attention.apply(variables, q, k, v).sum())(q)
  assert np.isfinite(np.asarray(grad)).all()
  np.testing.assert_allclose(attention.apply(variables, q, k, v)[0, 0, 0], v[0].mean(0)[0], rtol=1e-5)
