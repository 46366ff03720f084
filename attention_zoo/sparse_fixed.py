"""Sparse Transformer "fixed" and "strided" patterns (Child et al. 2019), merged heads.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``N``
blocks of length ``l`` (``Q`` query / ``K`` key position inside a block; ``M`` key block in the strided
part), ``J`` summary keys (c' per block, N·c' in all). One module class; the config class
(``SparseFixedConfig`` / ``SparseStridedConfig``) picks the pattern.

**Fixed** (``sparse_fixed``), O(L·(l + c'·L/l)) cost.

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
  ``l=50, c=10, first_column=True`` (LRA ``utils/train_utils.py`` injects them; the module default is
  l=128, c=32) and ANDed the pattern with ``j ≤ i``: the ``lra`` protocol preset passes all four
  (``configs/lra.py``).
- **CLS row and column** (``cls_token``): when the encoder pools a CLS token (``classifier_pool='CLS'``)
  LRA built the pattern on positions 1..L−1 and padded it with a first row and column of ones
  (``sparse_attention.py`` ``use_cls_token``): the CLS token at position 0 attends to every real key
  and every query attends to it, even with ``j ≤ i``. ``cls_token=True`` does the same (the harness's
  ``pooling="CLS"`` prepends a CLS token at position 0 and pools it); it is off by default, where
  position 0 is an ordinary position of the pattern (then a pooled CLS query sees only its own block
  and the summary columns: ≈ 20 % of the keys at ListOps length). With ``causal=True`` and
  ``cls_token=True`` position 0 sees the future, as in LRA: the core is then not strictly causal.
  The ``lra`` preset turns it on for the tasks that pool a CLS token; it must not be combined with
  another pooling (position 0 would be an ordinary token made global).

**Strided** (``sparse_strided``), O(L·(3l + L/l)) = O(L^1.5) cost at the default l = ceil(√L).
The paper (Sec. 4.2) gives head 1 the previous l positions, A¹_i = {max(0, i − l), …, i}, and head 2
every l-th position, A²_i = {j : (i − j) mod l = 0}, causal. Merged heads (union, one softmax):

    causal:         0 ≤ i − j ≤ l   or  (j ≤ i and (i − j) mod l = 0)
    bidirectional:  |i − j| ≤ l     or  (i − j) mod l = 0          (the default)

The bidirectional form is the symmetric closure of the causal one: the band and the stride reach as far
forward as backward. Blockwise form: the band lives in blocks n−1, n, n+1 of the query block n; the stride
keys of query offset r are offset r of every block m (a column of the [N, l] layout), with |n − m| ≤ 1
masked because those keys (i, i ± l) are already in the band. Differences from the paper / OpenAI
``blocksparse``: bidirectional by default; the patterns are merged into one softmax over the union (the
paper also interleaves them across layers or heads); element-level (not 32/64-block-level) pattern; l
derived from the length (the paper chooses l close to √L per dataset).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, peak_over_prefixes, register_attention


@dataclasses.dataclass(frozen=True)
class SparseFixedConfig(AttentionConfig):
  """Sparse-Fixed options.

  Attributes:
    block_len: l, the block (stride) length; ``None`` = ``ceil(√L)``.
    summary: c, summary columns at the end of each block; ``None`` = ``min(8, max(1, l // 4))``.
    first_column: also make column ``j mod l = 0`` a summary column (LRA's variant).
    cls_token: position 0 is a CLS token that attends to, and is attended by, every position; the
      pattern covers positions 1..L−1 (LRA with CLS pooling).
  """

  family = "sparse"
  block_len: int | None = None
  summary: int | None = None
  first_column: bool = False
  cls_token: bool = False
  pattern: ClassVar[str] = "fixed"   # which pattern the shared module computes

  def __post_init__(self):
    if self.block_len is not None and self.block_len < 1:
      raise ValueError("sparse_fixed block_len must be >= 1")
    if self.summary is not None and self.summary < 0:
      raise ValueError("sparse_fixed summary must be >= 0")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·(the most over t ≤ L of ⌊t/l⌋·k + t mod l): the k summary columns of every finished block
    (l − c .. l − 1, and 0 with ``first_column``), which every later query reads, plus the current
    block's past positions; ``cls_token`` adds the CLS key/value (position 0, read by every query; the
    CLS query itself sees the future, as in LRA) and runs the pattern on the other L − 1 positions."""
    rest = length - 1 if self.cls_token else length
    if rest <= 0:
      return 2 * num_heads * head_dim * max(length, 0)
    block, summary = pattern_sizes(rest, self.block_len, self.summary)
    kept = len(summary_offsets(block, summary, self.first_column))
    past = peak_over_prefixes(rest, block, lambda t: t // block * kept + t % block)
    return 2 * num_heads * head_dim * (past + (1 if self.cls_token else 0))


@dataclasses.dataclass(frozen=True)
class SparseStridedConfig(AttentionConfig):
  """Sparse-Strided options.

  Attributes:
    block_len: l, the band width and the stride; ``None`` = ``ceil(√L)``.
  """

  family = "sparse"
  block_len: int | None = None
  pattern: ClassVar[str] = "strided"   # which pattern the shared module computes

  def __post_init__(self):
    if self.block_len is not None and self.block_len < 1:
      raise ValueError("sparse_strided block_len must be >= 1")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·L: the stride part reads j from every later i ≡ j (mod l), so no past key or value
    expires (the band alone would need only l)."""
    return 2 * num_heads * head_dim * length

  def support(self, length: int) -> np.ndarray:
    """The strided pattern at the length-derived l (no padding)."""
    return strided_pattern(length, self.block_len or _blocks.sqrt_block_size(length), self.causal)


def strided_pattern(length: int, block_len: int, causal: bool) -> np.ndarray:
  """bool [L, L]: |i − j| ≤ l or (i − j) mod l = 0, ANDed with j ≤ i when causal."""
  i, j = np.arange(length)[:, None], np.arange(length)[None, :]
  allowed = (np.abs(i - j) <= block_len) | ((i - j) % block_len == 0)
  return allowed & (j <= i) if causal else allowed


def pattern_sizes(length: int, block_len: int | None = None, summary: int | None = None) -> tuple[int, int]:
  """(l, c) used at this length: the configured values or the length-derived defaults."""
  block = block_len or _blocks.sqrt_block_size(length)
  return block, min(block, summary if summary is not None else min(8, max(1, block // 4)))


def summary_offsets(block_len: int, summary: int, first_column: bool) -> np.ndarray:
  """Sorted offsets inside a block that are summary columns: ``l−c .. l−1`` (and 0)."""
  offsets = set(range(block_len - summary, block_len))
  if first_column:
    offsets.add(0)
  return np.array(sorted(offsets), np.int32)


@register_attention("sparse_fixed", SparseFixedConfig)
@register_attention("sparse_strided", SparseStridedConfig)
class SparseFixedAttention(nn.Module):
  """Sparse Transformer attention, one softmax over the pattern's key parts, computed blockwise.

  The config class picks the pattern: ``SparseFixedConfig`` (own block + summary columns, gathers) or
  ``SparseStridedConfig`` (local band + every l-th position)."""

  config: SparseFixedConfig | SparseStridedConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    dropout = _common.dropout_callback(cfg.dropout_rate, deterministic)
    if cfg.pattern == "fixed" and cfg.cls_token:
      return _with_cls_token(cfg, query, key, value, mask, dropout)
    return _pattern_attention(cfg, query, key, value, mask, dropout)


def _pattern_attention(cfg, query, key, value, mask, dropout, extra_parts=None):
  """The configured pattern over all positions: [B, L, H, X] inputs -> [B, L, H, V].

  ``extra_parts(q_blocks)`` (optional) returns more ``joint_masked_attention`` parts every query sees
  (the CLS key of ``cls_token``)."""
  length = query.shape[1]
  if cfg.pattern == "strided":
    size = cfg.block_len or _blocks.sqrt_block_size(length)
    make_parts = _strided_parts
  else:
    size, summary = pattern_sizes(length, cfg.block_len, cfg.summary)
    make_parts = lambda *args: _fixed_parts(*args, offsets=summary_offsets(size, summary, cfg.first_column))
  query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, size)
  q_blocks = _blocks.to_blocks(query, size)
  parts = make_parts(q_blocks, key, value, mask, size, cfg.causal)
  if extra_parts is not None:
    parts = parts + extra_parts(q_blocks)
  out = _common.joint_masked_attention(parts, dropout)                                # [B, H, N, Q, V]
  out = jnp.transpose(out, (0, 2, 3, 1, 4)).astype(value.dtype)                     # [B, N, Q, H, V]
  return _blocks.from_blocks(out)[:, :length]


def _with_cls_token(cfg, query, key, value, mask, dropout):
  """``cls_token``: position 0 attends to every real key (one dense row, O(L)); positions 1..L−1 run
  the pattern among themselves (indices shifted by one, as LRA built it on L − 1 positions) plus the
  CLS key, all in one softmax per query."""
  cls_logits = _common.dot_logits(query[:, :1], key, "bqhd,bkhd->bhqk")             # [B, H, 1, L]
  cls_out = _common.joint_masked_attention(
      [(cls_logits, mask[:, None, None, :], _common.contraction("bhqk,bkhv->bhqv", value))], dropout)
  cls_out = jnp.transpose(cls_out, (0, 2, 1, 3)).astype(value.dtype)               # [B, 1, H, V]
  if query.shape[1] == 1:
    return cls_out

  def cls_key_part(q_blocks):
    """Every query block sees the CLS key: logits [B, H, N, Q, 1]."""
    logits = _common.dot_logits(q_blocks, key[:, :1], "bnqhd,bjhd->bhnqj")
    return [(logits, mask[:, None, None, None, :1], _common.contraction("bhnqj,bjhv->bhnqv", value[:, :1]))]

  rest = _pattern_attention(cfg, query[:, 1:], key[:, 1:], value[:, 1:], mask[:, 1:], dropout, cls_key_part)
  return jnp.concatenate([cls_out, rest], axis=1)


def _fixed_parts(q_blocks, key, value, mask, size, causal, *, offsets):
  """Own-block and summary-column parts of the fixed pattern (``joint_masked_attention`` parts)."""
  num_blocks = q_blocks.shape[1]
  summary_pos = (np.arange(num_blocks)[:, None] * size + offsets).reshape(-1)   # [J]
  summary_block = summary_pos // size
  positions = np.arange(num_blocks * size).reshape(num_blocks, size)            # [N, S]
  own_logits = _common.dot_logits(q_blocks, _blocks.to_blocks(key, size), "bnqhd,bnkhd->bhnqk")
  own_allowed = _blocks.to_blocks(mask, size)[:, None, :, None, :]               # [B, 1, N, 1, K]
  sum_logits = _common.dot_logits(q_blocks, key[:, summary_pos], "bnqhd,bjhd->bhnqj")
  sum_allowed = (mask[:, summary_pos][:, None, None, None, :]                    # [B, 1, 1, 1, J]
                 & (summary_block != np.arange(num_blocks)[:, None])[:, None, :])  # [N, 1, J]
  if causal:
    own_allowed = own_allowed & _common.causal_allowed(size, size)
    sum_allowed = sum_allowed & (summary_pos <= positions[:, :, None])            # [N, Q, J]
  v_blocks, v_summary = _blocks.to_blocks(value, size), value[:, summary_pos]
  return [(own_logits, own_allowed, _common.contraction("bhnqk,bnkhv->bhnqv", v_blocks)),
          (sum_logits, sum_allowed, _common.contraction("bhnqj,bjhv->bhnqv", v_summary))]


def _strided_parts(q_blocks, key, value, mask, size, causal):
  """Local-band and stride parts of the strided pattern (``joint_masked_attention`` parts).

  Query (block n, offset r) sees the band |i − j| ≤ l inside blocks n−1, n, n+1 ([B, N, 3S, ...] windows,
  zero blocks with a False mask at the ends), and the stride keys j ≡ i (mod l) = offset r of every block
  m, except |n − m| ≤ 1 (those are i and i ± l, already in the band), so no key counts twice."""
  num_blocks = q_blocks.shape[1]
  window = lambda x: neighbour_blocks(_blocks.to_blocks(x, size))
  k_window, v_window = window(key), window(value)                              # [B, N, 3S, H, X]
  offset = np.arange(size)[:, None] + size - np.arange(3 * size)[None, :]       # [Q, 3S]: i − j
  band = (offset >= 0) if causal else (offset >= -size)
  band_allowed = window(mask)[:, None, :, None, :] & (band & (offset <= size))  # [B, 1, N, Q, 3S]
  band_logits = _common.dot_logits(q_blocks, k_window, "bnqhd,bnkhd->bhnqk")
  gap = np.arange(num_blocks)[:, None] - np.arange(num_blocks)[None, :]         # [N, M]: n − m
  far = (gap >= 2) if causal else (np.abs(gap) >= 2)
  k_blocks, m_blocks = _blocks.to_blocks(key, size), _blocks.to_blocks(mask, size)
  stride_logits = _common.dot_logits(q_blocks, k_blocks, "bnqhd,bmqhd->bhnqm")
  stride_allowed = (jnp.swapaxes(m_blocks, 1, 2)[:, None, None, :, :]           # [B, 1, 1, Q, M]
                    & far[:, None, :])                                          # [N, 1, M]
  return [(band_logits, band_allowed, _common.contraction("bhnqk,bnkhv->bhnqv", v_window)),
          (stride_logits, stride_allowed,
           _common.contraction("bhnqm,bmqhv->bhnqv", _blocks.to_blocks(value, size)))]


def neighbour_blocks(x: jax.Array) -> jax.Array:
  """[B, N, S, ...] -> [B, N, 3S, ...]: blocks n−1, n, n+1 side by side (zeros/False beyond the ends)."""
  padded = jnp.pad(x, [(0, 0), (1, 1)] + [(0, 0)] * (x.ndim - 2))
  num = x.shape[1]
  stacked = jnp.concatenate([padded[:, :num], padded[:, 1:num + 1], padded[:, 2:]], axis=2)
  return stacked
