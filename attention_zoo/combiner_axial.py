"""Combiner-Axial, vertical / horizontal / mixture (Ren et al., 2021) on an n x m grid.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
grid rows ``R`` = n (query row ``r``, other row ``z``), grid columns ``C`` = m (query column ``c``,
other column ``t``), ``E`` span directions (before / after the query along a line), ``N`` position
along a line and ``M`` which line (span scans), ``K`` keys of a family. Position ``i = r m + c``
(row-major); m = ``width`` or ceil(sqrt(L)); the grid is padded to n m and the padding masked.

For the query at ``(r, c)`` the direct set is the axial union: its whole row plus its column (self
once). Causal: the row up to ``c`` and the column strictly above ``r``. The rest is covered by spans:

- ``vertical``: for every other column ``t != c``, the part of column ``t`` ABOVE row ``r`` and (not
  causal) the part BELOW row ``r``: 2m span logits. Their summaries are exclusive prefix / suffix pools
  down each column (one sequential running-max scan per direction), shared by all queries of a row.
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

from attention_zoo import _blocks, _combiner_common, _common
from attention_zoo.registry import AttentionConfig, peak_over_prefixes, register_attention


@dataclasses.dataclass(frozen=True)
class CombinerAxialConfig(AttentionConfig):
  """Attributes:
    width: grid columns m (e.g. the image width); ``None`` = ceil(sqrt(L)).
    spans: ``"vertical"``, ``"horizontal"`` or ``"both"`` (mixture).
    mixture: for ``spans="both"``: ``"joint"`` (one softmax) or ``"average"`` (mean of two softmaxes).
    abstraction: span pooling, one of ``_combiner_common.ABSTRACTIONS``.
  """

  family = "combiner"
  width: int | None = None
  spans: str = "vertical"
  mixture: str = "joint"
  abstraction: str = "max"

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """``vertical``: H·(the most over t ≤ L of 2D·t + D·(m·[t ≥ m] + t mod m)), every past key/value
    (a later query reads its whole column above it) plus each column's running query pool of the rows
    above the current one and the current row's queries (the span summaries' q̂; k̂ and v̂ are
    recomputed from the kept keys/values); ``horizontal`` and ``both``: 3·H·D·L, the past queries too,
    since a later query at column c needs the prefix and suffix pools of every earlier row at c."""
    if self.spans == "vertical":
      _, width = _blocks.grid_shape(length, self.width)
      return num_heads * peak_over_prefixes(
          length, width, lambda t: 2 * head_dim * t + head_dim * (width * (t >= width) + t % width))
    return 3 * num_heads * head_dim * length


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
    mask = _common.default_mask(mask, batch, length)
    return _axial(
        query, key, value, mask,
        _combiner_common.AbstractionFeatures(cfg.abstraction, name="query_abstraction")(query),
        _combiner_common.AbstractionFeatures(cfg.abstraction, name="key_abstraction")(key),
        _combiner_common.dropout_rng(self, cfg.dropout_rate, deterministic),
        width=cfg.width, spans=cfg.spans, mixture=cfg.mixture, causal=cfg.causal,
        kind=_combiner_common.pool_kind(cfg.abstraction), dropout_rate=cfg.dropout_rate)


@functools.partial(jax.jit, static_argnames=("width", "spans", "mixture", "causal", "kind",
                                             "dropout_rate"))
def _axial(query, key, value, mask, fq, fk, rng, *, width, spans, mixture, causal, kind,
           dropout_rate):
  """query, key, fq, fk (abstraction features): [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L].

  Layouts: every tensor is held head-major in row-major (``_rm``: [B, H, R, C, X]) and column-major
  (``_cm``: [B, H, C, R, X]) grid order. ROW-aligned key families (own row; vertical spans, indexed by
  (row r, column t)) are contracted in row-major order, COLUMN-aligned families (own column; horizontal
  spans, indexed by (row z, column c)) in column-major order, so every contraction is a batched matmul
  with its batch axes leading; one softmax joins the two orders (:func:`_common.grid_masked_attention`).
  """
  length = query.shape[1]
  rows, cols = _blocks.grid_shape(length, width)
  pad = lambda x: _common.pad_axis(x, cols, 1)
  (q_rm, q_cm), (k_rm, k_cm), (v_rm, v_cm), (fq_rm, fq_cm), (fk_rm, fk_cm) = (
      _blocks.grid_layouts(pad(x), cols) for x in (query, key, value, fq, fk))
  valid = _blocks.to_blocks(_common.pad_axis(mask, cols, 1, False), cols)     # [B, R, C]
  valid_rm, valid_cm = valid[:, None], jnp.swapaxes(valid, 1, 2)[:, None]  # [B, 1, R, C], [B, 1, C, R]
  dtype = v_rm.dtype

  row_allowed = valid_rm[:, :, :, None, :]                                 # [B, 1, R, 1, T]
  if causal:
    row_allowed = row_allowed & _common.causal_allowed(cols, cols)          # [C, T]
  col_allowed = valid_cm[:, :, :, None, :] & _order(rows, causal, None)    # [B, 1, C, R, Z]

  def span_family(along_rows: bool):
    """The span family of ``vertical`` (``along_rows``) or ``horizontal`` Combiner-Axial.

    vertical: the parts of every other column t != c above (and, not causal, below) the query row r;
      row-aligned keys/values [B, H, R, E*T, X], allowed [B, 1, R, C, E*T].
    horizontal: the parts of every other row z != r (causal: z < r) left and right of the query
      column c; column-aligned keys/values [B, H, C, E*Z, X], allowed [B, 1, C, R, E*Z].
    The summaries are exclusive scans along the other axis ("lines": columns for vertical, rows for
    horizontal), run with the line axis leading; each query position along a line reads the summary of
    the span before / after it. The span values attend within each line.
    """
    befores = (True,) if causal and along_rows else (True, False)
    # Lines [N, B, H, M, D]: N = position along the line, M = which line.
    f_lines = [jnp.moveaxis(x, 3, 0) for x in ((fq_cm, fk_cm) if along_rows else (fq_rm, fk_rm))]
    valid_lines = jnp.moveaxis(valid_cm if along_rows else valid_rm, 3, 0)     # [N, B, 1, M]
    k_line, v_line, key_valid = (k_cm, v_cm, valid_cm) if along_rows else (k_rm, v_rm, valid_rm)
    # k_line, v_line: [B, H, M, N, X]; key_valid: [B, 1, M, N]
    size, other = (rows, cols) if along_rows else (cols, rows)
    per_direction = [_combiner_common.exclusive_line_pools(f_lines, valid_lines, kind, not before)
                     for before in befores]
    # q^ per line: [B, H, M, E*N, D]; k^ and nonempty per query line position: [B, H, N, E*M, .].
    q_hat = jnp.stack([jnp.moveaxis(q, 0, 3) for (q, _), _ in per_direction], 3)
    k_hat = jnp.stack([jnp.moveaxis(k, 0, 2) for (_, k), _ in per_direction], 3)
    nonempty = jnp.stack([jnp.moveaxis(n, 0, 2) for _, n in per_direction], 3)
    order = jnp.stack([_order(size, True, before) for before in befores])      # [E, N(query), N(key)]
    spec = ("bhmqd,bhmnd->bhmqn", "bhmqn,bhmnv->bhmqv")
    v_hat = _combiner_common.span_values(_merge(q_hat), k_line, v_line,          # [B, H, M, E*N, V]
                                        key_valid[:, :, :, None, :] & order.reshape(-1, size),
                                        *spec)
    v_hat = _merge(jnp.transpose(v_hat.reshape(*v_hat.shape[:3], len(befores), size, -1),
                                 (0, 1, 4, 3, 2, 5)))                           # [B, H, N, E*M, V]
    if along_rows:
      other_lines = _order(other, False, None)                                  # [C, T]: t != c
    else:
      other_lines = _order(other, causal, None)                                 # [R, Z]
    allowed = _merge(nonempty)[:, :, :, None, :] & jnp.tile(other_lines, (1, len(befores)))
    return _merge(k_hat), v_hat, allowed

  def attend(vertical, horizontal, part_rng):
    row = [(k_rm, v_rm, row_allowed)] + ([span_family(along_rows=True)] if vertical else [])
    col = [(k_cm, v_cm, col_allowed)] + ([span_family(along_rows=False)] if horizontal else [])
    # One key axis per family (direct keys, then span summaries): one matmul each way per family.
    row, col = _concat_keys(row), _concat_keys(col)
    drop = _combiner_common.dropout_fn(dropout_rate, part_rng, 2)
    (row_k, row_v, row_ok), (col_k, col_v, col_ok) = row, col
    return _common.grid_masked_attention(                                    # [B, H, R, C, V]
        [(_common.dot_logits(q_rm, row_k, "bhrcd,bhrkd->bhrck"), row_ok, row_v)],
        [(_common.dot_logits(q_cm, col_k, "bhcrd,bhckd->bhcrk"), col_ok, col_v)], drop)

  if spans == "vertical":
    out = attend(True, False, rng)
  elif spans == "horizontal":
    out = attend(False, True, rng)
  elif mixture == "joint":
    out = attend(True, True, rng)
  else:
    rng_v, rng_h = (None, None) if rng is None else jax.random.split(rng)
    out = 0.5 * (attend(True, False, rng_v) + attend(False, True, rng_h))
  return _blocks.from_grid(out.astype(dtype))[:, :length]


def _concat_keys(parts):
  """[(keys [B, H, A, K_i, D], values [B, H, A, K_i, V], allowed [B, 1, A, 1|Q, K_i]), ...] -> one
  (keys, values, allowed) with the K_i concatenated."""
  if len(parts) == 1:
    return parts[0]
  keys, values, allowed = zip(*parts)
  queries = max(a.shape[3] for a in allowed)
  allowed = [jnp.broadcast_to(a, a.shape[:3] + (queries, a.shape[4])) for a in allowed]
  return (jnp.concatenate(keys, 3), jnp.concatenate(values, 3), jnp.concatenate(allowed, 4))


def _merge(x):
  """Merges axes 3 and 4 (span direction E and line position): [B, H, A, E, N, ...] -> [B, H, A, E*N, ...]."""
  return x.reshape(*x.shape[:3], x.shape[3] * x.shape[4], *x.shape[5:])
