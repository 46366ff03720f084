"""``softplus_function``: attention weights proportional to ``softplus(q k^T / sqrt(D))`` instead of
``exp``, written as a plain parameter-free function (an example of the function plugin style; README
"Add your own attention").

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``V`` value dim.

``P_ij = softplus(s_ij) / sum_j' softplus(s_ij')`` over the real (and, when causal, past) keys, with
``s = q k^T / sqrt(D)``: nonnegative rows that sum to one, like softmax, but growing linearly rather
than exponentially in the logit. The function declares the keywords it needs: ``config`` (for
``causal`` and ``dropout_rate``) and ``dropout_rng`` (a key of the model's ``dropout`` stream while
training, None otherwise); lra-bench wraps it into a linen module.

Load it with ``--plugin softplus_function`` (this folder on ``PYTHONPATH``)::

  PYTHONPATH=examples/plugin_styles lra-bench check softplus_function --plugin softplus_function --quick
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class SoftplusConfig(AttentionConfig):
  """Nonnegative weights normalised over keys: the inherited declarations (P >= 0, rows sum to 1)."""


@register_attention("softplus_function", SoftplusConfig)
def softplus_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array, *,
                       config: SoftplusConfig, dropout_rng: jax.Array | None = None) -> jax.Array:
  """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] (True = real) -> [B, L, H, V]."""
  length = query.shape[1]
  dtype = jnp.result_type(jnp.float32, query.dtype)
  logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=dtype) / math.sqrt(query.shape[-1])
  allowed = mask[:, None, None, :]                                             # [B, 1, 1, K]
  if config.causal:
    allowed = allowed & (jnp.arange(length)[None, :] <= jnp.arange(length)[:, None])
  weights = jnp.where(allowed, jax.nn.softplus(logits), 0.0)                   # exact zeros where masked
  total = jnp.sum(weights, axis=-1, keepdims=True)
  weights = weights / jnp.where(total > 0, total, 1.0)                         # [B, H, Q, K]
  if dropout_rng is not None:  # training: inverted dropout, unbiased
    keep = jax.random.bernoulli(dropout_rng, 1.0 - config.dropout_rate, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - config.dropout_rate), 0.0)
  out = jnp.einsum("bhqk,bkhv->bqhv", weights.astype(value.dtype), value, preferred_element_type=dtype)
  return out.astype(value.dtype)
