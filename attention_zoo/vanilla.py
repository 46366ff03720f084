"""Vanilla softmax attention: every query attends to every (allowed) key. O(L^2) time and memory.

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``V`` value dim.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class VanillaConfig(AttentionConfig):
  """Exact softmax attention; no extra options beyond ``causal`` and ``dropout_rate``."""


@register_attention("vanilla", VanillaConfig)
class VanillaAttention(nn.Module):
  """softmax(q k^T / sqrt(D) + mask) v."""

  config: VanillaConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    batch, length = query.shape[:2]
    mask = common.default_mask(mask, batch, length)
    logits = common.dot_logits(query, key, "bqhd,bkhd->bhqk")        # [B, H, Q, K]
    allowed = mask[:, None, None, :]                                  # [B, 1, 1, K]
    if self.config.causal:
      allowed = allowed & common.causal_allowed(length, length)[None, None]
    drop = common.dropout_callback(self.config.dropout_rate, deterministic)
    out = common.masked_attention(logits, allowed, jnp.swapaxes(value, 1, 2), "bhqk,bhkv->bhqv", drop)
    return jnp.swapaxes(out, 1, 2)                                    # [B, Q, H, V]
