"""Linformer's heads-first layout computes what the former [B, L, H, k] einsums computed: the same
outputs and gradients to round-off, and, with attention dropout on, the same dropout bits (the mask is
drawn in the former layout), on padded inputs."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import _common as common
from tests.attention_probe import create, random_qkv
from tests.dense_reference import padded_mask


class FormerLayout(nn.Module):
  """The core before the layout change (same parameter E, same dropout stream)."""

  rate: float

  @nn.compact
  def __call__(self, query, key, value, mask, deterministic):
    length = query.shape[1]
    projection = self.param("E", nn.initializers.xavier_uniform(), (length, 4))
    m = mask[:, :, None, None]
    key = jnp.einsum("blhd,lm->bmhd", jnp.where(m, key, 0), projection)
    value = jnp.einsum("blhv,lm->bmhv", jnp.where(m, value, 0), projection)
    logits = common.dot_logits(query, key, "blhd,bmhd->blhm")
    return common.masked_attention(logits, jnp.ones((), bool), value, "blhm,bmhv->blhv",
                                   common.dropout_callback(self.rate, deterministic))


@pytest.mark.parametrize("rate,deterministic", [(0.0, True), (0.3, False)])
def test_equals_the_former_layout(rate, deterministic):
  q, k, v = random_qkv(0, 3, 50, 2, 8, 5)
  mask = jnp.asarray(padded_mask(3, 50, 7))
  core = create("linformer", k=4, dropout_rate=rate)
  variables = core.init(jax.random.key(0), q, k, v, mask)
  rngs = {"dropout": jax.random.key(1)}
  cotangent = jax.random.normal(jax.random.key(2), v.shape)

  def outputs(module, params):
    def loss(q, k, v):
      out = module.apply(params, q, k, v, mask, deterministic=deterministic, rngs=rngs)
      return jnp.sum(out * cotangent), out
    return jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)

  (grads, out) = outputs(core, variables)
  (former_grads, former_out) = outputs(FormerLayout(rate), {"params": {"E": variables["params"]["E"]}})
  if rate:  # dropout did drop something (else the comparison says nothing about the bits)
    assert not np.allclose(out, outputs(create("linformer", k=4), variables)[1], atol=1e-3)
  np.testing.assert_allclose(np.asarray(out), np.asarray(former_out), rtol=1e-5, atol=1e-6)
  for got, want in zip(grads, former_grads):  # float32 round-off, relative to the gradient's scale
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=1e-5 * np.abs(want).max())
