"""Scatterbrain (Chen et al. 2021): Performer low-rank attention plus an exact sparse correction on a
local band. O(L·(M·(D + V) + w·(D + M + V))) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim, ``M``
random features, ``N`` query blocks of ``S`` positions (``Q`` query inside a block), ``K`` the 3·S keys
of blocks n−1, n, n+1 (the band lies inside them).

With FAVOR+ features φ (imported from :mod:`attention_zoo.performer`) and the band
``Ω = {(i, j): −⌊w/2⌋ ≤ j − i < ⌈w/2⌉}`` (w = ``local_context``, upstream ``local_dot_product``), the
unnormalised attention matrix is ``A = φ(Q)φ(K)ᵀ + S`` with the sparse correction
``S_ij = exp(q_i·k_j/√D) − φ(q_i)·φ(k_j)`` on Ω and 0 elsewhere, so ``A`` is exact on the band and
low-rank off it:

    out_i = [Σ_{j∈Ω_i} e^{l_ij} v_j + φ(q_i)·(φ(K)ᵀV) − Σ_{j∈Ω_i} φ(q_i)·φ(k_j) v_j]
            / [Σ_{j∈Ω_i} e^{l_ij} + φ(q_i)·Σ_j φ(k_j) − Σ_{j∈Ω_i} φ(q_i)·φ(k_j)]

(HazyResearch ``SBLocalAttention``). φ carries the stabilising factors e^{−c_i} (query) and e^{−c_K}
(keys, one per batch and head) of :func:`performer.softmax_features`; the exact band terms are taken at
the same scale and both are shifted by a per-query peak ``p_i = max(max_Ω l_ij, c_i + c_K)`` so no
exponent is positive. Band logits and weights are computed on banded blocks (queries in blocks of
S = w, keys from the neighbouring blocks), never as an L×L matrix. Every row sums to 1 and every weight
is ≥ 0 (off the band it is φ(q_i)·φ(k_j) ≥ 0); with a band covering all pairs it is exact softmax.

Differences from the reference code (HazyResearch ``sblocal_attention.py``):

- The low-rank denominator ``φ(q)·Σφ(K) − Σ_Ω φφ`` is used as is (it is ≥ 0: all features are
  non-negative) instead of being clamped at 1e-24 inside a log; the combination is done with a shared
  per-query peak instead of ``logaddexp`` (same values).
- Feature maps: this repository's FAVOR+ (:func:`performer.softmax_features`: query stabiliser = max over
  features, key stabiliser = max over real keys and features; ``numerical_stabilizer`` ε = 0 by default,
  upstream ``softmax_eps=0``), with the Performer's redraw options (``"every_call"`` from the
  ``"attention"`` RNG stream, or ``"fixed"`` from ``seed`` folded with the module path).
- Padded keys get zero features and are excluded from the band (upstream: key-padding lengths, which
  assume padding at the end only; any mask works here).
- Dropout as upstream: only the exact band weights are dropped (numerator only, scaled by 1/(1−p)); the
  low-rank part and the normaliser are not. Unbiased.
- ``causal=True`` raises ``NotImplementedError``: it needs the causal prefix sums' numerator and
  denominator separately and a causal-safe key stabiliser at the exact band's scale (upstream marks its
  causal path "TODO: check causal").
- Defaults: ``local_context = 64`` and ``nb_features = 256`` (upstream takes both from its experiment
  configs; there is no LRA default).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _blocks, _common
from attention_zoo.adaptive_span import neighbour_blocks, neighbour_positions
from attention_zoo import performer
from attention_zoo.performer import softmax_features
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class ScatterbrainConfig(AttentionConfig):
  """Scatterbrain options.

  Attributes:
    local_context: w, the band width: query i sees keys j with −⌊w/2⌋ ≤ j − i < ⌈w/2⌉ exactly.
    nb_features: M, the number of FAVOR+ random features.
    orthogonal: orthogonal feature blocks (True) or iid Gaussian rows.
    feature_norms: ``"chi"`` or ``"sqrt_d"`` row norms (see ``performer.draw_projection``).
    redraw: ``"every_call"`` (``"attention"`` RNG stream, falling back to the fixed draw) or ``"fixed"``.
    seed: seed of the fixed draw (folded with the module path).
    numerical_stabilizer: ε added to every feature (upstream ``softmax_eps`` = 0).
  """

  family = "kernel"
  no_causal_form = ("not implemented (it needs causal prefix sums with a separate normaliser and a "
                    "causal-safe stabiliser)")
  local_context: int = 64
  nb_features: int = 256
  orthogonal: bool = True
  feature_norms: str = "chi"
  redraw: str = "every_call"
  seed: int = 0
  numerical_stabilizer: float = 0.0

  def __post_init__(self):
    if self.local_context < 1 or self.nb_features < 1:
      raise ValueError("scatterbrain local_context and nb_features must be >= 1")
    if self.redraw not in ("every_call", "fixed"):
      raise ValueError(f"scatterbrain redraw must be 'every_call' or 'fixed', got {self.redraw!r}")


def feature_log_scales(query: jax.Array, key: jax.Array, projection: jax.Array, mask: jax.Array):
  """The stabilisers that :func:`performer.softmax_features` divides out: c_i [B, L, H] (query: max over
  features) + c_K [B, 1, H] (keys: max over real keys and features) of ``x̃·w − |x̃|²/2``. They
  must be exactly the stabilisers of ``softmax_features``; this core's definition test checks that."""
  def z(x):
    x = x.astype(projection.dtype) * x.shape[-1] ** -0.25
    return jnp.einsum("blhd,md->blhm", x, projection) - 0.5 * jnp.sum(x * x, -1, keepdims=True)

  c_query = jnp.max(z(query), axis=-1)
  c_key = jnp.max(jnp.where(mask[:, :, None, None], z(key), _common.NEG_INF), axis=(1, 3))[:, None]
  c_key = jnp.where(c_key > 0.5 * _common.NEG_INF, c_key, 0.0)
  return jax.lax.stop_gradient(c_query + c_key)


@register_attention("scatterbrain", ScatterbrainConfig)
class ScatterbrainAttention(nn.Module):
  """Performer + exact local band correction; see the module docstring."""

  config: ScatterbrainConfig

  def projection(self, dim: int, dtype) -> jax.Array:
    """W [M, D]: redrawn from the ``"attention"`` stream, or the fixed per-layer draw."""
    return performer.module_projection(self, self.config, dim, dtype)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("scatterbrain: the causal form (causal prefix sums with a separate "
                                "normaliser and a causal-safe stabiliser) is not implemented")
    batch, length, _, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    dtype = _common.accum_dtype(query, key)
    projection = self.projection(dim, dtype)
    q_feat = softmax_features(query, projection, is_query=True, stabilizer=cfg.numerical_stabilizer)
    k_feat = softmax_features(key, projection, is_query=False, mask=mask, stabilizer=cfg.numerical_stabilizer)
    scale = feature_log_scales(query, key, projection, mask)                          # [B, L, H]
    v_acc = value.astype(dtype)
    lowrank_num = jnp.einsum("blhm,bhmv->blhv", q_feat, jnp.einsum("blhm,blhv->bhmv", k_feat, v_acc))
    lowrank_den = jnp.einsum("blhm,bhm->blh", q_feat, jnp.sum(k_feat, axis=1))

    size = min(cfg.local_context, -(-length // 8) * 8)
    q_b, k_b, v_b, mask_b = _blocks.pad_qkv_to_multiple(query, key, v_acc, mask, size)
    qf_b, kf_b = (_common.pad_axis(x, size) for x in (q_feat, k_feat))
    q_pos, k_pos = neighbour_positions(q_b.shape[1] // size, size)
    offset = k_pos[:, None, :] - q_pos[:, :, None]                                    # [N, Q, K]
    band = (offset >= -(cfg.local_context // 2)) & (offset < (cfg.local_context + 1) // 2)
    allowed = neighbour_blocks(mask_b, size)[:, :, None, :] & band                    # [B, N, Q, K]
    allowed = allowed[:, :, :, None, :]                                               # [B, N, Q, 1, K]
    logits = _common.dot_logits(_blocks.to_blocks(q_b, size), neighbour_blocks(k_b, size),
                               "bnqhd,bnkhd->bnqhk")                                  # [B, N, Q, H, K]
    lowrank_band = jnp.einsum("bnqhm,bnkhm->bnqhk", _blocks.to_blocks(qf_b, size),
                              neighbour_blocks(kf_b, size)) * allowed
    scale_b = _blocks.to_blocks(_common.pad_axis(scale, size), size)                    # [B, N, Q, H]
    masked = jnp.where(allowed, logits, _common.NEG_INF)
    peak = jax.lax.stop_gradient(jnp.maximum(jnp.max(masked, -1), scale_b))
    exact = jnp.exp(masked - peak[..., None]) * allowed
    lowrank_weight = jnp.exp(scale_b - peak)                                          # [B, N, Q, H]
    v_near = neighbour_blocks(v_b, size)
    dropped = _common.apply_dropout(exact, cfg.dropout_rate, deterministic)
    band_num = jnp.einsum("bnqhk,bnkhv->bnqhv", dropped - lowrank_band * lowrank_weight[..., None], v_near)
    band_den = jnp.sum(exact - lowrank_band * lowrank_weight[..., None], -1)
    unblock = lambda x: _blocks.from_blocks(x)[:, :length]
    numerator = unblock(band_num) + lowrank_num * unblock(lowrank_weight)[..., None]
    denominator = unblock(band_den) + lowrank_den * unblock(lowrank_weight)
    return _common.normalize(numerator, denominator).astype(value.dtype)
