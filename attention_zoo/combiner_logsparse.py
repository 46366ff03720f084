"""Combiner-Logsparse (Ren et al., 2021): dyadic spans, O(L log L).

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``C`` aligned chunks of one level, ``W`` chunk width 2^l, ``P`` span slots per query (2 per level).

Level ``l`` cuts the sequence into aligned chunks ``[c 2^l, (c+1) 2^l)``. Query ``i`` (chunk index
``c = i >> l``) uses, at each level ``l < (L-1).bit_length()``:

- the chunk LEFT of its own, ``c - 1``, iff bit ``l`` of ``i`` is 1 (i.e. ``c`` is odd);
- bidirectional only: the chunk RIGHT of its own, ``c + 1``, iff bit ``l`` of ``i`` is 0 (the mirror
  image: bits of ``2^K - 1 - i``), when that chunk exists.

Direct = ``{i}``. The left chunks partition ``[0, i)`` (binary decomposition of ``i``) and the right
chunks partition ``(i, 2^K)``, so with ``K = (L-1).bit_length()`` levels every key is covered exactly
once (the released code uses ceil(log2(L-1)) levels and drops the prefix of the last query when
L = 2^k + 1). Per level the summaries cost O(L D); the joint softmax has 1 + 2K entries.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _combiner_common, _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class CombinerLogsparseConfig(AttentionConfig):
  """Attributes:
    abstraction: span pooling, one of ``_combiner_common.ABSTRACTIONS``.
  """

  family = "combiner"
  abstraction: str = "max"

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(the most over t ≤ L of the summaries a later query reads plus the raw tail): ≈ H·D·L at
    t = 2^(K−1) − 1. With K levels, a level whose bit of t is 0 has an unfinished chunk that the next
    chunk will read; its span value softmax(q̂·k) v waits for the chunk's pooled query q̂, so the raw
    keys/values of the longest such chunk (t mod 2^l) are kept, with a running query pool (D) per such
    level; a level whose bit is 1 keeps its finished left chunk's k̂, v̂ (2D; only v̂ when the chunk
    lies inside that raw tail, whose keys re-pool k̂, and nothing for a one-position chunk there)."""
    t = np.arange(length + 1, dtype=np.int64)
    levels = max(length - 1, 0).bit_length()
    tail = np.zeros_like(t)                 # raw positions kept: the longest unfinished chunk
    top = np.full_like(t, -1)               # its level (−1: none)
    pools = np.zeros_like(t)
    for level in range(levels):
      seen = t % (1 << level)               # positions of the level's current chunk so far
      unfinished = ((t >> level) & 1 == 0) & (seen > 0)
      tail, top = np.where(unfinished, seen, tail), np.where(unfinished, level, top)
      pools += unfinished
    finished = np.zeros_like(t)
    for level in range(levels):
      inside = level < top                  # the left chunk lies inside the raw tail
      cost = np.where(inside, 0 if level == 0 else head_dim, 2 * head_dim)
      finished += np.where((t >> level) & 1 == 1, cost, 0)
    return int(num_heads * np.max(finished + 2 * head_dim * tail + head_dim * pools))


def dyadic_spans(length: int, causal: bool) -> tuple[list[int], np.ndarray, np.ndarray]:
  """Static span tables. Returns (chunks per level, index [L, P] into the level-concatenated chunk
  list, valid bool [L, P]); P = K (causal) or 2K slots, K = (L-1).bit_length()."""
  levels = max(length - 1, 0).bit_length()
  pos = np.arange(length)
  counts, index, valid, offset = [], [], [], 0
  for level in range(levels):
    chunks = -(-length // (1 << level))
    own = pos >> level
    index.append(offset + np.maximum(own - 1, 0))
    valid.append(own % 2 == 1)
    if not causal:
      index.append(offset + np.minimum(own + 1, chunks - 1))
      valid.append((own % 2 == 0) & (own + 1 < chunks))
    counts.append(chunks)
    offset += chunks
  if not levels:
    return counts, np.zeros((length, 0), np.int32), np.zeros((length, 0), bool)
  return counts, np.stack(index, 1).astype(np.int32), np.stack(valid, 1)


@register_attention("combiner_logsparse", CombinerLogsparseConfig)
class CombinerLogsparseAttention(nn.Module):
  """Combiner-Logsparse core."""

  config: CombinerLogsparseConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    return _logsparse(
        query, key, value, mask,
        _combiner_common.AbstractionFeatures(cfg.abstraction, name="query_abstraction")(query),
        _combiner_common.AbstractionFeatures(cfg.abstraction, name="key_abstraction")(key),
        _combiner_common.dropout_rng(self, cfg.dropout_rate, deterministic), causal=cfg.causal,
        kind=_combiner_common.pool_kind(cfg.abstraction), dropout_rate=cfg.dropout_rate)


@functools.partial(jax.jit, static_argnames=("causal", "kind", "dropout_rate"))
def _logsparse(query, key, value, mask, fq, fk, rng, *, causal, kind, dropout_rate):
  """query, key, fq, fk (abstraction features): [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L]."""
  batch, length = query.shape[:2]
  counts, index, valid = dyadic_spans(length, causal)

  # Chunk summaries of every level, concatenated along the chunk axis: [B, sum_l C_l, H, D/V].
  k_hats, v_hats, nonempties = [], [], []
  for level, chunks in enumerate(counts):
    width = 1 << level

    def chunked(x, fill=0):  # called in this iteration only: the loop's width and chunks are meant
      x = _common.pad_axis(x, width, axis=1, value=fill)  # noqa: B023
      return x.reshape(batch, chunks, width, *x.shape[2:])  # noqa: B023            [B, C, W, ...]

    member = chunked(mask, False)                                 # [B, C, W]
    q_hat, _ = _combiner_common.pool(chunked(fq), member, 2, kind)
    k_hat, nonempty = _combiner_common.pool(chunked(fk), member, 2, kind)
    v_hats.append(_combiner_common.span_values(
        q_hat, chunked(key), chunked(value), member[:, :, None, :],
        "bchd,bcwhd->bchw", "bchw,bcwhv->bchv"))
    k_hats.append(k_hat)
    nonempties.append(nonempty)

  dtype = value.dtype
  self_logits = _common.dot_logits(query, key, "blhd,blhd->blh")[..., None]        # [B, L, H, 1]
  parts = [(self_logits, mask[:, :, None, None], lambda w: w * value)]  # self: one key
  if counts:
    k_span = jnp.take(jnp.concatenate(k_hats, 1), index, axis=1)                # [B, L, P, H, D]
    v_span = jnp.take(jnp.concatenate(v_hats, 1), index, axis=1)                # [B, L, P, H, V]
    span_ok = jnp.take(jnp.concatenate(nonempties, 1), index, axis=1) & valid    # [B, L, P]
    parts.append((_common.dot_logits(query, k_span, "blhd,blphd->blhp"), span_ok[:, :, None, :],
                  _common.contraction("blhp,blphv->blhv", v_span)))
  drop = _combiner_common.dropout_fn(dropout_rate, rng, len(parts))
  return _common.joint_masked_attention(parts, drop).astype(dtype)
