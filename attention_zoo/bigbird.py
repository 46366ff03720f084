"""BigBird block-sparse attention (Zaheer et al. 2020; ITC pattern as in LRA). O(L·(5+r)·S) cost.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
blocks (``N'`` = N − 2 middle query blocks), ``S`` block size (``Q`` query / ``T`` key position inside a
block), ``K`` key blocks gathered per middle query block (5 + r), ``G`` global query blocks, ``r``
random blocks per query block.

With ``b(i) = ⌊i/S⌋`` and N blocks, query i may attend key j (per head h) iff

    b(i) ∈ {0, N−1}  or  b(j) ∈ {0, N−1}  or  |b(i) − b(j)| ≤ 1  or  b(j) ∈ R_h[b(i)]

(ANDed with ``j ≤ i`` when causal, and with the key padding mask), all in one softmax per query. The
two global query blocks attend densely to every key (2·S·L work); each middle query block gathers its
``K = 5 + r`` key blocks ``[0, N−1, b−1, b, b+1, R_h[b]]`` with ``take`` (never an L×L mask); slots
that duplicate another block (``b−1 = 0``, ``b+1 = N−1``) or random slots that could not be filled are
masked, so every key is counted once.

Differences from the original (LRA ``bigbird_attention.py``):

- Padding: the sequence is padded to a block multiple only when needed (the original always added at
  least one position) and the alignment padding is **masked** (the original's bool pad made it a
  valid zero key).
- Block size: ``block_size`` (default ``None`` = ``min(64, ceil(L/8))``: 64 as in LRA for L ≥ 512,
  smaller for short inputs so there are ~8 blocks). Any number of blocks works (1 or 2 blocks: all
  global, i.e. dense; few blocks: fewer than r random candidates leave slots masked) — the original
  needed N ≥ 8.
- Random blocks are drawn (numpy ``default_rng``, at trace time) from ``[seed, hash(module path)]``:
  fixed for the run, one layer pattern per module path (the original seeded with the layer index),
  different per head, distinct within a row, never a window or global block. By default they come
  from **all** middle blocks; ``rand_block_span`` (tokens) restores the original's cap (LRA: 1024,
  random blocks only from the first 1024 tokens).
- Causal (not in the original): the pattern above ANDed with ``j ≤ i``; random blocks are then drawn
  only from past blocks (``≤ b−2``) so none is wasted.
- Attention dropout is applied to the sparse probabilities (the original had none in this path).
The random blocks are sown to ``intermediates/random_blocks`` [H, N, r] (−1 = none).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import blocks, common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class BigBirdConfig(AttentionConfig):
  """BigBird options.

  Attributes:
    block_size: S; ``None`` derives ``min(64, ceil(L/8))`` from the length.
    num_rand_blocks: r random key blocks per middle query block (LRA default 3).
    seed: connectivity seed of the random blocks (combined with the module path).
    rand_block_span: if set, random blocks come only from the first ``rand_block_span`` tokens (the
      original's 1024 cap); ``None`` uses every middle block.
  """

  block_size: int | None = None
  num_rand_blocks: int = 3
  seed: int = 0
  rand_block_span: int | None = None

  def __post_init__(self):
    if self.block_size is not None and self.block_size < 1:
      raise ValueError("bigbird block_size must be >= 1")
    if self.num_rand_blocks < 0:
      raise ValueError("bigbird num_rand_blocks must be >= 0")


def default_block_size(length: int) -> int:
  """64 (the LRA block size) once L ≥ 512; ~L/8 below, so short inputs still have ~8 blocks."""
  return max(1, min(64, math.ceil(length / 8)))


def random_blocks(num_blocks: int, num_rand: int, heads: int, seed, *, causal: bool = False,
                  last_block: int | None = None) -> np.ndarray:
  """R [H, N, r] int: random key blocks of each query block, −1 where none (global rows, too few).

  Row b ∈ [1, N−2] gets ``min(r, #candidates)`` distinct blocks drawn from the middle blocks
  ``[1, min(N−2, last_block)]`` excluding the window ``{b−1, b, b+1}`` (causal: only blocks ≤ b−2).
  Deterministic in ``seed`` (an int or a list of ints for ``np.random.default_rng``); heads differ.
  """
  rng = np.random.default_rng(seed)
  last = num_blocks - 2 if last_block is None else min(num_blocks - 2, last_block)
  table = np.full((heads, num_blocks, num_rand), -1, np.int32)
  for h in range(heads):
    for b in range(1, num_blocks - 1):
      top = min(last, b - 2) if causal else last
      candidates = [j for j in range(1, top + 1) if abs(j - b) > 1]
      count = min(num_rand, len(candidates))
      if count:
        table[h, b, :count] = np.sort(rng.choice(candidates, size=count, replace=False))
  return table


def _middle_layout(rand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Key-block index and validity [H, N', K] of the middle query blocks b = 1..N−2.

  Slots: ``[0, N−1, b−1, b, b+1, R[b]...]``; a slot is invalid when it repeats a global block or
  holds no random block (its index then points at block b, harmlessly).
  """
  heads, num_blocks, num_rand = rand.shape
  b = np.arange(1, num_blocks - 1)
  fixed = np.stack([np.zeros_like(b), np.full_like(b, num_blocks - 1), b - 1, b, b + 1], axis=-1)
  fixed_valid = np.stack([np.ones_like(b, bool), np.ones_like(b, bool), b - 1 >= 1,
                          np.ones_like(b, bool), b + 1 <= num_blocks - 2], axis=-1)
  rand_mid = rand[:, 1:-1]                                                      # [H, N', r]
  index = np.concatenate([np.broadcast_to(fixed, (heads, *fixed.shape)),
                          np.where(rand_mid >= 0, rand_mid, b[None, :, None])], axis=-1)
  valid = np.concatenate([np.broadcast_to(fixed_valid, (heads, *fixed.shape)), rand_mid >= 0], axis=-1)
  return index.astype(np.int32), valid


@register_attention("bigbird", BigBirdConfig)
class BigBirdAttention(nn.Module):
  """Block-sparse attention: global first/last blocks, 3-block window, r random blocks per head."""

  config: BigBirdConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, _ = query.shape
    mask = common.default_mask(mask, batch, length)
    size = cfg.block_size or default_block_size(length)
    query, key, value, mask = blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    num_blocks = query.shape[1] // size
    last_block = None if cfg.rand_block_span is None else cfg.rand_block_span // size - 1
    rand = random_blocks(num_blocks, cfg.num_rand_blocks, heads,
                         [cfg.seed, common.module_path_hash(self)], causal=cfg.causal,
                         last_block=last_block)
    self.sow("intermediates", "random_blocks", jnp.asarray(rand))
    positions = jnp.arange(num_blocks * size).reshape(num_blocks, size)           # [N, S]
    q_blocks = blocks.to_blocks(query, size)                                       # [B, N, S, H, D]

    # Global query blocks (first and last) attend to every key.
    global_ids = np.array([0] if num_blocks == 1 else [0, num_blocks - 1])
    logits = common.dot_logits(q_blocks[:, global_ids], key, "bgqhd,bkhd->bhgqk")  # [B, H, G, S, L]
    allowed = mask[:, None, None, None, :]
    if cfg.causal:
      allowed = allowed & (positions[global_ids][:, :, None] >= jnp.arange(key.shape[1]))
    drop = common.dropout_callback(cfg.dropout_rate, deterministic)
    out_global = jnp.transpose(common.masked_attention(                            # [B, G, S, H, V]
        logits, allowed, jnp.swapaxes(value, 1, 2), "bhgqk,bhkv->bhgqv", drop), (0, 2, 3, 1, 4))
    if num_blocks <= 2:
      return blocks.from_blocks(out_global)[:, :length]

    # Middle query blocks attend to their K gathered key blocks.
    index, valid = _middle_layout(rand)                                            # [H, N', K]
    k_sel = blocks.gather_blocks_per_head(blocks.to_blocks(key, size), index)     # [B, N', K, S, H, D]
    v_sel = blocks.gather_blocks_per_head(blocks.to_blocks(value, size), index)   # [B, N', K, S, H, V]
    logits = common.dot_logits(q_blocks[:, 1:-1], k_sel, "bnqhd,bnkthd->bhnqkt")  # [B, H, N', S, K, S]
    mask_sel = jnp.take(blocks.to_blocks(mask, size), index, axis=1)               # [B, H, N', K, S]
    allowed = jnp.asarray(valid)[None, :, :, None, :, None] & mask_sel[:, :, :, None]
    if cfg.causal:
      key_pos = positions[index]                                                   # [H, N', K, S]
      allowed = allowed & (key_pos[:, :, None] <= positions[1:-1, :, None, None])[None]
    shape = logits.shape                                # one softmax over the K·S keys of a query
    allowed = jnp.broadcast_to(allowed, shape).reshape(*shape[:4], -1)
    contract = lambda w: common.contraction("bhnqkt,bnkthv->bhnqv", v_sel)(w.reshape(shape))
    out_middle = common.joint_masked_attention(                                    # [B, N', S, H, V]
        [(logits.reshape(*shape[:4], -1), allowed, contract)], drop)
    out_middle = jnp.transpose(out_middle, (0, 2, 3, 1, 4)).astype(value.dtype)
    out = jnp.concatenate([out_global[:, :1], out_middle, out_global[:, 1:]], axis=1)
    return blocks.from_blocks(out)[:, :length]
