"""BigBird block-sparse attention (Zaheer et al. 2020; ITC pattern as in LRA). O(L·(5+r)·S) cost.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
batch·heads merged (row ``n = b·H + h``), ``M`` blocks of the (padded) sequence (``M'`` = M − 2 middle
query blocks, index ``m``), ``S`` block size (``q`` query / ``t`` key position inside a block), ``K``
local key blocks per middle query block (3 + r), ``j`` key position inside one key part, ``G`` global
query blocks, ``r`` random blocks per query block. In the formulas below N is the number of blocks
(``M`` in the code).

With ``b(i) = ⌊i/S⌋`` and N blocks, query i may attend key j (per head h) iff

    b(i) ∈ {0, N−1}  or  b(j) ∈ {0, N−1}  or  |b(i) − b(j)| ≤ 1  or  b(j) ∈ R_h[b(i)]

(ANDed with ``j ≤ i`` when causal, and with the key padding mask), all in one softmax per query. The
two global query blocks attend densely to every key (2·S·L work). Each middle query block b sees two
key parts in that one softmax (:func:`_common.joint_masked_attention`): the two global key blocks
(shared by all blocks, never copied) and its ``K = 3 + r`` local blocks ``[b−1, b, b+1, R_h[b]]``
(the window as three shifted slices, only the random blocks gathered with ``take``, whose gradient is
a scatter; never an L×L mask). Window slots that duplicate a global block (``b−1 = 0``,
``b+1 = N−1``) and random slots that could not be filled are masked, so every key is counted once.
Batch and heads are merged into one leading axis (``_common.merge_heads``): measured fwd+bwd at
B=1, H=4, D=64, L=1024 on XLA:CPU, this layout and the ungathered global/window blocks take 27 ms
where gathering every block on a [B, H, ...] layout takes 36 ms.

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
  random blocks only from the first 1024 tokens; the ``lra`` protocol preset sets it, with block 64).
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

from attention_zoo import _blocks, _common
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

  family = "sparse"
  block_size: int | None = None
  num_rand_blocks: int = 3
  seed: int = 0
  rand_block_span: int | None = None

  def __post_init__(self):
    if self.block_size is not None and self.block_size < 1:
      raise ValueError("bigbird block_size must be >= 1")
    if self.num_rand_blocks < 0:
      raise ValueError("bigbird num_rand_blocks must be >= 0")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·L: the last block is a global query block that attends to every past key (and the random
    blocks reach any earlier block), so no past key or value can be dropped."""
    return 2 * num_heads * head_dim * length


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


def _local_layout(rand: np.ndarray, causal: bool, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The ``K = 3 + r`` local key blocks ``[b−1, b, b+1, R[b]...]`` of the middle query blocks b = 1..N−2.

  Returns the random blocks' index [H, N', r] (block b where there is none, harmlessly), the slot
  validity [H, N', K] (a window slot repeating a global block, or an empty random slot, is invalid)
  and the causal pattern [S, K·S] of a query inside block b (all ones when not causal): b−1 all
  visible, b lower-triangular, b+1 in the future, random blocks (drawn from ≤ b−2) all visible.
  """
  heads, num_blocks, num_rand = rand.shape
  b = np.arange(1, num_blocks - 1)
  window_valid = np.stack([b - 1 >= 1, np.ones_like(b, bool), b + 1 <= num_blocks - 2], axis=-1)
  rand_mid = rand[:, 1:-1]                                                      # [H, N', r]
  index = np.where(rand_mid >= 0, rand_mid, b[None, :, None]).astype(np.int32)
  valid = np.concatenate([np.broadcast_to(window_valid, (heads, *window_valid.shape)), rand_mid >= 0], -1)
  slots = np.ones((3 + num_rand, size, size), bool)
  if causal:
    slots[1], slots[2] = np.tril(slots[1]), False
  return index, valid, np.transpose(slots, (1, 0, 2)).reshape(size, -1)


def _window(x: jax.Array) -> jax.Array:
  """[N, M, S, X] blocks -> [N, M−2, 3, S, X]: blocks (b−1, b, b+1) for each b = 1..M−2 (slices, no gather)."""
  count = x.shape[1] - 2
  return jnp.stack([x[:, w:w + count] for w in range(3)], axis=2)


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
    mask = _common.default_mask(mask, batch, length)
    size = cfg.block_size or default_block_size(length)
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
    num_blocks = query.shape[1] // size
    last_block = None if cfg.rand_block_span is None else cfg.rand_block_span // size - 1
    rand = random_blocks(num_blocks, cfg.num_rand_blocks, heads,
                         [cfg.seed, _common.module_path_hash(self)], causal=cfg.causal,
                         last_block=last_block)
    self.sow("intermediates", "random_blocks", jnp.asarray(rand))
    # Batch and heads merged into one leading axis (_common.merge_heads): row n = b·H + h.
    q_b, k_b, v_b = (_blocks.to_blocks(_common.merge_heads(x), size) for x in (query, key, value))  # [N, M, S, X]
    mask_b = _blocks.to_blocks(jnp.repeat(mask, heads, axis=0), size)               # [N, M, S]
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    out = _global_rows(q_b, k_b, v_b, mask_b, cfg.causal, drop)                    # [N, G, S, V]
    if num_blocks > 2:
      local = _local_layout(rand, cfg.causal, size)
      out_middle = _middle_rows(q_b, k_b, v_b, mask_b, local, batch, cfg.causal, drop)  # [N, M', S, V]
      out = jnp.concatenate([out[:, :1], out_middle, out[:, 1:]], axis=1)
    out = out.reshape(out.shape[0], -1, out.shape[-1]).astype(value.dtype)       # [N, L', V]
    return _common.split_heads(out, heads)[:, :length]


def _global_rows(q_b, k_b, v_b, mask_b, causal, drop):
  """The first and last query blocks attend to every key: [N, G, S, V] (G = 1 when M = 1)."""
  num_blocks, size = q_b.shape[1:3]
  global_ids = np.array([0] if num_blocks == 1 else [0, num_blocks - 1])
  flat = lambda x: x.reshape(x.shape[0], -1, *x.shape[3:])                         # [N, L', X]
  logits = _common.dot_logits(q_b[:, global_ids], flat(k_b), "ngqd,nkd->ngqk")      # [N, G, S, L']
  allowed = flat(mask_b)[:, None, None, :]
  if causal:
    positions = np.arange(num_blocks * size).reshape(num_blocks, size)
    allowed = allowed & jnp.asarray(positions[global_ids][:, :, None] >= positions.reshape(-1))
  return _common.joint_masked_attention(
      [(logits, allowed, _common.contraction("ngqk,nkv->ngqv", flat(v_b)))], drop)


def _middle_rows(q_b, k_b, v_b, mask_b, local, batch, causal, drop):
  """Middle query blocks: ONE softmax over two key parts, the two global blocks (2S keys, shared by
  every block: no copy) and the K local blocks (window slices + per-head random gather): [N, M', S, V]."""
  index, valid, slot_causal = local                                                # [H, M', r], ...
  per_row = lambda a: jnp.asarray(np.tile(a, (batch,) + (1,) * (a.ndim - 1)))     # [H, ...] -> [N, ...]
  gather = jax.vmap(lambda x, i: jnp.take(x, i, axis=0))                           # per row n
  index = per_row(index)
  select = lambda x: jnp.concatenate([_window(x), gather(x, index)], axis=2)       # [N, M', K, S, ...]
  flat = lambda x: x.reshape(*x.shape[:2], -1, *x.shape[4:])                       # [N, M', K·S, ...]
  k_loc, v_loc, mask_loc = flat(select(k_b)), flat(select(v_b)), select(mask_b)
  q_mid, size = q_b[:, 1:-1], q_b.shape[2]
  loc_allowed = (per_row(valid)[..., None] & mask_loc).reshape(*mask_loc.shape[:2], 1, -1)
  loc_allowed = loc_allowed & jnp.asarray(slot_causal)                            # [N, M', S, K·S]
  ends = np.array([0, q_b.shape[1] - 1])
  k_glob, v_glob = (x[:, ends].reshape(x.shape[0], 2 * size, -1) for x in (k_b, v_b))  # [N, 2S, X]
  glob_allowed = mask_b[:, ends].reshape(-1, 1, 1, 2 * size)
  if causal:  # block 0 is in every middle query's past, block M−1 in its future
    glob_allowed = glob_allowed & jnp.asarray(np.arange(2 * size) < size)
  return _common.joint_masked_attention([
      (_common.dot_logits(q_mid, k_glob, "nmqd,njd->nmqj"), glob_allowed,
       _common.contraction("nmqj,njv->nmqv", v_glob)),
      (_common.dot_logits(q_mid, k_loc, "nmqd,nmjd->nmqj"), loc_allowed,
       _common.contraction("nmqj,nmjv->nmqv", v_loc)),
  ], drop)
