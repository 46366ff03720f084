"""Combiner-Learnable (Ren et al., 2021): a routing-style learned partition. Bidirectional only.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``K`` clusters, ``N`` chunks of the sorted sequence, ``S`` chunk size, ``G`` = B*H (heads folded into
the batch, since every head sorts differently).

Per head, every position gets a routing feature ``x_i = normalize(normalize(q_i) + normalize(k_i))`` and
joins the nearest of K unit centroids (spherical k-means, as the Routing Transformer). Positions are
stably sorted by cluster (padding gets a sentinel cluster and sorts last, so padded tokens never share
a chunk with real ones unless a chunk straddles the boundary, where they are masked anyway) and cut
into N equal chunks of S ~ sqrt(L), so all shapes are static. Then Combiner on the chunks: direct = the
query's own chunk, spans = every other chunk (max-pooled summaries, within-span softmax), one joint
softmax: an exact partition of all real keys. Cost O(L log L + L (S + N) D).

Centroids live in the non-trainable collection ``"centroids"`` (``means``: [H, K, D], random unit
vectors from the ``params`` RNG at init; the k-means machinery is ``attention_zoo._clustering``, shared
with the Routing core). They are updated by an exponential moving average of the assigned features
only when the caller makes that collection mutable (whatever ``deterministic`` is)::

    out, updates = core.apply(variables, q, k, v, mask, deterministic=False, rngs=...,
                              mutable=["centroids"])
    variables = {**variables, **updates}

With ``mutable=False`` (evaluation) the core runs with the stored centroids and changes nothing.
Causal attention is not supported (a sorted chunk mixes past and future): ``NotImplementedError``.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _blocks, _clustering, _combiner_common, _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class CombinerLearnableConfig(AttentionConfig):
  """Attributes:
    num_clusters: K centroids per head.
    chunk_size: S; ``None`` = ceil(sqrt(L)).
    decay: EMA decay of the centroid update (``mutable=["centroids"]`` only).
    abstraction: span pooling, one of ``_combiner_common.ABSTRACTIONS``.
  """

  family = "combiner"
  no_causal_form = "it sorts tokens by cluster, so a chunk mixes past and future tokens"
  num_clusters: int = 8
  chunk_size: int | None = None
  decay: float = 0.999
  abstraction: str = "max"


def routing_features(query: jax.Array, key: jax.Array) -> jax.Array:
  """[B, L, H, D] unit routing features (float32 or wider, no gradient)."""
  acc = _common.accum_dtype(query, key)
  return jax.lax.stop_gradient(_clustering.unit(_clustering.unit(query.astype(acc))
                                               + _clustering.unit(key.astype(acc))))


@register_attention("combiner_learnable", CombinerLearnableConfig)
class CombinerLearnableAttention(nn.Module):
  """Combiner-Learnable core."""

  config: CombinerLearnableConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("combiner_learnable sorts tokens by cluster, so a chunk mixes past and "
                                "future tokens; it has no causal form")
    batch, length, heads, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    clusters = cfg.num_clusters

    means = _clustering.centroid_variable(self, heads, clusters, dim)
    feats = routing_features(query, key)                                       # [B, L, H, D]
    assign = _clustering.nearest(_clustering.similarities(feats, means.value), mask)  # [B, H, L]
    if _clustering.may_update(self):
      _clustering.ema_update(means, feats, assign, cfg.decay)

    size = cfg.chunk_size or _blocks.sqrt_block_size(length)
    fq = _combiner_common.AbstractionFeatures(cfg.abstraction, name="query_abstraction")(query)
    fk = _combiner_common.AbstractionFeatures(cfg.abstraction, name="key_abstraction")(key)
    return _sorted_combiner(query, key, value, mask, fq, fk, assign,
                            _combiner_common.dropout_rng(self, cfg.dropout_rate, deterministic),
                            size=size, clusters=clusters,
                            kind=_combiner_common.pool_kind(cfg.abstraction),
                            dropout_rate=cfg.dropout_rate)


@functools.partial(jax.jit, static_argnames=("size", "clusters", "kind", "dropout_rate"))
def _sorted_combiner(query, key, value, mask, fq, fk, assign, rng, *, size, clusters, kind,
                     dropout_rate):
  """Sorts each head by cluster ``assign`` [B, H, L], runs block Combiner on chunks of ``size``, unsorts.

  query, key, fq, fk: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V].
  """
  batch, length, heads = query.shape[:3]
  assign = _common.pad_axis(assign, size, axis=2, value=clusters)             # [B, H, Lp]
  order = jnp.argsort(assign, axis=-1, stable=True)                          # [B, H, Lp]
  padded = assign.shape[-1]

  def sort(x, fill=0):
    """[B, L, H, ...] -> sorted per head, folded: [G, N, S, 1, ...]."""
    x = jnp.moveaxis(_common.pad_axis(x, size, axis=1, value=fill), 2, 1)     # [B, H, Lp, ...]
    idx = order.reshape(order.shape + (1,) * (x.ndim - 3))
    x = jnp.take_along_axis(x, idx, axis=2)
    return x.reshape(batch * heads, padded // size, size, 1, *x.shape[3:])

  valid = sort(jnp.broadcast_to(mask[:, :, None], (batch, length, heads)), False)[:, :, :, 0]
  out = _combiner_common.block_combiner(
      sort(query), sort(key), sort(value), valid, sort(fq), sort(fk), rng, causal=False,
      num_summary=0, kind=kind, dropout_rate=dropout_rate)                   # [G, N, S, 1, V]
  out = out.reshape(batch, heads, padded, -1)
  out = jnp.take_along_axis(out, jnp.argsort(order, axis=-1)[..., None], axis=2)  # unsort
  return jnp.moveaxis(out, 1, 2)[:, :length]
