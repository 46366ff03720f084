"""H-Transformer-1D (Zhu & Soricut 2021): hierarchical attention with an H-matrix structure. O(L·Nr·(D+V)).

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
blocks of ``S`` = Nr (coarse) tokens at one level (``Q`` query / ``K`` key inside a block), ``C`` the
2·Nr keys of level 0 (own block and sibling block).

The sequence is padded to Nr·2^k positions. Level 0 splits it into blocks of Nr tokens; each block
attends exactly to itself and to its *sibling* (blocks 2m and 2m+1). At level l ≥ 1, Q, K and V are
coarsened by averaging groups of 2^l consecutive tokens, split again into blocks of Nr coarse tokens, and
each block attends its sibling block only. Every (query, key) pair is covered exactly once: at level 0
when their Nr-blocks are equal or siblings, else at the one level l where their (Nr·2^l)-blocks are
siblings. A coarse entry stands for all the fine pairs under it (the H-matrix approximation
``A_ij ≈ exp(q̄_I·k̄_J/√D)``): a coarse key counts for its ``c_J`` tokens, i.e. weight
``c_J·exp(q̄_I·k̄_J/√D)`` with value ``mean_J(v)`` (= the paper's sum-coarsened V). The levels share ONE
normalisation (sum of numerators / sum of denominators): each level keeps per-query unnormalised
statistics (max logit, numerator, denominator), and from the coarsest level down they are repeated ×2 to
the next finer level and merged with a running-max rescale (the paper's hierarchical interpolation), so
the work is Σ_l L/2^l·2Nr = O(L·Nr). Rows are non-negative and sum to 1.

Padding: coarse tokens average their real tokens only (``c_J`` = number of real tokens; a coarse key
with none gets zero weight), so padded contents never reach a real output.

There is no official code (lucidrains ``h-transformer-1d`` is one reading); this follows the paper.

Differences from the paper / that reading:

- Any length: padded to Nr·2^k internally (k = ⌈log₂(L/Nr)⌉) and masked.
- Coarse queries and keys average real tokens only; coarse values are mean × count (the paper's sum)
  with the count entering as ``log c_J`` in the logit, so padding changes nothing.
- ``causal=True`` raises ``NotImplementedError``: a coarse query averages 2^l positions, so the paper's
  sub-diagonal-only causal form lets a position's output depend on later queries of its group.
- Attention dropout drops unnormalised weights (numerators only): unbiased.
- Default Nr = 16 (the paper's LRA setting).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class HTransformer1DConfig(AttentionConfig):
  """H-Transformer-1D options.

  Attributes:
    block_size: Nr, the block size (in tokens of each level) of the exact diagonal blocks and of every
      level's sibling blocks.
  """

  family = "sparse"
  no_causal_form = "coarse queries average future positions"
  block_size: int = 16

  def __post_init__(self):
    if self.block_size < 1:
      raise ValueError("h_transformer_1d block_size must be >= 1")


def num_levels(length: int, block_size: int) -> int:
  """k: the padded length is block_size·2^k with 2^k ≥ ⌈L / block_size⌉ (levels 0 .. k−1)."""
  return max(0, math.ceil(math.log2(max(1, -(-length // block_size)))))


def sibling_index(num_blocks: int) -> np.ndarray:
  """int [N]: the sibling of block n is n xor 1 (2m <-> 2m+1)."""
  return np.arange(num_blocks) ^ 1


def level_stats(logits, allowed, values, dropout):
  """Unnormalised softmax statistics of ``logits`` [B, N, Q, H, K] over K: (max [B, N, Q, H], numerator
  [B, N, Q, H, V] with ``values`` [B, N, K, H, V], denominator [B, N, Q, H]); ``dropout`` drops weights
  in the numerator only."""
  masked = jnp.where(allowed, logits, _common.NEG_INF)
  peak = jax.lax.stop_gradient(jnp.max(masked, axis=-1))
  weights = jnp.exp(masked - peak[..., None]) * allowed
  numerator = jnp.einsum("bnqhk,bnkhv->bnqhv", dropout(weights), values)
  return peak, numerator, jnp.sum(weights, axis=-1)


def merge(fine, coarse):
  """Adds two sets of (max, numerator, denominator) over the same queries, rescaled to a common max."""
  top = jnp.maximum(fine[0], coarse[0])
  scale_f, scale_c = jnp.exp(fine[0] - top), jnp.exp(coarse[0] - top)
  return (top, fine[1] * scale_f[..., None] + coarse[1] * scale_c[..., None],
          fine[2] * scale_f + coarse[2] * scale_c)


def upsample(stats):
  """Each coarse query's statistics [B, L', H(, V)] repeated for its 2 finer queries -> [B, 2L', ...]."""
  return tuple(jnp.repeat(x, 2, axis=1) for x in stats)


@register_attention("h_transformer_1d", HTransformer1DConfig)
class HTransformer1DAttention(nn.Module):
  """Hierarchical (H-matrix) attention; see the module docstring."""

  config: HTransformer1DConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("h_transformer_1d: coarse queries average future positions, so there is "
                                "no causal form of this hierarchy")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    size, levels = cfg.block_size, num_levels(length, cfg.block_size)
    dtype, value_dtype = _common.accum_dtype(query, key), value.dtype
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value.astype(dtype), mask,
                                                         size * 2 ** levels)
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic) or (lambda w, _: w)
    stats = level_zero(query, key, value, mask, size, lambda w: drop(w, 0))
    counts = mask.astype(dtype)                     # real tokens per group, coarsened level by level
    sums = [x.astype(dtype) * counts[:, :, None, None] for x in (query, key, value)]
    coarse = []
    for level in range(1, levels):
      counts = counts.reshape(batch, -1, 2).sum(-1)
      sums = [x.reshape(batch, -1, 2, *x.shape[2:]).sum(2) for x in sums]
      means = [x / jnp.where(counts > 0, counts, 1.0)[:, :, None, None] for x in sums]
      coarse.append(sibling_level(*means, counts, size, lambda w, l=level: drop(w, l)))
    merged = None
    for level_result in reversed(coarse):          # coarsest first: interpolate down and merge
      merged = level_result if merged is None else merge(level_result, upsample(merged))
    if merged is not None:
      stats = merge(stats, upsample(merged))
    return _common.normalize(stats[1], stats[2])[:, :length].astype(value_dtype)


def _flatten(stats):
  """[B, N, Q, H(, V)] statistics -> [B, N·Q, H(, V)]."""
  return tuple(_blocks.from_blocks(x) for x in stats)


def level_zero(query, key, value, mask, size, dropout):
  """Exact attention of each Nr-block to itself and its sibling: statistics [B, L, H(, V)]."""
  num_blocks = query.shape[1] // size
  k_b, v_b, m_b = (_blocks.to_blocks(x, size) for x in (key, value, mask))
  if num_blocks > 1:
    sib = sibling_index(num_blocks)
    k_b, v_b, m_b = (jnp.concatenate([x, x[:, sib]], axis=2) for x in (k_b, v_b, m_b))  # C = 2Nr keys
  logits = _common.dot_logits(_blocks.to_blocks(query, size), k_b, "bnqhd,bnkhd->bnqhk")
  return _flatten(level_stats(logits, m_b[:, :, None, None, :], v_b, dropout))


def sibling_level(query, key, value, counts, size, dropout):
  """Coarse attention of each block of Nr coarse tokens to its sibling block, a coarse key weighted by
  its count of real tokens: statistics [B, L', H(, V)] over the coarse queries."""
  sib = sibling_index(query.shape[1] // size)
  k_b, v_b, c_b = (_blocks.to_blocks(x, size)[:, sib] for x in (key, value, counts))
  logits = _common.dot_logits(_blocks.to_blocks(query, size), k_b, "bnqhd,bnkhd->bnqhk")
  logits = logits + jnp.log(jnp.where(c_b > 0, c_b, 1.0))[:, :, None, None, :]
  return _flatten(level_stats(logits, (c_b > 0)[:, :, None, None, :], v_b, dropout))
