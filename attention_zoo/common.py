"""Helpers shared by the attention cores: masking, softmax, dropout, padding to a block multiple.

Axis legend used across the zoo: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim,
``V`` value dim, ``N`` number of blocks, ``S`` block size, ``K`` keys per query.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

# Logit given to a disallowed (query, key) pair before the softmax. Finite, so nothing becomes NaN;
# the softmax below also multiplies by the mask, so disallowed pairs get *exactly* zero weight.
NEG_INF = -1e30


def default_mask(mask: jax.Array | None, batch: int, length: int) -> jax.Array:
  """``mask`` as bool [B, L]; ``None`` means every position is a real token."""
  if mask is None:
    return jnp.ones((batch, length), dtype=bool)
  if mask.shape != (batch, length):
    raise ValueError(f"mask must have shape {(batch, length)}, got {mask.shape}")
  return mask.astype(bool)


def accum_dtype(*arrays: jax.Array):
  """float32, or wider when an input is wider (float64 reference tests): softmax/normalizer dtype."""
  return jnp.result_type(jnp.float32, *(a.dtype for a in arrays))


def masked_softmax(logits: jax.Array, allowed: jax.Array, axis: int = -1) -> jax.Array:
  """Softmax over ``axis`` restricted to ``allowed`` entries, computed in (at least) float32.

  Disallowed entries get exactly zero; a row with no allowed entry is all zeros (finite), which is what
  rows of fully-padded queries or empty spans need.
  """
  logits = jnp.where(allowed, logits.astype(accum_dtype(logits)), NEG_INF)
  peak = jax.lax.stop_gradient(jnp.max(logits, axis=axis, keepdims=True))
  weights = jnp.exp(logits - peak) * allowed
  total = jnp.sum(weights, axis=axis, keepdims=True)
  return weights / jnp.where(total > 0, total, 1.0)


def dot_logits(query: jax.Array, key: jax.Array, spec: str) -> jax.Array:
  """``einsum(spec, query, key) / sqrt(D)`` accumulated in float32 (D = last axis of ``query``)."""
  logits = jnp.einsum(spec, query, key, preferred_element_type=accum_dtype(query, key))
  return logits / math.sqrt(query.shape[-1])


def apply_dropout(probs: jax.Array, rate: float, deterministic: bool) -> jax.Array:
  """Attention dropout on probabilities, drawing from the flax ``"dropout"`` RNG stream."""
  if rate <= 0.0 or deterministic:
    return probs
  return nn.Dropout(rate=rate)(probs, deterministic=False)


def pad_axis(x: jax.Array, multiple: int, axis: int = 1, value=0) -> jax.Array:
  """Pads ``axis`` of ``x`` at the end up to a multiple of ``multiple``."""
  extra = (-x.shape[axis]) % multiple
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def causal_allowed(num_queries: int, num_keys: int) -> jax.Array:
  """bool [Q, K]: key j is visible from query i iff j <= i."""
  return jnp.arange(num_keys)[None, :] <= jnp.arange(num_queries)[:, None]


def module_path_hash(module: nn.Module) -> int:
  """Stable non-negative 31-bit hash of the module path (e.g. ``"encoder/layer_3/attention"``).

  Cores that draw a fixed random pattern from a config ``seed`` (Performer features, BigBird random
  blocks) fold this in, so every layer gets its own pattern, identical across runs and processes
  (``zlib.crc32``, not Python's randomized ``hash``). A top-level core has path ``()`` and hash 0.
  """
  import zlib  # local import: this helper is appended for an easy merge with parallel work

  return zlib.crc32("/".join(module.path).encode()) & 0x7FFFFFFF
