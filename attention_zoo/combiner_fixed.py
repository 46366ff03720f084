"""Combiner-Fixed (Ren et al., 2021): the Sparse Transformer "fixed" pattern with full attention.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``N`` blocks (query block ``n``, other block ``z``), ``S`` block size (offsets ``s``, ``t``),
``C`` summary positions per block.

The sequence is cut into N blocks of S ~ sqrt(L) (padded internally, padding masked). For the query at
offset ``s`` of block ``n``:

- ``direct="sparse"`` (default, the paper's Fig. 1): direct = the Sparse-Fixed support, i.e. the own
  block plus the last ``num_summary`` positions of every other block; each other block minus those
  positions is one span. S + N*C + N logits per query.
- ``direct="block"`` (the released code's form): direct = the own block; every other whole block is one
  span. S + N logits per query.

Either way direct set and spans partition all real keys exactly (the released bidirectional TF code also
adds the own block's summary, counting it twice; not done here). Causal: the own block up to the query,
and only earlier blocks' summary positions and spans. Cost O(L (S + N C + N) D) = O(L sqrt(L)).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from attention_zoo import _blocks, _combiner_common, _common
from attention_zoo.registry import AttentionConfig, peak_over_prefixes, register_attention


@dataclasses.dataclass(frozen=True)
class CombinerFixedConfig(AttentionConfig):
  """Attributes:
    block_size: S; ``None`` = ceil(sqrt(L)).
    num_summary: C, the trailing positions of each block kept as direct "summary" keys
      (``direct="sparse"``).
    direct: ``"sparse"`` (Sparse-Fixed support direct) or ``"block"`` (own block only, as the released
      code).
    abstraction: span pooling, one of ``_combiner_common.ABSTRACTIONS``.
  """

  family = "combiner"
  block_size: int | None = None
  num_summary: int = 1
  direct: str = "sparse"
  abstraction: str = "max"

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(the most over t ≤ L of 2D·(C + 1)·⌊t/S⌋ + 2D·(t mod S) + D): per finished block its C summary
    keys/values (``direct="sparse"``; C = 0 for ``"block"``) and its span summary k̂, v̂; the current
    block's raw keys/values (its direct part, and the inputs of its span value softmax(q̂·k) v, which
    waits for the block's pooled query q̂); that running query pool (D)."""
    size = self.block_size or _blocks.sqrt_block_size(length)
    summary = min(self.num_summary, size) if self.direct == "sparse" else 0
    spans = 1 if summary < size else 0      # a block whose every position is a summary has no span
    past = peak_over_prefixes(
        length, size, lambda t: 2 * head_dim * ((summary + spans) * (t // size) + t % size) + spans * head_dim)
    return num_heads * past


@register_attention("combiner_fixed", CombinerFixedConfig)
class CombinerFixedAttention(nn.Module):
  """Combiner-Fixed core."""

  config: CombinerFixedConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.direct not in ("sparse", "block"):
      raise ValueError(f"direct must be 'sparse' or 'block', got {cfg.direct!r}")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    size = cfg.block_size or _blocks.sqrt_block_size(length)
    q, k, v, valid = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    qb, kb = _blocks.to_blocks(q, size), _blocks.to_blocks(k, size)
    out = _combiner_common.block_combiner(
        qb, kb, _blocks.to_blocks(v, size), _blocks.to_blocks(valid, size),
        _combiner_common.AbstractionFeatures(cfg.abstraction, name="query_abstraction")(qb),
        _combiner_common.AbstractionFeatures(cfg.abstraction, name="key_abstraction")(kb),
        _combiner_common.dropout_rng(self, cfg.dropout_rate, deterministic),
        causal=cfg.causal, num_summary=cfg.num_summary if cfg.direct == "sparse" else 0,
        kind=_combiner_common.pool_kind(cfg.abstraction), dropout_rate=cfg.dropout_rate)
    return _blocks.from_blocks(out)[:, :length]
