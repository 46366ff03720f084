"""Axial attention on a row-major grid (Ho et al. 2019). O(L·(n + m)) cost, ~L^1.5 with m ≈ √L.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``R``
grid rows (n), ``C`` grid columns (m); keys: ``S`` columns of the query's row, ``T`` rows of the
query's column.

Position ``i`` sits at row ``⌊i/m⌋``, column ``i mod m`` of an n×m grid (``m = width`` or ``ceil(√L)``,
``n = ceil(L/m)``; the grid is padded to n·m and the padding masked). Modes (``mode``):

- ``"union"`` (default): keys ``{same row} ∪ {same column}``, self counted once, in **one** softmax
  (the merged "axial" sparse pattern of Sparse Transformer / Combiner-Axial's baseline): m row logits and
  n column logits with the column's self entry masked.
- ``"alternating"``: row attention, then column attention on its output — the two sequential sub-layers
  of the Axial Transformer inside one core (effective matrix ``P_col · P_row``: full receptive field).
- ``"parallel"``: mean of row attention and column attention, each with its own softmax (lucidrains
  sums the two; the mean keeps the effective matrix row-stochastic — a factor the output projection
  absorbs).
- ``"row"`` / ``"column"``: one axis only (for alternating layers chosen by the model).

Causal restricts every part to ``j ≤ i`` in row-major order (row: columns ≤ c; column: rows ≤ r).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _blocks, _common
from attention_zoo.registry import AttentionConfig, peak_over_prefixes, register_attention

MODES = ("union", "alternating", "parallel", "row", "column")


@dataclasses.dataclass(frozen=True)
class AxialConfig(AttentionConfig):
  """Axial options.

  Attributes:
    width: m, grid columns (e.g. 32 for LRA Image/Pathfinder-32); ``None`` = ``ceil(√L)``.
    mode: one of ``"union"`` (default), ``"alternating"``, ``"parallel"``, ``"row"``, ``"column"``.
  """

  family = "sparse"
  width: int | None = None
  mode: str = "union"

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"axial mode must be one of {MODES}, got {self.mode!r}")
    if self.width is not None and self.width < 1:
      raise ValueError("axial width must be >= 1")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """``row``: 2·H·D·min(m − 1, L), the current row's past keys/values; ``union``, ``column``,
    ``parallel``: 2·H·D·L, a later row's query reads every past key/value of its column and every
    column comes round again; ``alternating``: the most over t ≤ L of H·(2D·t + D·(t mod m)), every past
    key and row output (the column attention's values) plus the raw values of the current row."""
    _, width = _blocks.grid_shape(length, self.width)
    per_position = 2 * num_heads * head_dim
    if self.mode == "row":
      return per_position * min(width - 1, length)
    if self.mode == "alternating":
      return peak_over_prefixes(length, width, lambda t: per_position * t + num_heads * head_dim * (t % width))
    return per_position * length


@register_attention("axial", AxialConfig)
class AxialAttention(nn.Module):
  """Row/column attention on the n×m grid; see the module docstring for the modes."""

  config: AxialConfig

  def _row_logits(self, q_rm, k_rm, mask_rm):
    """Row keys (row-major): logits [B, H, R, C, S] and allowed [B, 1, R, C|1, S]."""
    allowed = mask_rm[:, :, :, None, :]                                           # [B, 1, R, 1, S]
    if self.config.causal:
      cols = q_rm.shape[3]
      allowed = allowed & _common.causal_allowed(cols, cols)
    return _common.dot_logits(q_rm, k_rm, "bhrcd,bhrsd->bhrcs"), allowed

  def _column_logits(self, q_cm, k_cm, mask_cm, with_self=True):
    """Column keys (column-major): logits [B, H, C, R, T] and allowed [B, 1, C, R|1, T]."""
    rows = q_cm.shape[3]
    allowed = mask_cm[:, :, :, None, :]                                           # [B, 1, C, 1, T]
    if self.config.causal:
      allowed = allowed & _common.causal_allowed(rows, rows)
    if not with_self:
      allowed = allowed & (jnp.arange(rows)[None, :] != jnp.arange(rows)[:, None])
    return _common.dot_logits(q_cm, k_cm, "bhcrd,bhctd->bhcrt"), allowed

  def _attend_row(self, q_rm, k_rm, v_rm, mask_rm, deterministic):
    """Attention within rows, all row-major [B, H, R, C, X]."""
    return _common.masked_attention(*self._row_logits(q_rm, k_rm, mask_rm), v_rm,
                                   "bhrcs,bhrsv->bhrcv",
                                   _common.dropout_callback(self.config.dropout_rate, deterministic))

  def _attend_column(self, q_cm, k_cm, v_cm, mask_cm, deterministic):
    """Attention within columns, all column-major [B, H, C, R, X]."""
    return _common.masked_attention(*self._column_logits(q_cm, k_cm, mask_cm), v_cm,
                                   "bhcrt,bhctv->bhcrv",
                                   _common.dropout_callback(self.config.dropout_rate, deterministic))

  def _union(self, grids, deterministic):
    """Same row or same column, self once, one softmax over the C + R candidate keys."""
    (q_rm, q_cm), (k_rm, k_cm), (v_rm, v_cm), (mask_rm, mask_cm) = grids
    return _common.grid_masked_attention(
        [(*self._row_logits(q_rm, k_rm, mask_rm), v_rm)],
        [(*self._column_logits(q_cm, k_cm, mask_cm, with_self=False), v_cm)],
        _common.dropout_callback(self.config.dropout_rate, deterministic))

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    _, width = _blocks.grid_shape(length, cfg.width)
    query, key, value, mask = _blocks.pad_qkv_to_multiple(query, key, value, mask, width)
    # Head-major row-major [B, H, R, C, X] and column-major [B, H, C, R, X] views: row contractions run
    # in the first, column contractions in the second, each a batched matmul with batch axes leading.
    (q_rm, q_cm), (k_rm, k_cm), (v_rm, v_cm) = (_blocks.grid_layouts(x, width) for x in (query, key, value))
    mask_rm, mask_cm = (m[..., 0] for m in _blocks.grid_layouts(mask[:, :, None, None], width))
    # masks: [B, 1, R, C] and [B, 1, C, R]
    row = lambda values: self._attend_row(q_rm, k_rm, values, mask_rm, deterministic)
    col = lambda values: self._attend_column(q_cm, k_cm, values, mask_cm, deterministic)
    swap = _common.swap_lines                                                        # rm <-> cm
    if cfg.mode == "union":
      out = self._union(((q_rm, q_cm), (k_rm, k_cm), (v_rm, v_cm), (mask_rm, mask_cm)), deterministic)
    elif cfg.mode == "row":
      out = row(v_rm)
    elif cfg.mode == "column":
      out = swap(col(v_cm))
    elif cfg.mode == "alternating":
      out = swap(col(swap(row(v_rm))))
    else:  # parallel
      out = 0.5 * (row(v_rm) + swap(col(v_cm)))
    return _blocks.from_grid(out)[:, :length].astype(value.dtype)
