"""Adaptive span: the banded core equals the definition (dense softmax, times the ramp mask over
|i − j| < max_span, renormalised) at odd lengths with padding; the ramp's shape; the span parameter gets
a gradient; the sown penalty is loss_coeff · max_span · mean(current_val)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import adaptive_span
from tests.attention_probe import create, random_qkv
from tests.dense_reference import padded_mask


@np.errstate(invalid="ignore")
def reference(q, k, v, mask, span_vals, max_span, ramp, causal):
  """Definition in float64: softmax over real keys, times m(x) (x < max_span), renormalised."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  length = q.shape[1]
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(np.asarray(mask)[:, None, None, :], logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  x = np.arange(length)[:, None] - np.arange(length)[None, :]
  visible = (x >= 0) if causal else np.ones_like(x, bool)
  x = np.abs(x)
  z = np.clip(np.asarray(span_vals, np.float64), 0, 1)[:, None, None] * max_span
  m = np.clip((ramp + z - x) / ramp, 0, 1) * ((x < max_span) & visible)       # [H, L, L]
  probs = probs * m  # padded query rows far from real keys may be 0/0: never compared
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhv->bqhv", probs, v)


def apply(core, params, q, k, v, mask):
  return jax.jit(lambda p, q, k, v, m: core.apply(p, q, k, v, mask=m))(params, q, k, v, mask)


@pytest.mark.parametrize("length, causal, middle", [(37, False, False), (45, False, True), (45, True, True)])
def test_matches_definition(x64, length, causal, middle):
  max_span, ramp = 9, 4
  q, k, v = random_qkv(0, 2, length, 3, 4, 3, dtype=jnp.float64)
  mask = padded_mask(2, length, 7)
  if middle:
    mask[1, 10:14] = False
  span_vals = np.array([0.1, 0.45, 1.3])  # one above 1: clipped
  core = create("adaptive_span", max_span=max_span, ramp=ramp, causal=causal)
  params = {"params": {"current_val": jnp.asarray(span_vals)}}
  out = apply(core, params, q, k, v, mask)
  expected = reference(q, k, v, mask, span_vals, max_span, ramp, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_ramp_mask_shape():
  distance = jnp.arange(12.0)
  np.testing.assert_allclose(adaptive_span.ramp_mask(distance, 5.0, 4),
                             [1, 1, 1, 1, 1, 1, .75, .5, .25, 0, 0, 0])


def test_span_gradient_and_penalty():
  core = create("adaptive_span", max_span=16, ramp=8, loss_coeff=0.01)
  q, k, v = random_qkv(1, 1, 40, 2, 4, 4)
  params = {"params": {"current_val": jnp.array([0.2, 0.6])}}

  def loss(p):
    out, state = core.apply(p, q, k, v, mutable=["losses"])
    return jnp.sum(out * v), state["losses"]["span_penalty"][0]

  (_, penalty), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  np.testing.assert_allclose(penalty, 0.01 * 16 * 0.4, rtol=1e-6)
  assert np.all(np.abs(np.asarray(grads["params"]["current_val"])) > 1e-6)


def test_initial_span_is_the_ramp():
  """init_val = 0: z = 0, so only distances < R get weight; with q = k = 0 the row is the ramp."""
  zeros = jnp.zeros((1, 40, 1, 4))
  core = create("adaptive_span", max_span=32, ramp=4)
  params = jax.jit(core.init)(jax.random.key(0), zeros, zeros, zeros)
  eye = jnp.eye(40)[None, :, None, :]
  p = np.asarray(apply(core, params, zeros, zeros, eye, None))[0, :, 0]
  row = np.array([.25, .5, .75, 1, .75, .5, .25])
  np.testing.assert_allclose(p[20, 17:24], row / row.sum(), rtol=1e-6)
  assert np.all(p[20, :17] == 0) and np.all(p[20, 24:] == 0)
