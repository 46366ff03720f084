"""``my_attention``: scaled cosine attention (Liu et al. 2022, Swin Transformer V2, Eq. 2).

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``V`` value dim.

The logit of (query i, key j) is the cosine of the angle between them times a learned per-head scale,
``s_h * cos(q_i, k_j)``, instead of ``q_i . k_j / sqrt(D)``; then softmax over keys. The paper keeps the
temperature ``1 / s_h`` above 0.01 (``s_h = exp(min(log_s_h, log 100))``) and starts it at 0.1 (``s_h =
10``); bounded logits keep attention from collapsing onto a few keys in large models. The paper's
relative position bias ``B_ij`` belongs to the model, not to the core, and is left out.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.registry import AttentionConfig, register_attention

EPS = 1e-12  # the smallest norm a query or key is divided by (a zero vector stays zero)


@dataclasses.dataclass(frozen=True)
class CosineConfig(AttentionConfig):
  """Softmax over keys, so the inherited declarations hold: P >= 0, real rows sum to 1, no fixed
  support pattern.

  Attributes:
    init_scale: the per-head logit scale ``s_h`` at initialisation (paper: 10).
    max_scale: the largest ``s_h`` the learned value is clipped to (paper: 100, temperature 0.01).
  """

  init_scale: float = 10.0
  max_scale: float = 100.0


def unit(x: jax.Array, dtype) -> jax.Array:
  """``x / max(|x|, EPS)`` over the last axis, in ``dtype``. The norm is ``sqrt(max(|x|^2, EPS^2))``,
  the same value, so the gradient stays finite at a zero vector."""
  x = x.astype(dtype)
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), EPS * EPS))


@register_attention("my_attention", CosineConfig)
class CosineAttention(nn.Module):
  """softmax(s_h * cos(q_i, k_j) + masks) v with a learned, clipped per-head scale ``s_h``."""

  config: CosineConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] (True = real) -> [B, L, H, V]."""
    batch, length, heads = query.shape[:3]
    mask = jnp.ones((batch, length), bool) if mask is None else mask.astype(bool)
    dtype = jnp.result_type(jnp.float32, query.dtype)  # float32 for bf16 inputs, float64 in references
    log_scale = self.param("log_scale", nn.initializers.constant(math.log(self.config.init_scale)),
                           (heads,), jnp.float32)
    scale = jnp.exp(jnp.minimum(log_scale, math.log(self.config.max_scale))).astype(dtype)  # [H]
    cosine = jnp.einsum("bqhd,bkhd->bhqk", unit(query, dtype), unit(key, dtype))
    logits = cosine * scale[None, :, None, None]                               # [B, H, Q, K]
    allowed = mask[:, None, None, :]
    if self.config.causal:
      allowed = allowed & (jnp.arange(length)[None, :] <= jnp.arange(length)[:, None])
    return _softmax_values(logits, allowed, value, self.config.dropout_rate, deterministic)


def _softmax_values(logits: jax.Array, allowed: jax.Array, value: jax.Array, dropout_rate: float,
                    deterministic: bool) -> jax.Array:
  """softmax over allowed keys (exact zeros elsewhere; a row with none is zero), dropout, then the
  weighted values [B, Q, H, V] in the values' dtype. Call from inside a compact module (dropout)."""
  logits = jnp.where(allowed, logits, -1e30)
  weights = jnp.exp(logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))) * allowed
  total = jnp.sum(weights, axis=-1, keepdims=True)
  weights = nn.Dropout(dropout_rate)(weights / jnp.where(total > 0, total, 1.0), deterministic=deterministic)
  out = jnp.einsum("bhqk,bkhv->bqhv", weights.astype(value.dtype), value,
                   preferred_element_type=logits.dtype)
  return out.astype(value.dtype)
