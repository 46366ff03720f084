"""Poolingformer two-level attention (Zhang et al. 2021, "Long Document Modeling with Pooling Attention").

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
query blocks of ``Q`` positions, ``K`` first-level keys per block (3 blocks), ``P`` pooled slots,
``T`` pooling kernel taps, ``S`` pooled slots gathered per query block.

Query i gets the sum of two attention outputs, each with its own softmax:

    first level   y_i = Σ_{|i−j| ≤ w1/2}           softmax_j(q_i·k_j/√D)  v_j     (sliding window)
    second level  z_i = Σ_{p : span(p) ⊆ W2(i)}     softmax_p(q'_i·k̃_p/√D) ṽ_p    (pooled window)
    output        y_i + z_i

Pooled slot p covers positions span(p) = [p·ξ, p·ξ + κ) (kernel κ, stride ξ); k̃_p, ṽ_p pool the keys
and values of the REAL positions in it (mean, or max); a slot with no real position is masked.
W2(i) = [i − w2/2, i + w2/2] is the wider second-level window. q'_i is the query q_i (default) or, as in
the paper, a learned per-head linear map of the first-level output y_i (``second_query="first_level"``).
Cost O(L·(1.5·w1 + (w1/2 + w2)/ξ)): linear. Blockwise: query blocks of w1/2 positions see their
neighbouring blocks (first level) and a static table of the pooled slots their window can reach (second
level); nothing L×L is built.

Defaults w1 = 128, w2 = 512, κ = 5, ξ = 4, mean pooling: our reading of the paper's long-document
settings (no official code is public, so these were checked against the paper's text only; pass other
values for other settings). Window sizes are clipped to the length, so short inputs need no sizes.

Differences from the paper:

- Second-level query: the layer's query by default, so the core stays linear in the values (the
  effective-matrix probe and the registry's declarations hold); ``second_query="first_level"`` gives the
  paper's form (queries from the first-level output through a learned [H, V, D] map owned by the core;
  then the output is not linear in the values).
- Pooling: mean (default) or max over the real positions of each slot; the paper's best pooling, a
  lightweight dynamic convolution, is not included.
- The second-level window is defined on pooled slots whose whole span lies inside W2(i) (the paper pools
  the keys inside the window; boundary slots are a detail it leaves open).
- Bidirectional only (the paper's encoder): ``causal=True`` raises ``NotImplementedError``.
- Rows of the effective matrix sum to 2 (two softmaxes added), as in the paper: ``rows_sum_to_one`` is
  declared False.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, register_attention
from attention_zoo.sparse_fixed import neighbour_blocks


@dataclasses.dataclass(frozen=True)
class PoolingformerConfig(AttentionConfig):
  """Poolingformer options.

  Attributes:
    window: w1, the first-level sliding window (|i − j| ≤ w1/2), clipped to the length.
    pooled_window: w2, the second-level window over pooled slots, clipped to the length.
    kernel: κ, positions pooled per slot.
    stride: ξ, positions between slot starts.
    pooling: "mean" or "max" over the real positions of a slot.
    second_query: "query" (the layer's query) or "first_level" (the paper: a learned per-head map of
      the first-level output).
  """

  family = "sparse"
  no_causal_form = "an encoder attention: its pooled slots mix past and future positions"
  window: int = 128
  pooled_window: int = 512
  kernel: int = 5
  stride: int = 4
  pooling: str = "mean"
  second_query: str = "query"

  rows_sum_to_one: ClassVar[bool] = False   # y + z: two softmaxes, rows sum to 2

  def __post_init__(self):
    if self.window < 2 or self.pooled_window < 2:
      raise ValueError("poolingformer window and pooled_window must be >= 2")
    if self.kernel < 1 or self.stride < 1:
      raise ValueError("poolingformer kernel and stride must be >= 1")
    if self.pooling not in ("mean", "max"):
      raise ValueError(f"poolingformer pooling must be 'mean' or 'max', got {self.pooling!r}")
    if self.second_query not in ("query", "first_level"):
      raise ValueError(f"poolingformer second_query must be 'query' or 'first_level', got {self.second_query!r}")

  def support(self, length: int) -> np.ndarray:
    """First-level band plus every position of each visible pooled slot (no padding)."""
    half, pooled_half = half_windows(self, length)
    i = np.arange(length)[:, None]
    allowed = np.abs(i - np.arange(length)[None, :]) <= half
    starts = np.arange(math.ceil(length / self.stride)) * self.stride                   # [P]
    visible = (starts >= i - pooled_half) & (starts + self.kernel - 1 <= i + pooled_half)  # [L, P]
    covers = (np.arange(length)[None, :] >= starts[:, None]) & (
        np.arange(length)[None, :] < starts[:, None] + self.kernel)                      # [P, L]
    return allowed | ((visible.astype(int) @ covers.astype(int)) > 0)


def half_windows(cfg: PoolingformerConfig, length: int) -> tuple[int, int]:
  """(w1/2, w2/2) at this length, clipped to it."""
  return max(1, min(cfg.window // 2, length)), min(cfg.pooled_window // 2, length)


@functools.lru_cache(maxsize=64)
def slot_tables(length: int, block: int, pooled_half: int, kernel: int, stride: int):
  """Static tables: taps int [P, T] (positions pooled by each slot, ``length`` = outside), slots int
  [N, S] (the slots query block n can see, ``P`` = none) and their starts int [N, S]."""
  num_slots, num_blocks = math.ceil(length / stride), math.ceil(length / block)
  starts = np.arange(num_slots) * stride
  taps = starts[:, None] + np.arange(kernel)[None, :]
  taps = np.where(taps < length, taps, length)
  first = np.arange(num_blocks) * block                                   # first query of each block
  low = np.clip(np.ceil((first - pooled_half) / stride), 0, num_slots).astype(int)
  high = np.clip(np.floor((first + block - 1 + pooled_half - kernel + 1) / stride) + 1, 0, num_slots)
  width = max(1, int(np.max(high - low)))
  slots = low[:, None] + np.arange(width)[None, :]
  slots = np.where(slots < high[:, None], slots, num_slots)
  return taps, slots, np.where(slots < num_slots, slots * stride, 0)


def pool(x: jax.Array, mask: jax.Array, taps: np.ndarray, how: str) -> tuple[jax.Array, jax.Array]:
  """Pools x [B, L+1, H, X] (slot L = outside) over taps [P, T] among real positions (mask [B, L+1]).
  Returns (pooled [B, P, H, X], slot has a real position bool [B, P])."""
  real = mask[:, taps]                                                     # [B, P, T]
  windows = x[:, taps]                                                     # [B, P, T, H, X]
  count = jnp.sum(real, axis=-1)
  if how == "max":
    pooled = jnp.max(jnp.where(real[..., None, None], windows, -jnp.inf), axis=2)
    pooled = jnp.where((count > 0)[..., None, None], pooled, 0)
  else:
    total = jnp.einsum("bpthx,bpt->bphx", windows, real.astype(x.dtype))
    pooled = jnp.einsum("bphx,bp->bphx", total, 1.0 / jnp.maximum(count, 1).astype(x.dtype))
  return pooled, count > 0


@register_attention("poolingformer", PoolingformerConfig)
class PoolingformerAttention(nn.Module):
  """Sliding-window attention plus attention over pooled keys/values in a wider window (summed)."""

  config: PoolingformerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("poolingformer is an encoder attention: its pooled slots mix past and "
                                "future positions, and the paper defines no causal form")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    half, pooled_half = half_windows(cfg, length)
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    padded = _blocks.pad_qkv_to_multiple(query, key, value, mask, half)
    q_blocks = _blocks.to_blocks(padded[0], half)                                  # [B, N, Q, H, D]
    first = self._first_level(q_blocks, *padded[1:], half, drop)                   # [B, H, N, Q, V]
    second_query = q_blocks
    if cfg.second_query == "first_level":
      second_query = self._first_level_query(first, query.shape[-1])
    second = self._second_level(second_query, query, key, value, mask, half, pooled_half, drop)
    out = jnp.transpose(first + second, (0, 2, 3, 1, 4)).astype(value.dtype)      # [B, N, Q, H, V]
    return _blocks.from_blocks(out)[:, :length]

  def _first_level(self, q_blocks, key, value, mask, half, drop):
    """Sliding window |i − j| ≤ w1/2 over blocks n−1, n, n+1 -> [B, H, N, Q, V]."""
    window = lambda x: neighbour_blocks(_blocks.to_blocks(x, half))               # [B, N, 3Q, ...]
    offset = np.arange(half)[:, None] + half - np.arange(3 * half)[None, :]        # [Q, K]: i − j
    allowed = window(mask)[:, None, :, None, :] & (np.abs(offset) <= half)       # [B, 1, N, Q, K]
    logits = _common.dot_logits(q_blocks, window(key), "bnqhd,bnkhd->bhnqk")
    return _common.masked_attention(logits, allowed, window(value), "bhnqk,bnkhv->bhnqv", drop)

  def _first_level_query(self, first, head_dim):
    """The paper's second-level query: a learned per-head map of y [B, H, N, Q, V] -> [B, N, Q, H, D]."""
    heads, value_dim = first.shape[1], first.shape[-1]
    kernel = self.param("second_query", nn.initializers.lecun_normal(batch_axis=(0,)),
                        (heads, value_dim, head_dim), jnp.float32)
    return jnp.einsum("bhnqv,hvd->bnqhd", first, kernel.astype(first.dtype))

  def _second_level(self, q_blocks, query, key, value, mask, half, pooled_half, drop):
    """Attention over the pooled slots whose span lies in [i − w2/2, i + w2/2] -> [B, H, N, Q, V]."""
    cfg = self.config
    length = query.shape[1]
    taps, slots, starts = slot_tables(length, half, pooled_half, cfg.kernel, cfg.stride)
    extend = lambda x: _common.pad_axis(x, length + 1, axis=1)        # slot L: outside the sequence
    ext_mask = _common.pad_axis(mask, length + 1, axis=1, value=False)
    pooled_k, real = pool(extend(key), ext_mask, taps, cfg.pooling)                # [B, P, H, D]
    pooled_v, _ = pool(extend(value), ext_mask, taps, cfg.pooling)
    # One extra masked slot at index P for the unused table entries.
    gather = lambda x: _common.pad_axis(x, x.shape[1] + 1, axis=1)[:, slots]        # [B, N, S, ...]
    positions = np.arange(q_blocks.shape[1] * half).reshape(-1, half)              # [N, Q]
    inside = ((starts[:, None, :] >= positions[:, :, None] - pooled_half)
              & (starts[:, None, :] + cfg.kernel - 1 <= positions[:, :, None] + pooled_half))
    allowed = gather(real)[:, None, :, None, :] & inside                           # [B, 1, N, Q, S]
    logits = _common.dot_logits(q_blocks, gather(pooled_k), "bnqhd,bnshd->bhnqs")
    return _common.masked_attention(logits, allowed, gather(pooled_v), "bhnqs,bnshv->bhnqv", drop)
