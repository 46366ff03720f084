"""Image Transformer local attention (Parmar et al. 2018), 1-D and 2-D. O(L·M) cost, M fixed: linear.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
query blocks, ``Q`` queries per block, ``M`` memory (key) positions per block.

The sequence is cut into non-overlapping query blocks; every query of a block attends (one softmax) to the
block's *memory*: the block itself grown by a flange on each side.

- 1-D (tensor2tensor ``local_attention_1d``): query blocks of ``b`` consecutive positions; the memory of
  block [s, s + b) is [s − f, s + b + f) (``f = memory_flange``).
- 2-D (``image_width`` = W set; tensor2tensor ``local_attention_2d``): position p is pixel
  (p // W, p % W) of a raster-scanned image; query blocks are ``query_shape`` = (qh, qw) rectangles,
  and the memory of a block is the rectangle grown by ``flange_2d`` = (fh, fw) rows above/below and
  columns left/right (clipped at the image border).
- Causal: the same memory ANDed with j ≤ i (raster order in 2-D), i.e. the query block's past part plus
  the flange before it — tensor2tensor's ``masked_local_attention_1d/2d`` (memory before the block,
  causal inside it).

Blockwise form: one static index table maps each block's queries [N, Q] and memory [N, M] to sequence
positions (an extra all-padding slot stands for positions outside the sequence/image); keys and values
are gathered per block, so nothing L×L is built. 1-D is the 2-D code on a one-row image with
query_shape (1, b) and flange (0, f).

Defaults: 1-D ``block_len = 256``, ``memory_flange = 128`` (the Image Transformer's ``block_length`` /
``block_width`` hparams), 2-D ``query_shape = (8, 16)``, ``flange_2d = (8, 16)`` (tensor2tensor's
``local_attention_2d`` defaults). Block and flange are clipped to the length (image height/width), so short
inputs need no sizes chosen by the caller: at L ≤ b the attention is dense.

Differences from tensor2tensor:

- Bidirectional by default (the Image Transformer decoder uses the masked forms; ``causal=True``).
- Padding: the key mask is applied (t2t masks only all-zero key vectors, ``embedding_to_padding``, which
  also masks a real key that happens to be zero and ignores the padding mask).
- Causal 1-D memory: the previous ``memory_flange`` positions (t2t's ``masked_local_attention_1d`` uses
  the whole previous block, i.e. flange = block length; pass ``memory_flange = block_len`` for that).
- Causal 2-D: the symmetric memory rectangle masked by raster order (so the flange rows above the block,
  the block's own past, and columns left/right of it on the block's rows); t2t's
  ``masked_local_attention_2d`` builds the same region from rows above and a left flange.
- 2-D sequences whose length is not a multiple of W end in a partial last row (padding); the image is
  padded to a multiple of the query shape and those positions are masked.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, peak_over_prefixes, register_attention


@dataclasses.dataclass(frozen=True)
class ImageLocalConfig(AttentionConfig):
  """Image Transformer local attention options.

  Attributes:
    block_len: 1-D query block length b (clipped to L).
    memory_flange: 1-D memory positions f on each side of the block (before it when causal).
    image_width: W; set for 2-D local attention over the raster-scanned W-wide image, None = 1-D.
    query_shape: 2-D query block (rows, columns), clipped to the image.
    flange_2d: 2-D memory flange (rows above/below, columns left/right).
  """

  family = "sparse"
  block_len: int = 256
  memory_flange: int = 128
  image_width: int | None = None
  query_shape: tuple[int, int] = (8, 16)
  flange_2d: tuple[int, int] = (8, 16)

  def __post_init__(self):
    if self.block_len < 1 or self.memory_flange < 0:
      raise ValueError("image_local needs block_len >= 1 and memory_flange >= 0")
    if self.image_width is not None and self.image_width < 1:
      raise ValueError("image_local image_width must be >= 1 (or None for 1-D)")
    if len(self.query_shape) != 2 or min(self.query_shape) < 1:
      raise ValueError(f"image_local query_shape must be two sizes >= 1, got {self.query_shape}")
    if len(self.flange_2d) != 2 or min(self.flange_2d) < 0:
      raise ValueError(f"image_local flange_2d must be two sizes >= 0, got {self.flange_2d}")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·(the most over t ≤ L of the past positions a later query's memory still covers): 1-D,
    min(t, f + t mod b), the flange before the current block and the block's past part (≤ f + b − 1);
    2-D, counted on the raster continued by further rows (about fh + qh rows of W)."""
    if length == 0:
      return 0
    width, shape, flange = geometry(self, length)
    if self.image_width is None:
      block, reach = shape[1], flange[1]
      past = peak_over_prefixes(length, block, lambda t: min(t, reach + t % block))
    else:
      past = raster_state(length, width, shape, flange)
    return 2 * num_heads * head_dim * past

  def support(self, length: int) -> np.ndarray:
    """Each query's block memory (ANDed with j ≤ i when causal), no padding."""
    queries, memory = block_tables(length, *geometry(self, length))
    allowed = np.zeros((length + 1, length + 1), bool)
    for q_row, m_row in zip(queries, memory):
      allowed[np.ix_(q_row, m_row)] = True
    allowed = allowed[:length, :length]
    return np.tril(allowed) if self.causal else allowed


def geometry(cfg: ImageLocalConfig, length: int) -> tuple[int, tuple[int, int], tuple[int, int]]:
  """(image width W, query shape, flange) at this length; 1-D is a one-row image of width L."""
  if cfg.image_width is None:
    return length, (1, min(cfg.block_len, length)), (0, min(cfg.memory_flange, length))
  width = cfg.image_width
  rows = math.ceil(length / width)
  shape = (min(cfg.query_shape[0], rows), min(cfg.query_shape[1], width))
  return width, shape, (min(cfg.flange_2d[0], rows), min(cfg.flange_2d[1], width))


@functools.lru_cache(maxsize=64)
def block_tables(length: int, width: int, shape: tuple[int, int],
                 flange: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
  """Static index tables: queries int [N, Q] and memory int [N, M] of sequence positions, ``length``
  marking a slot outside the sequence (a padding slot). Blocks in raster order over the image padded to a
  multiple of ``shape``; the memory rectangle extends ``flange`` beyond the block on every side."""
  (qh, qw), (fh, fw) = shape, flange
  rows, cols = math.ceil(math.ceil(length / width) / qh) * qh, math.ceil(width / qw) * qw
  # Position of every cell of the flanged, padded image (length = outside).
  r = np.arange(-fh, rows + fh)[:, None]
  c = np.arange(-fw, cols + fw)[None, :]
  pos = r * width + c
  pos = np.where((r >= 0) & (c >= 0) & (c < width) & (pos < length), pos, length)
  block_r, block_c = np.meshgrid(np.arange(rows // qh) * qh, np.arange(cols // qw) * qw, indexing="ij")
  block_r, block_c = block_r.reshape(-1, 1, 1) + fh, block_c.reshape(-1, 1, 1) + fw   # [N, 1, 1]
  num = block_r.shape[0]
  queries = pos[block_r + np.arange(qh)[:, None], block_c + np.arange(qw)]            # [N, qh, qw]
  memory = pos[block_r - fh + np.arange(qh + 2 * fh)[:, None],
               block_c - fw + np.arange(qw + 2 * fw)]                                  # [N, mh, mw]
  return queries.reshape(num, -1), memory.reshape(num, -1)


def raster_state(length: int, width: int, shape: tuple[int, int], flange: tuple[int, int]) -> int:
  """The most, over t ≤ L, of the positions j < t that some query i ≥ t still reads in the causal form
  (i reads j iff j lies in the memory of i's block and j ≤ i), with the image continued by enough
  further rows of width W that every reader of a position < L exists."""
  extended = length + (2 * shape[0] + 2 * flange[0] + 1) * width
  queries, memory = block_tables(extended, width, shape, flange)
  last_query = np.where(queries < extended, queries, -1).max(axis=1)                  # [N]
  reader = np.full(extended + 1, -1)                                                 # last reader of j
  np.maximum.at(reader, memory.reshape(-1), np.repeat(last_query, memory.shape[1]))
  held = np.nonzero(reader[:length] > np.arange(length))[0]           # j is held for t in (j, reader]
  change = np.zeros(length + 2, np.int64)
  np.add.at(change, held + 1, 1)
  np.add.at(change, np.minimum(reader[held], length) + 1, -1)
  return int(np.cumsum(change)[:length + 1].max())


@register_attention("image_local", ImageLocalConfig)
class ImageLocalAttention(nn.Module):
  """Query blocks attend to their memory block (1-D or 2-D), one softmax, gathered per block."""

  config: ImageLocalConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    queries, memory = block_tables(length, *geometry(cfg, length))                  # [N, Q], [N, M]
    # One extra slot at index L: zeros with a False mask, for positions outside the sequence.
    extend = lambda x: _common.pad_axis(x, length + 1, axis=1)
    query, key, value = extend(query), extend(key), extend(value)
    mask = _common.pad_axis(mask, length + 1, axis=1, value=False)
    logits = _common.dot_logits(query[:, queries], key[:, memory], "bnqhd,bnmhd->bhnqm")
    allowed = mask[:, memory][:, None, :, None, :]                                  # [B, 1, N, 1, M]
    if cfg.causal:
      allowed = allowed & (memory[:, None, :] <= queries[:, :, None])               # [N, Q, M]
    out = _common.masked_attention(logits, allowed, value[:, memory], "bhnqm,bnmhv->bhnqv",
                                  _common.dropout_callback(cfg.dropout_rate, deterministic))
    heads, value_dim = out.shape[1], out.shape[-1]                                   # out [B, H, N, Q, V]
    out = jnp.transpose(out, (0, 2, 3, 1, 4)).reshape(batch, -1, heads, value_dim)  # [B, N·Q, H, V]
    return out[:, _output_index(length, *geometry(cfg, length))]                     # [B, L, H, V]


@functools.lru_cache(maxsize=64)
def _output_index(length: int, width: int, shape: tuple[int, int], flange: tuple[int, int]) -> np.ndarray:
  """int [L]: where position p sits in the flattened [N·Q] block order."""
  flat = block_tables(length, width, shape, flange)[0].reshape(-1)
  index = np.empty(length, np.int64)
  real = flat < length
  index[flat[real]] = np.nonzero(real)[0]
  return index
