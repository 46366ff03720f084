"""Sparse Transformer "fixed" pattern (Child et al. 2019), merged heads. O(L·(l + c'·L/l)) cost.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
blocks of length ``l`` (``Q`` query / ``K`` key position inside a block), ``J`` summary keys (c' per
block, N·c' in all).

Query i may attend key j iff

    ⌊i/l⌋ = ⌊j/l⌋                     (own block, "Fixed1")
    or  j mod l ≥ l − c               (summary columns, "Fixed2")
    or  (first_column and j mod l = 0)  (LRA's extra column)

ANDed with ``j ≤ i`` when causal and with the key padding mask; both patterns share one softmax and all
heads use the union ("merged head" option). Efficient form: each query block attends to its own l keys
plus the N·c' summary keys gathered once (shared by every query); the summary keys of the query's own
block are masked in the summary part (they are already in the own block), so nothing counts twice.

Differences from LRA ``sparse_attention.py``:

- Bidirectional by default (LRA ANDed every pattern with ``j ≤ i`` even in its encoders); ``causal=True``
  gives the causal pattern.
- No dense L×L masked attention: gathers, as above.
- Defaults derived from the length: ``l = ceil(√L)`` and ``c = min(8, max(1, l // 4))`` (c stays
  constant for long inputs so the summary set grows like √L and the cost like L^1.5). LRA used
  ``l=50, c=10, first_column=True`` (module default l=128, c=32): pass them explicitly for parity.
- No CLS row/column of ones: the harness's models pool without a CLS token at position 0 (a CLS token,
  if any, is an ordinary position here).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import blocks, common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class SparseFixedConfig(AttentionConfig):
  """Sparse-Fixed options.

  Attributes:
    block_len: l, the block (stride) length; ``None`` = ``ceil(√L)``.
    summary: c, summary columns at the end of each block; ``None`` = ``min(8, max(1, l // 4))``.
    first_column: also make column ``j mod l = 0`` a summary column (LRA's variant).
  """

  block_len: int | None = None
  summary: int | None = None
  first_column: bool = False

  def __post_init__(self):
    if self.block_len is not None and self.block_len < 1:
      raise ValueError("sparse_fixed block_len must be >= 1")
    if self.summary is not None and self.summary < 0:
      raise ValueError("sparse_fixed summary must be >= 0")


def pattern_sizes(length: int, block_len: int | None = None, summary: int | None = None) -> tuple[int, int]:
  """(l, c) used at this length: the configured values or the length-derived defaults."""
  block = block_len or blocks.sqrt_block_size(length)
  return block, min(block, summary if summary is not None else min(8, max(1, block // 4)))


def summary_offsets(block_len: int, summary: int, first_column: bool) -> np.ndarray:
  """Sorted offsets inside a block that are summary columns: ``l−c .. l−1`` (and 0)."""
  offsets = set(range(block_len - summary, block_len))
  if first_column:
    offsets.add(0)
  return np.array(sorted(offsets), np.int32)


@register_attention("sparse_fixed", SparseFixedConfig)
class SparseFixedAttention(nn.Module):
  """Own block + summary columns, one softmax, computed with gathers."""

  config: SparseFixedConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = common.default_mask(mask, batch, length)
    size, summary = pattern_sizes(length, cfg.block_len, cfg.summary)
    query, key, value, mask = blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    num_blocks = query.shape[1] // size
    offsets = summary_offsets(size, summary, cfg.first_column)
    summary_pos = (np.arange(num_blocks)[:, None] * size + offsets).reshape(-1)   # [J]
    summary_block = summary_pos // size
    positions = np.arange(num_blocks * size).reshape(num_blocks, size)            # [N, S]

    q_blocks = blocks.to_blocks(query, size)                                       # [B, N, Q, H, D]
    own_logits = common.dot_logits(q_blocks, blocks.to_blocks(key, size), "bnqhd,bnkhd->bhnqk")
    own_allowed = blocks.to_blocks(mask, size)[:, None, :, None, :]               # [B, 1, N, 1, K]
    sum_logits = common.dot_logits(q_blocks, key[:, summary_pos], "bnqhd,bjhd->bhnqj")
    sum_allowed = (mask[:, summary_pos][:, None, None, None, :]                    # [B, 1, 1, 1, J]
                   & (summary_block != np.arange(num_blocks)[:, None])[:, None, :])  # [N, 1, J]
    if cfg.causal:
      own_allowed = own_allowed & common.causal_allowed(size, size)
      sum_allowed = sum_allowed & (summary_pos <= positions[:, :, None])            # [N, Q, J]
    v_blocks, v_summary = blocks.to_blocks(value, size), value[:, summary_pos]
    out = common.joint_masked_attention([                                             # [B, H, N, Q, V]
        (own_logits, own_allowed, common.contraction("bhnqk,bnkhv->bhnqv", v_blocks)),
        (sum_logits, sum_allowed, common.contraction("bhnqj,bjhv->bhnqv", v_summary)),
    ], common.dropout_callback(cfg.dropout_rate, deterministic))
    out = jnp.transpose(out, (0, 2, 3, 1, 4)).astype(value.dtype)                     # [B, N, Q, H, V]
    return blocks.from_blocks(out)[:, :length]
