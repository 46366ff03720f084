"""Nyströmformer's depthwise value convolution (a banded matmul over blocks): equal to its definition
(a sum of shifted, weighted copies, float64 numpy) and, values and gradients, to the grouped
``lax.conv_general_dilated`` it replaced, across block boundaries, ragged last blocks, L shorter than a
block and kernels longer than ``CONV_BLOCK``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import nystromformer

# (length, taps): one block (L < S), exact multiples, ragged last block, L < taps, taps - 1 > CONV_BLOCK.
CASES = [(37, 5), (128, 35), (301, 35), (200, 1), (20, 35), (150, 67), (2000, 35)]


def definition(value: np.ndarray, weights: np.ndarray) -> np.ndarray:
  """out[b, l, h, v] = Σ_t weights[t, h] value[b, l + t − T//2, h, v], zero outside [0, L)."""
  length, taps = value.shape[1], weights.shape[0]
  padded = np.pad(value, ((0, 0), (taps // 2, taps // 2), (0, 0), (0, 0)))
  return sum(weights[t][None, None, :, None] * padded[:, t:t + length] for t in range(taps))


def grouped_conv(value, weights):
  """The former implementation: ``lax.conv_general_dilated`` with one group per head."""
  batch, length, heads, dim = value.shape
  taps = weights.shape[0]
  x = jnp.transpose(value, (0, 3, 2, 1)).reshape(batch * dim, heads, length)
  kernel = jnp.transpose(weights, (1, 0))[:, None, :].astype(value.dtype)
  out = jax.lax.conv_general_dilated(x, kernel, (1,), [(taps // 2, taps // 2)],
                                     dimension_numbers=("NCH", "OIH", "NCH"), feature_group_count=heads)
  return jnp.transpose(out.reshape(batch, dim, heads, length), (0, 3, 2, 1))


def inputs(length, taps, dtype=np.float64, batch=2, heads=2, dim=3):
  rng = np.random.default_rng(length * 100 + taps)
  return rng.normal(size=(batch, length, heads, dim)).astype(dtype), rng.normal(size=(taps, heads)).astype(dtype)


@pytest.mark.parametrize("length,taps", CASES)
def test_equals_the_definition(x64, length, taps):
  value, weights = inputs(length, taps)
  out = np.asarray(nystromformer.depthwise_conv(jnp.asarray(value), jnp.asarray(weights)))
  assert out.shape == value.shape
  np.testing.assert_allclose(out, definition(value, weights), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("length,taps", CASES)
def test_gradients_equal_the_grouped_convolution(x64, length, taps):
  value, weights = (jnp.asarray(x) for x in inputs(length, taps))
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=value.shape))

  def grads(conv):
    return jax.grad(lambda v, w: jnp.sum(conv(v, w) * cotangent), argnums=(0, 1))(value, weights)

  for got, want in zip(grads(nystromformer.depthwise_conv), grads(grouped_conv)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-11, atol=1e-11)


def test_float32_at_the_xiong_shape_equals_the_grouped_convolution_to_round_off():
  """B 2 of the xiong ListOps shape (L 2000, 2 heads of 32, 35 taps), float32, under jit."""
  rng = np.random.default_rng(0)
  value = jnp.asarray(rng.normal(size=(2, 2000, 2, 32)), jnp.float32)
  weights = jnp.asarray(rng.uniform(-35 ** -0.5, 35 ** -0.5, size=(35, 2)), jnp.float32)
  got = jax.jit(nystromformer.depthwise_conv)(value, weights)
  np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(grouped_conv)(value, weights)),
                             rtol=1e-5, atol=1e-5)
