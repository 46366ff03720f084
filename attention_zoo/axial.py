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

from attention_zoo import blocks, common
from attention_zoo.registry import AttentionConfig, register_attention

MODES = ("union", "alternating", "parallel", "row", "column")


@dataclasses.dataclass(frozen=True)
class AxialConfig(AttentionConfig):
  """Axial options.

  Attributes:
    width: m, grid columns (e.g. 32 for LRA Image/Pathfinder-32); ``None`` = ``ceil(√L)``.
    mode: one of ``"union"`` (default), ``"alternating"``, ``"parallel"``, ``"row"``, ``"column"``.
  """

  width: int | None = None
  mode: str = "union"

  def __post_init__(self):
    if self.mode not in MODES:
      raise ValueError(f"axial mode must be one of {MODES}, got {self.mode!r}")
    if self.width is not None and self.width < 1:
      raise ValueError("axial width must be >= 1")


@register_attention("axial", AxialConfig)
class AxialAttention(nn.Module):
  """Row/column attention on the n×m grid; see the module docstring for the modes."""

  config: AxialConfig

  def _softmax(self, logits, allowed, deterministic):
    probs = common.masked_softmax(logits, jnp.broadcast_to(allowed, logits.shape))
    return common.apply_dropout(probs, self.config.dropout_rate, deterministic)

  def _row(self, q, k, v, mask, deterministic):
    """Attention within rows: q, k [B, R, C, H, D], v [B, R, C, H, V], mask [B, R, C] -> [B, R, C, H, V]."""
    logits = common.dot_logits(q, k, "brchd,brshd->bhrcs")
    allowed = mask[:, None, :, None, :]                                            # [B, 1, R, 1, S]
    if self.config.causal:
      allowed = allowed & common.causal_allowed(q.shape[2], q.shape[2])
    probs = self._softmax(logits, allowed, deterministic)
    return jnp.einsum("bhrcs,brshv->brchv", probs.astype(v.dtype), v)

  def _column(self, q, k, v, mask, deterministic):
    """Attention within columns (same shapes as :meth:`_row`)."""
    logits = common.dot_logits(q, k, "brchd,btchd->bhrct")
    allowed = jnp.swapaxes(mask, 1, 2)[:, None, None, :, :]                    # [B, 1, 1, C, T]
    if self.config.causal:
      allowed = allowed & common.causal_allowed(q.shape[1], q.shape[1])[:, None, :]
    probs = self._softmax(logits, allowed, deterministic)
    return jnp.einsum("bhrct,btchv->brchv", probs.astype(v.dtype), v)

  def _union(self, q, k, v, mask, deterministic):
    """Same row or same column, self once, one softmax over the C + R candidate keys."""
    rows, cols = q.shape[1:3]
    row_logits = common.dot_logits(q, k, "brchd,brshd->bhrcs")                    # [B, H, R, C, S]
    col_logits = common.dot_logits(q, k, "brchd,btchd->bhrct")                    # [B, H, R, C, T]
    row_allowed = mask[:, None, :, None, :]                                        # [B, 1, R, 1, S]
    not_self = jnp.arange(rows)[None, :] != jnp.arange(rows)[:, None]              # [R, T]
    col_allowed = jnp.swapaxes(mask, 1, 2)[:, None, None] & not_self[:, None, :]  # [B, 1, R, C, T]
    if self.config.causal:
      row_allowed = row_allowed & common.causal_allowed(cols, cols)
      col_allowed = col_allowed & common.causal_allowed(rows, rows)[:, None, :]
    logits = jnp.concatenate([row_logits, col_logits], axis=-1)
    allowed = jnp.concatenate([jnp.broadcast_to(row_allowed, row_logits.shape),
                               jnp.broadcast_to(col_allowed, col_logits.shape)], axis=-1)
    probs = self._softmax(logits, allowed, deterministic).astype(v.dtype)
    return (jnp.einsum("bhrcs,brshv->brchv", probs[..., :cols], v)
            + jnp.einsum("bhrct,btchv->brchv", probs[..., cols:], v))

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length = query.shape[:2]
    mask = common.default_mask(mask, batch, length)
    _, width = blocks.grid_shape(length, cfg.width)
    query, key, value, mask = blocks.pad_qkv_to_multiple(query, key, value, mask, width)
    q, k, v, m = (blocks.to_blocks(x, width) for x in (query, key, value, mask))  # [B, R, C, ...]
    if cfg.mode == "union":
      out = self._union(q, k, v, m, deterministic)
    elif cfg.mode == "row":
      out = self._row(q, k, v, m, deterministic)
    elif cfg.mode == "column":
      out = self._column(q, k, v, m, deterministic)
    elif cfg.mode == "alternating":
      out = self._column(q, k, self._row(q, k, v, m, deterministic), m, deterministic)
    else:  # parallel
      out = 0.5 * (self._row(q, k, v, m, deterministic) + self._column(q, k, v, m, deterministic))
    return blocks.from_blocks(out)[:, :length].astype(value.dtype)
