"""``temperature_nnx``: softmax attention with a learned per-head temperature, written as a ``flax.nnx``
module (an example of the NNX plugin style; README "Add your own attention").

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``V`` value dim.

``softmax(t_h * q k^T / sqrt(D) + masks) v`` with ``t_h = exp(log_t_h)``, ``log_t_h`` a learned
parameter per head starting at 0 (plain softmax attention at initialisation). lra-bench builds the
module as ``TemperatureAttention(config, rngs=rngs)`` inside its linen model through
``flax.nnx.bridge.ToLinen``: ``log_temperature`` becomes a linen parameter and trains with the model;
attention dropout draws from the model's ``dropout`` stream.

Load it with ``--plugin temperature_nnx`` (this folder on ``PYTHONPATH``)::

  PYTHONPATH=examples/plugin_styles lra-bench check temperature_nnx --plugin temperature_nnx --quick
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class TemperatureConfig(AttentionConfig):
  """Softmax over keys: P >= 0, real rows sum to 1, no fixed support (the inherited declarations).

  Attributes:
    max_heads: the number of per-head temperatures allocated; a model with more heads is refused.
  """

  max_heads: int = 64


@register_attention("temperature_nnx", TemperatureConfig)
class TemperatureAttention(nnx.Module):
  """softmax(exp(log_t_h) * q k^T / sqrt(D) + masks) v with a learned log-temperature per head."""

  def __init__(self, config: TemperatureConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.log_temperature = nnx.Param(jnp.zeros((config.max_heads,), jnp.float32))  # [max_heads]
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)

  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] (True = real) -> [B, L, H, V]."""
    batch, length, heads = query.shape[:3]
    if heads > self.config.max_heads:
      raise ValueError(f"temperature_nnx: {heads} heads, more than max_heads={self.config.max_heads}")
    mask = jnp.ones((batch, length), bool) if mask is None else mask.astype(bool)
    dtype = jnp.result_type(jnp.float32, query.dtype)
    scale = jnp.exp(self.log_temperature[...][:heads]).astype(dtype) / math.sqrt(query.shape[-1])  # [H]
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=dtype) * scale[:, None, None]
    allowed = mask[:, None, None, :]                                           # [B, 1, 1, K]
    if self.config.causal:
      allowed = allowed & (jnp.arange(length)[None, :] <= jnp.arange(length)[:, None])
    logits = jnp.where(allowed, logits, -1e30)
    peak = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    weights = jnp.exp(logits - peak) * allowed                                 # exact zeros where masked
    total = jnp.sum(weights, axis=-1, keepdims=True)
    weights = weights / jnp.where(total > 0, total, 1.0)                       # [B, H, Q, K]
    weights = self.dropout(weights, deterministic=deterministic)
    out = jnp.einsum("bhqk,bkhv->bqhv", weights.astype(value.dtype), value, preferred_element_type=dtype)
    return out.astype(value.dtype)
