"""Combiner-Axial, vertical / horizontal / mixture (Ren et al., 2021) on an n x m grid.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
grid rows ``R`` = n (query row ``r``, other row ``z``), grid columns ``C`` = m (query column ``c``,
other column ``t``), ``E`` stacked key families (own row/column, then the span summaries before/after
the query). Position ``i = r m + c`` (row-major); m = ``width`` or ceil(sqrt(L)); the grid is
padded to n m and the padding masked.

For the query at ``(r, c)`` the direct set is the axial union: its whole row plus its column (self
once). Causal: the row up to ``c`` and the column strictly above ``r``. The rest is covered by spans:

- ``vertical``: for every other column ``t != c``, the part of column ``t`` ABOVE row ``r`` and (not
  causal) the part BELOW row ``r``: 2m span logits. Their summaries are exclusive prefix / suffix pools
  down each column (cummax-style), shared by all queries of a row.
- ``horizontal``: for every other row ``z != r`` (causal: ``z < r``), the part of row ``z`` LEFT of
  column ``c`` and the part RIGHT of it: 2n span logits, pooled along rows.
- ``both`` (Combiner-Mixture): ``mixture="joint"`` (default, as the released code) puts the direct set
  and both span families in ONE softmax, so each off-axis key is covered twice; ``mixture="average"``
  is the equal-weight mixture of the separately normalized vertical and horizontal attentions.

Vertical and horizontal are exact partitions of all keys (causal: of ``j <= i``). Unlike the released
bidirectional TF mixture, self is counted once, the own row/column are not re-covered by spans, empty
spans are masked and pooling is max (not cumsum). Cost O(L (n + m) D) = O(L sqrt(L)).
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import blocks, combiner_common, common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class CombinerAxialConfig(AttentionConfig):
  """Attributes:
    width: grid columns m (e.g. the image width); ``None`` = ceil(sqrt(L)).
    spans: ``"vertical"``, ``"horizontal"`` or ``"both"`` (mixture).
    mixture: for ``spans="both"``: ``"joint"`` (one softmax) or ``"average"`` (mean of two softmaxes).
    abstraction: span pooling, one of ``combiner_common.ABSTRACTIONS``.
  """

  width: int | None = None
  spans: str = "vertical"
  mixture: str = "joint"
  abstraction: str = "max"


@dataclasses.dataclass(frozen=True)
class CombinerAxialHorizontalConfig(CombinerAxialConfig):
  spans: str = "horizontal"


@dataclasses.dataclass(frozen=True)
class CombinerMixtureConfig(CombinerAxialConfig):
  spans: str = "both"


def _order(size: int, causal_strict: bool, before: bool | None) -> jax.Array:
  """bool [size(query), size(key)]: key != query (``before=None``), key < query, or key > query."""
  q, k = np.arange(size)[:, None], np.arange(size)[None, :]
  if before is None:
    return jnp.asarray(k < q if causal_strict else k != q)
  return jnp.asarray(k < q if before else k > q)


@register_attention("combiner_axial_vertical", CombinerAxialConfig)
@register_attention("combiner_axial_horizontal", CombinerAxialHorizontalConfig)
@register_attention("combiner_mixture", CombinerMixtureConfig)
class CombinerAxialAttention(nn.Module):
  """Combiner-Axial core (vertical, horizontal or mixture spans, by config)."""

  config: CombinerAxialConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.spans not in ("vertical", "horizontal", "both"):
      raise ValueError(f"spans must be 'vertical', 'horizontal' or 'both', got {cfg.spans!r}")
    if cfg.mixture not in ("joint", "average"):
      raise ValueError(f"mixture must be 'joint' or 'average', got {cfg.mixture!r}")
    batch, length = query.shape[:2]
    mask = common.default_mask(mask, batch, length)
    return _axial(
        query, key, value, mask,
        combiner_common.AbstractionFeatures(cfg.abstraction, name="query_abstraction")(query),
        combiner_common.AbstractionFeatures(cfg.abstraction, name="key_abstraction")(key),
        combiner_common.dropout_rng(self, cfg.dropout_rate, deterministic),
        width=cfg.width, spans=cfg.spans, mixture=cfg.mixture, causal=cfg.causal,
        kind=combiner_common.pool_kind(cfg.abstraction), dropout_rate=cfg.dropout_rate)


@functools.partial(jax.jit, static_argnames=("width", "spans", "mixture", "causal", "kind",
                                             "dropout_rate"))
def _axial(query, key, value, mask, fq, fk, rng, *, width, spans, mixture, causal, kind,
           dropout_rate):
  """query, key, fq, fk (abstraction features): [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L]."""
  length = query.shape[1]
  rows, cols = blocks.grid_shape(length, width)
  grid = lambda x, fill=0: blocks.to_blocks(common.pad_axis(x, cols, 1, fill), cols)  # [B, R, C, ...]
  q, k, v, fq, fk, valid = grid(query), grid(key), grid(value), grid(fq), grid(fk), grid(mask, False)
  dtype = v.dtype
  valid_t = jnp.swapaxes(valid, 1, 2)                                       # [B, C, R]
  both = (True,) if causal else (True, False)

  # Every term is either ROW-aligned (key index (r, t): own row, vertical spans) or COLUMN-aligned (key
  # index (z, c): own column, horizontal spans). Each family is stacked along a leading axis E and
  # handled by one logits einsum and one output einsum.
  def row_family(with_spans):
    """keys [E, B, R, T, H, D], values [E, B, R, T, H, V], allowed [E, B, R, C, 1, T]."""
    row_allowed = valid[:, :, None, None, :]                                # [B, R, 1, 1, T]
    if causal:
      row_allowed = row_allowed & common.causal_allowed(cols, cols)[None, None, :, None, :]
    row_allowed = jnp.broadcast_to(row_allowed, row_allowed.shape[:2] + (cols, 1, cols))
    keys, values, allowed = [k], [v], [row_allowed]
    if with_spans:  # other columns t != c, above (and below) the query row: exclusive column scans
      q_hat, _ = _stacked_scan(fq, valid, 1, kind, both)                    # [E, B, R, T, H, D]
      k_hat, nonempty = _stacked_scan(fk, valid, 1, kind, both)             # [E, B, R, T]
      order = jnp.stack([_order(rows, True, before) for before in both])     # [E, R, Z]
      v_hat = combiner_common.span_values(                                  # [E, B, R, T, H, V]
          q_hat, k, v, valid_t[None, :, None, :, None, :] & order[:, None, :, None, None, :],
          "ebrthd,bzthd->ebrthz", "ebrthz,bzthv->ebrthv")
      keys.extend(k_hat)
      values.extend(v_hat)
      other_cols = _order(cols, False, None)[None, None, None, :, None, :]   # t != c
      allowed.extend(nonempty[:, :, :, None, None, :] & other_cols)
    return jnp.stack(keys), jnp.stack(values), jnp.stack(allowed)

  def column_family(with_spans):
    """keys [E, B, Z, C, H, D], values [E, B, Z, C, H, V], allowed [E, B, R, C, 1, Z]."""
    col_allowed = valid_t[:, None, :, None, :] & _order(rows, causal, None)[None, :, None, None, :]
    keys, values, allowed = [k], [v], [col_allowed]
    if with_spans:  # other rows (causal: above), left and right of the query column: row scans
      q_hat, _ = _stacked_scan(fq, valid, 2, kind, (True, False))           # [E, B, Z, C, H, D]
      k_hat, nonempty = _stacked_scan(fk, valid, 2, kind, (True, False))    # [E, B, Z, C]
      order = jnp.stack([_order(cols, True, before) for before in (True, False)])  # [E, C, T]
      v_hat = combiner_common.span_values(                                  # [E, B, Z, C, H, V]
          q_hat, k, v, valid[None, :, :, None, None, :] & order[:, None, None, :, None, :],
          "ebzchd,bzthd->ebzcht", "ebzcht,bzthv->ebzchv")
      keys.extend(k_hat)
      values.extend(v_hat)
      span_allowed = (jnp.swapaxes(nonempty, 2, 3)[:, :, None, :, None, :]
                      & _order(rows, causal, None)[None, None, :, None, None, :])  # [E, B, R, C, 1, Z]
      allowed.extend(span_allowed)
    return jnp.stack(keys), jnp.stack(values), jnp.stack(allowed)

  def attend(vertical, horizontal, part_rng=rng):
    row_k, row_v, row_ok = row_family(vertical)
    col_k, col_v, col_ok = column_family(horizontal)
    row_logits = common.dot_logits(q, row_k, "brchd,ebrthd->brchet")       # [B, R, C, H, E, T]
    col_logits = common.dot_logits(q, col_k, "brchd,ebzchd->brchez")       # [B, R, C, H, E', Z]
    flat = lambda x: x.reshape(*x.shape[:4], -1)
    row_ok = jnp.moveaxis(row_ok, 0, -2)                                    # [B, R, C, 1, E, T]
    col_ok = jnp.moveaxis(col_ok, 0, -2)
    p_row, p_col = combiner_common.joint_softmax(
        [(flat(row_logits), flat(row_ok)), (flat(col_logits), flat(col_ok))], dropout_rate, part_rng)
    return (jnp.einsum("brchet,ebrthv->brchv", p_row.reshape(row_logits.shape).astype(dtype), row_v)
            + jnp.einsum("brchez,ebzchv->brchv", p_col.reshape(col_logits.shape).astype(dtype), col_v))

  if spans == "vertical":
    out = attend(True, False)
  elif spans == "horizontal":
    out = attend(False, True)
  elif mixture == "joint":
    out = attend(True, True)
  else:
    rng_v, rng_h = (None, None) if rng is None else jax.random.split(rng)
    out = (0.5 * (attend(True, False, rng_v) + attend(False, True, rng_h))).astype(dtype)
  return blocks.from_blocks(out)[:, :length]


def _stacked_scan(x, valid, axis, kind, befores):
  """Exclusive prefix (``before``) / suffix scans of :func:`combiner_common.exclusive_scan_pool`,
  stacked on a new leading axis E."""
  scans = [combiner_common.exclusive_scan_pool(x, valid, axis, kind, not before) for before in befores]
  return jnp.stack([s for s, _ in scans]), jnp.stack([n for _, n in scans])
