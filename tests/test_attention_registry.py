"""Registry-wide attention tests: every registered core gets these without writing a line.

Checked for each name in ``list_attentions()``: shapes (value_dim != head_dim), finite outputs and
gradients under jit, invariance to what padded tokens contain, zero weight on padded keys, the
effective-matrix probe (value = identity) against what the core's config declares (non-negative
weights, rows summing to 1, a fixed support), dropout, and — for cores that support it — causality.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from tests.attention_probe import create, init_and_apply, random_qkv

NAMES = attention_zoo.list_attentions()
LENGTH = 37  # deliberately not a multiple of any block size or a square
PAD = 9      # trailing padded positions in the padded-batch cases
LONG = 203   # the causal future/past check: several blocks of most cores' default sizes


def _padded_mask(batch: int, length: int, pad: int) -> jnp.ndarray:
  mask = np.ones((batch, length), bool)
  mask[0, length - pad:] = False  # first example padded, second full
  return jnp.asarray(mask)


def _causal_core(name):
  """The causal core, or skip when the method declares it cannot be causal (traced, not compiled)."""
  core = create(name, causal=True)
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  try:
    jax.eval_shape(lambda q, k, v: core.init(_RNGS, q, k, v), q, k, v)
  except NotImplementedError as err:
    pytest.skip(f"{name} has no causal form: {err}")
  return core


# The RNG streams of attention_probe.init_and_apply(seed=0), so both give the same draws.
_RNGS = {"params": jax.random.key(0), "dropout": jax.random.key(1), "attention": jax.random.key(2)}


def _compiled(core, q, k, v, mask=None):
  """(variables, apply): ``core`` initialised on these inputs and its ``apply(q, k, v, mask)`` under
  ``jax.jit`` — one compile per input shape instead of op-by-op dispatch (the probe feeds V = L)."""
  variables = jax.jit(lambda q, k, v, m: core.init(_RNGS, q, k, v, mask=m))(q, k, v, mask)
  rngs = {"dropout": _RNGS["dropout"], "attention": _RNGS["attention"]}
  return variables, jax.jit(lambda q, k, v, m=None: core.apply(variables, q, k, v, mask=m, rngs=rngs))


def _effective(core, q, k, mask=None) -> np.ndarray:
  """The effective matrix P [B, L, L] of ``core`` (value = identity; one head), compiled once."""
  batch, length = q.shape[:2]
  eye = jnp.broadcast_to(jnp.eye(length, dtype=q.dtype)[None, :, None, :], (batch, length, 1, length))
  _, apply = _compiled(core, q, k, eye, mask)
  return np.asarray(apply(q, k, eye, mask)[:, :, 0, :])


def test_registry_errors_are_clear():
  with pytest.raises(ValueError, match="known attentions: .*vanilla"):
    attention_zoo.create_attention("no_such_attention")
  with pytest.raises(TypeError, match="no_such_field"):
    attention_zoo.create_attention("vanilla", no_such_field=1)


@pytest.mark.parametrize("name", NAMES)
def test_config_is_frozen_with_causal_field(name):
  config = attention_zoo.attention_config(name)
  assert dataclasses.is_dataclass(config) and config.causal is False
  with pytest.raises(dataclasses.FrozenInstanceError):
    config.causal = True  # type: ignore[misc]


@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_finite_under_jit(name):
  core = create(name)
  q, k, v = random_qkv(1, 2, LENGTH, 3, 8, 5)  # value_dim (5) != head_dim (8)
  mask = _padded_mask(2, LENGTH, PAD)
  variables = core.init({"params": jax.random.key(0), "attention": jax.random.key(1)}, q, k, v, mask)
  out = jax.jit(lambda q, k, v, m: core.apply(variables, q, k, v, mask=m,
                                             rngs={"attention": jax.random.key(2)}))(q, k, v, mask)
  assert out.shape == (2, LENGTH, 3, 5)
  assert np.all(np.isfinite(np.asarray(out))), "outputs (including padded query rows) must be finite"


@pytest.mark.parametrize("name", NAMES)
def test_gradients_finite(name):
  core = create(name)
  q, k, v = random_qkv(2, 2, LENGTH, 2, 8, 8)
  mask = _padded_mask(2, LENGTH, PAD)
  _, variables = init_and_apply(core, q, k, v, mask)

  def loss(q, k, v):
    out = core.apply(variables, q, k, v, mask=mask, rngs={"attention": jax.random.key(0)})
    return jnp.sum(out * mask[:, :, None, None])

  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  assert np.any(np.asarray(grads[2]) != 0)


@pytest.mark.parametrize("name", NAMES)
def test_padding_contents_do_not_leak(name):
  """Whatever the padded positions hold, real outputs are unchanged."""
  core = create(name)
  q, k, v = random_qkv(3, 2, LENGTH, 2, 8, 8)
  mask = _padded_mask(2, LENGTH, PAD)
  _, apply = _compiled(core, q, k, v, mask)
  pad = ~np.asarray(mask)[:, :, None, None]
  q2, k2, v2 = (jnp.where(pad, 7.0 * x2 + 3.0, x) for x, x2 in zip((q, k, v), random_qkv(4, 2, LENGTH, 2, 8, 8)))
  real = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(apply(q, k, v, mask))[real], np.asarray(apply(q2, k2, v2, mask))[real],
                             rtol=2e-5, atol=2e-5)


def _check_declared_rows(name, p, real_rows):
  """The row properties ``name``'s config declares, on the real rows of P [L, L] or [B, L, L]."""
  config = attention_zoo.attention_config(name)
  if config.nonnegative:
    assert np.all(p[real_rows] >= -1e-6), f"{name} declares non-negative weights"
  if config.rows_sum_to_one:
    np.testing.assert_allclose(p.sum(-1)[real_rows], 1.0, atol=1e-4,
                               err_msg=f"{name} declares rows that sum to 1")


@pytest.mark.parametrize("name", NAMES)
def test_effective_matrix_declared_properties_and_zero_on_padding(name):
  q, k, _ = random_qkv(5, 2, LENGTH, 1, 8, 1)
  mask = _padded_mask(2, LENGTH, PAD)
  p = _effective(create(name), q, k, mask)
  real = np.asarray(mask)
  _check_declared_rows(name, p, real)
  padded_cols = p[0][:, ~real[0]]
  assert np.all(np.abs(padded_cols[real[0]]) < 1e-6), "real queries must put no weight on padded keys"


@pytest.mark.parametrize("name", NAMES)
def test_effective_matrix_within_declared_support(name):
  support = attention_zoo.attention_config(name).support(LENGTH)
  if support is None:
    pytest.skip(f"{name} declares no fixed support")
  assert support.shape == (LENGTH, LENGTH) and support.dtype == bool
  q, k, _ = random_qkv(5, 1, LENGTH, 1, 8, 1)
  p = _effective(create(name), q, k)[0]
  assert np.all(np.abs(p[~support]) < 1e-7), f"{name} puts weight outside its declared support"


@pytest.mark.parametrize("name", NAMES)
def test_dropout_uses_the_rng_stream(name):
  core = create(name, dropout_rate=0.5)
  q, k, v = random_qkv(6, 1, LENGTH, 2, 8, 8)
  det, variables = init_and_apply(core, q, k, v)
  drop_a, _ = init_and_apply(core, q, k, v, deterministic=False, variables=variables, seed=10)
  drop_b, _ = init_and_apply(core, q, k, v, deterministic=False, variables=variables, seed=10)
  np.testing.assert_array_equal(np.asarray(drop_a), np.asarray(drop_b))  # same keys, same result
  assert np.all(np.isfinite(np.asarray(drop_a)))
  assert not np.allclose(np.asarray(det), np.asarray(drop_a))


@pytest.mark.parametrize("name", NAMES)
def test_dropout_is_unbiased(name):
  """Averaged over 1024 dropout keys the output is the deterministic one (inverted dropout; the cores
  that defer the softmax normalization drop unnormalized weights and divide by the undropped sum).
  One sample is ~0.65 away (relative L2), the mean of 1024 ~0.02; a missing 1/(1-p) gives 0.3."""
  core = create(name, dropout_rate=0.3)
  q, k, v = random_qkv(7, 1, LENGTH, 2, 8, 8)
  det, variables = init_and_apply(core, q, k, v)
  sample = lambda key: core.apply(variables, q, k, v, deterministic=False,
                                  rngs={"dropout": key, "attention": jax.random.key(2)})
  mean = jax.jit(jax.vmap(sample))(jax.random.split(jax.random.key(3), 1024)).mean(0)
  assert float(jnp.linalg.norm(mean - det) / jnp.linalg.norm(det)) < 0.06


@pytest.mark.parametrize("name", NAMES)
def test_causal_never_looks_ahead(name):
  core = _causal_core(name)
  q, k, v = random_qkv(7, 1, LENGTH, 1, 8, 8)
  p = _effective(core, q, k)[0]
  assert np.all(np.abs(np.triu(p, 1)) < 1e-7), "causal weights above the diagonal"
  _check_declared_rows(name, p, np.ones(LENGTH, bool))
  # Perturbing the future leaves the past unchanged, at a length of several blocks / chunks / windows
  # for most cores (where a data-dependent grouping could carry the future into the past).
  q, k, v = random_qkv(9, 1, LONG, 1, 8, 8)
  cut = LONG // 2
  _, apply = _compiled(core, q, k, v)
  q2, k2, v2 = (x.at[:, cut:].add(5.0) for x in (q, k, v))
  np.testing.assert_allclose(np.asarray(apply(q, k, v))[:, :cut], np.asarray(apply(q2, k2, v2))[:, :cut],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_bfloat16_inputs_stay_finite(name):
  """Mixed precision (precision = "bfloat16"): bf16 q/k/v give finite outputs and finite gradients."""
  core = create(name)
  q, k, v = random_qkv(8, 2, LENGTH, 2, 8, 8, dtype=jnp.bfloat16, scale=3.0)  # large logits, too
  mask = _padded_mask(2, LENGTH, PAD)
  variables = jax.jit(core.init)({"params": jax.random.key(0), "attention": jax.random.key(1)}, q, k, v, mask)

  def loss(q, k, v):
    out = core.apply(variables, q, k, v, mask=mask, rngs={"attention": jax.random.key(0)})
    return jnp.sum(out.astype(jnp.float32) * mask[:, :, None, None]), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  assert out.shape == (2, LENGTH, 2, 8)
  assert np.all(np.isfinite(np.asarray(out, np.float32)))
  for g in grads:
    assert g.dtype == jnp.bfloat16
    assert np.all(np.isfinite(np.asarray(g, np.float32)))
