"""Vanilla softmax attention: every query attends to every (allowed) key. O(L^2) time and memory.

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``V`` value dim.

Layout: logits [B, H, Q, K], except at batch 1, where the size-1 batch axis is dropped ([H, Q, K]).
With a size-1 leading axis XLA:CPU lays the 4-D logits out so that the key gradient needs a transposed
copy of the [Q, K] weight gradient and the forward a transposed key; without it, it contracts the
weight gradient in place (one fewer L² pass). Measured fwd+bwd, B=1, H=4, D=64, L=1024: 59 ms against
108 ms with the 4-D layout (faster than ``jax.nn.dot_product_attention``). At batch 8 the 4-D layout is
kept: merging B and H into one axis there was ~10% slower (``scripts/compare_kernels.py``). Both layouts
apply the same padding and causal masks.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class VanillaConfig(AttentionConfig):
  """Exact softmax attention; no extra options beyond ``causal`` and ``dropout_rate``."""

  family = "exact"

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·L: the keys and values of every past position (the KV cache)."""
    return 2 * num_heads * head_dim * length


@register_attention("vanilla", VanillaConfig)
class VanillaAttention(nn.Module):
  """softmax(q k^T / sqrt(D) + mask) v."""

  config: VanillaConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    batch, length, heads = query.shape[:3]
    mask = _common.default_mask(mask, batch, length)
    # Batch 1: the size-1 batch axis is dropped (see the module docstring: layout).
    lead, unbatch = ("", lambda x: x[0]) if batch == 1 else ("b", lambda x: x)
    logits = _common.dot_logits(unbatch(query), unbatch(key), f"{lead}qhd,{lead}khd->{lead}hqk")
    allowed = unbatch(mask[:, None, None, :])                                 # [(B,) 1, 1, K]
    if self.config.causal:
      allowed = allowed & _common.causal_allowed(length, length)
    drop = _common.dropout_callback(self.config.dropout_rate, deterministic)
    value = jnp.swapaxes(unbatch(value), -3, -2)                              # [(B,) H, K, V]
    out = _common.masked_attention(logits, allowed, value, f"{lead}hqk,{lead}hkv->{lead}hqv", drop)
    return jnp.swapaxes(out, -3, -2).reshape(batch, length, heads, -1)       # [B, Q, H, V]
