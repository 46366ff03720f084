"""Combiner-Axial row-major (Ren et al., 2021; the released ``axial_rowmajor``) on an n x m grid.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
grid rows ``R`` = n (query row ``r``, other row ``z``), grid columns ``C`` = m (query column ``c``, key
column ``t``). Position ``i = r m + c``; m = ``width`` or ceil(sqrt(L)); padding masked.

For the query at ``(r, c)``: direct = its whole row (causal: ``t <= c``); spans = every other row ``z``
(causal: ``z < r``), an exact partition. The span "row ``z`` as seen from column ``c``" has a per-column
summary, as the released code: its local distribution is the row attention of the query at ``(z, c)``,

    a[z, c, t] = softmax_t(q[z, c] . k[z, t] / sqrt(D)),    v^[z, c] = sum_t a[z, c, t] v[z, t],

(if ``(z, c)`` is padding, its query is replaced by the max-pooled query of row ``z``), and its summary
key ``k^[z, c]`` is, by ``row_summary``:

- ``"proj"`` (default): ``w + w W`` with ``w = sum_t a[z, c, t] k[z, t]`` and a learned D x D ``W``
  (shared by heads, zero-initialised so training starts from ``"wsum"``). The released code projects the
  row OUTPUT (values) instead; that would make the core non-linear in ``value`` and break the
  effective-matrix probe of CONTRACT 1, so the projection acts on the attention-weighted keys.
- ``"wsum"``: ``w`` itself.
- ``"pool"``: the row's pooled keys (``abstraction``), the same for every column.

Unlike the released bidirectional code, the own row's summary is masked (no double count). Cost
O(L (m + n) D). Batch and heads are merged into one leading axis (``_common.merge_heads``): on XLA:CPU
the [B, H, ...] layout with batch 1 costs transposed copies (fwd+bwd at B=1, L=1024: ~2x slower).
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
class CombinerRowmajorConfig(AttentionConfig):
  """Attributes:
    width: grid columns m (e.g. the image width); ``None`` = ceil(sqrt(L)).
    row_summary: ``"proj"``, ``"wsum"`` or ``"pool"`` (summary key of a row span, see module docstring).
    abstraction: key pooling for ``row_summary="pool"``, one of ``_combiner_common.ABSTRACTIONS``.
  """

  family = "combiner"
  width: int | None = None
  row_summary: str = "proj"
  abstraction: str = "max"

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(the most over t ≤ L of K·⌊t/m⌋ + 3D·(t mod m)): per finished row its span summaries, K = 2D·m
    (k̂ and v̂ of every column; ``"pool"``: one pooled k̂ and m values, D·(m + 1)), and the current
    row's raw queries, keys and values (its direct part, and the row attention of each of its queries
    that forms those summaries when the row is done)."""
    _, width = _blocks.grid_shape(length, self.width)
    per_row = head_dim * (width + 1) if self.row_summary == "pool" else 2 * head_dim * width
    return num_heads * peak_over_prefixes(
        length, width, lambda t: per_row * (t // width) + 3 * head_dim * (t % width))


@register_attention("combiner_axial_rowmajor", CombinerRowmajorConfig)
class CombinerRowmajorAttention(nn.Module):
  """Combiner-Axial row-major core."""

  config: CombinerRowmajorConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.row_summary not in ("proj", "wsum", "pool"):
      raise ValueError(f"row_summary must be 'proj', 'wsum' or 'pool', got {cfg.row_summary!r}")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    proj = None
    if cfg.row_summary == "proj":  # [D, D], shared by heads; zero init: starts as "wsum"
      proj = self.param("summary_proj", nn.initializers.zeros, (key.shape[-1], key.shape[-1]))
    fk = None
    if cfg.row_summary == "pool":
      fk = _combiner_common.AbstractionFeatures(cfg.abstraction, name="key_abstraction")(key)
    return _rowmajor(query, key, value, mask, fk, proj,
                     _combiner_common.dropout_rng(self, cfg.dropout_rate, deterministic),
                     width=cfg.width, causal=cfg.causal,
                     kind=_combiner_common.pool_kind(cfg.abstraction), dropout_rate=cfg.dropout_rate)


@functools.partial(jax.jit, static_argnames=("width", "causal", "kind", "dropout_rate"))
def _rowmajor(query, key, value, mask, fk, proj, rng, *, width, causal, kind, dropout_rate):
  """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L]; fk: key abstraction features
  ([B, L, H, D], ``row_summary="pool"``) or None; proj: [D, D] (``"proj"``) or None.

  Layouts as in Combiner-Axial, with batch and heads merged into one leading axis ``N``
  (:func:`_common.merge_heads`): row-major ``_rm`` [N, R, C, X] for the row attention and the span
  summaries, column-major ``_cm`` [N, C, R, X] for the span logits (query (r, c) against summary
  (z, c): same column), one softmax across both (:func:`_common.joint_masked_attention`).
  """
  length, heads = query.shape[1:3]
  rows, cols = _blocks.grid_shape(length, width)
  grid = lambda x: _blocks.to_blocks(_common.merge_heads(_common.pad_axis(x, cols, 1)), cols)  # [N, R, C, X]
  q_rm, k_rm, v_rm = (grid(x) for x in (query, key, value))
  valid = _blocks.to_blocks(jnp.repeat(_common.pad_axis(mask, cols, 1, False), heads, 0), cols)  # [N, R, C]
  dtype = v_rm.dtype

  # Padded positions take their row's max-pooled query, so span summaries never read padding.
  row_query, row_nonempty = _combiner_common.pool(q_rm, valid, 2, "max")       # [N, R, D], [N, R]
  q_rm = jnp.where(valid[..., None], q_rm, row_query[:, :, None])

  # Row attention of every position: the direct logits and, for other rows, the span distributions
  # a[z, c, :], applied to values (v^) and, for "proj"/"wsum", to keys (the summary key), in one pass.
  row_logits = _common.dot_logits(q_rm, k_rm, "nrcd,nrtd->nrct")              # [N, R, C, T]
  row_keys_ok = valid[:, :, None, :]                                          # [N, R, 1, T]
  if fk is None:
    # Two contractions of the same softmax (XLA shares the exp): cheaper than one over a [V + D] concat.
    v_hat, k_hat = (_common.masked_attention(row_logits, row_keys_ok, x, "nzct,nztx->nzcx")
                    for x in (v_rm, k_rm))                                    # [N, Z, C, V], [N, Z, C, D]
    if proj is not None:
      k_hat = k_hat + jnp.einsum("nzcd,de->nzce", k_hat, proj.astype(k_hat.dtype))
  else:
    v_hat = _common.masked_attention(row_logits, row_keys_ok, v_rm, "nzct,nztv->nzcv")
    k_row, _ = _combiner_common.pool(grid(fk), valid, 2, kind)                 # [N, Z, D]
    k_hat = jnp.broadcast_to(k_row[:, :, None], k_rm.shape)                   # [N, Z, C, D]

  row_allowed = row_keys_ok
  if causal:
    row_allowed = row_allowed & _common.causal_allowed(cols, cols)             # [C, T]
  z, r = np.arange(rows)[None, :], np.arange(rows)[:, None]
  other_rows = jnp.asarray(z < r if causal else z != r)                       # [R, Z]
  span_allowed = row_nonempty[:, None, None, :] & other_rows                  # [N, 1, R, Z]
  swap = lambda x: jnp.swapaxes(x, 1, 2)                                      # row- <-> column-major
  span_logits = _common.dot_logits(swap(q_rm), swap(k_hat), "ncrd,nczd->ncrz")  # [N, C, R, Z]
  drop = _combiner_common.dropout_fn(dropout_rate, rng, 2)
  out = _common.joint_masked_attention([
      (row_logits, row_allowed, _common.contraction("nrct,nrtv->nrcv", v_rm)),
      (span_logits, span_allowed,
       lambda w: swap(_common.contraction("ncrz,nczv->ncrv", swap(v_hat))(w)), swap),
  ], drop).astype(dtype)                                                      # [N, R, C, V]
  return _common.split_heads(out.reshape(out.shape[0], -1, out.shape[-1]), heads)[:, :length]

