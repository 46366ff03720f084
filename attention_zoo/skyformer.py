"""Skyformer (Chen et al. 2021): Nyström-approximated Gaussian-kernel attention, and its exact form.

Axis legend: ``B`` batch, ``L`` length (``Q`` queries / ``K`` keys in the exact form), ``H`` heads,
``D`` query/key head dim, ``V`` value dim, ``M`` / ``N`` landmarks.

Both cores replace softmax by the Gaussian kernel on ``q̃ = q·D^{-1/4}``, ``k̃ = k·D^{-1/4}``::

    κ(x, y) = exp(x·y − ‖x‖²/2 − ‖y‖²/2) = exp(−‖x − y‖²/2)  ∈ (0, 1],

**without** row normalisation: ``out_i = Σ_j κ(q̃_i, k̃_j) v_j`` over real keys j.

- ``kernelized`` — that sum computed exactly (O(L²); the repository's ``SoftmaxAttention_RBF``, selected
  by ``attn_type="kernelized"``). Weights are non-negative; rows do not sum to 1. ``causal=True`` masks
  j > i.
- ``skyformer`` — O(L·M·(D + V)). M = ``nb_features`` = 128 landmarks ``S`` are sampled rows of the
  stacked ``[q̃; k̃]`` [2L, D]: the first M/2 uniformly (with replacement) among the real queries, the
  rest among the real keys. With ``A = κ(S, S) + λI`` (λ = ``ridge`` = 0.1) and
  ``D_A = diag(A·1)``, the inverse is taken on the symmetrically normalised matrix::

      out = κ(q̃, S) · D_A^{-1/2} Zᵀ D_A^{-1/2} · κ(S, k̃) v,    Z = pinv(D_A^{-1/2} A D_A^{-1/2})

  (≈ κ(q̃, S) A^{-1} κ(S, k̃) v; the normalisation only conditions the iteration), with Z from
  ``nystromformer.iterative_pinv`` (6 iterations). The effective matrix has negative entries and rows
  that do not sum to 1. ``causal=True`` raises ``NotImplementedError``: the landmarks and the inverse mix
  all positions.

Differences from the original (pkuzengqi/Skyformer ``src/models/attention_skyformer.py``,
``code/models/attention.py``; LRA configs: ``nb_features=128``, ``accumulation=1``):

- **Scale**: the original multiplies q and k by the constant ``32^{-1/4}`` (its head dim was always 32);
  here ``D^{-1/4}`` for the actual D (the same at D = 32). ``kernelized`` used ``D^{-1/4}`` already.
- **Landmark draw**: the original drew ``floor(u·n_real)`` with fresh ``torch.rand`` on every call,
  assuming padding at the end; here u comes from the flax ``"attention"`` stream (``redraw=
  "every_call"``; without that stream — e.g. evaluation — or with ``redraw="fixed"``: a fixed draw from
  ``key(seed)`` folded with the module path) and indexes the real positions in order, wherever the
  padding is. As in the original one u is shared by the batch and the heads.
- **Pseudo-inverse init**: per matrix by default; the original's batch-wide maximum is
  ``pinv_init="batch"`` (see ``nystromformer``).
- **Dropout**: the original Skyformer had none (``kernelized`` dropped its weights with
  ``nn.Dropout``, as here). Skyformer drops the entries of ``κ(S, k̃)`` (inverted dropout; the output is
  linear in them, so unbiased).
- Padded keys are zeroed in ``κ(S, k̃)`` as in the original; an example without real tokens gives zeros.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.nystromformer import iterative_pinv
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class KernelizedConfig(AttentionConfig):
  """Exact Gaussian-kernel attention; no options beyond ``causal`` and ``dropout_rate``."""

  family = "kernel"
  rows_sum_to_one = False

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """2·H·D·L: an exact Gaussian kernel (no finite feature map), so every past key and value."""
    return 2 * num_heads * head_dim * length


@dataclasses.dataclass(frozen=True)
class SkyformerConfig(AttentionConfig):
  """Skyformer options (defaults: the original's LRA settings).

  Attributes:
    nb_features: M, landmarks sampled from the stacked [queries; keys] (half from each).
    ridge: λ added to the landmark kernel matrix's diagonal.
    pinv_iterations: iterations of ``nystromformer.iterative_pinv``.
    pinv_init: ``"per_matrix"`` or ``"batch"`` (the original's batch-wide scale).
    redraw: ``"every_call"`` (``"attention"`` RNG stream, falling back to the fixed draw) or ``"fixed"``.
    seed: seed of the fixed draw (folded with the module path, so layers differ).
  """

  family = "kernel"
  nonnegative = False
  rows_sum_to_one = False
  no_causal_form = "its landmarks and their inverse mix all positions"

  nb_features: int = 128
  ridge: float = 0.1
  pinv_iterations: int = 6
  pinv_init: str = "per_matrix"
  redraw: str = "every_call"
  seed: int = 0

  def __post_init__(self):
    if self.nb_features < 2:
      raise ValueError(f"skyformer nb_features must be >= 2 (half queries, half keys), got {self.nb_features}")
    if self.ridge < 0 or self.pinv_iterations < 0:
      raise ValueError("skyformer ridge and pinv_iterations must be >= 0")
    if self.pinv_init not in ("per_matrix", "batch"):
      raise ValueError(f"pinv_init must be 'per_matrix' or 'batch', got {self.pinv_init!r}")
    if self.redraw not in ("every_call", "fixed"):
      raise ValueError(f"skyformer redraw must be 'every_call' or 'fixed', got {self.redraw!r}")


def scaled(x: jax.Array) -> jax.Array:
  """x·D^{-1/4} in float32 or wider."""
  return x.astype(_common.accum_dtype(x)) * x.shape[-1] ** -0.25


def gaussian_kernel(x: jax.Array, y: jax.Array) -> jax.Array:
  """κ(x, y) = exp(x·y − ‖x‖²/2 − ‖y‖²/2): x [B, P, H, D], y [B, R, H, D] -> [B, H, P, R]."""
  half_x = 0.5 * jnp.einsum("bphd,bphd->bhp", x, x)
  half_y = 0.5 * jnp.einsum("brhd,brhd->bhr", y, y)
  return jnp.exp(jnp.einsum("bphd,brhd->bhpr", x, y) - half_x[..., None] - half_y[..., None, :])


def real_positions(mask: jax.Array, uniforms: jax.Array) -> jax.Array:
  """For each example, the real position of rank ``floor(u·n_real)``: mask bool [B, L], uniforms [M] in
  [0, 1) -> int [B, M] (position 0 where an example has no real token)."""
  count = jnp.sum(mask, axis=1)                                               # [B]
  rank = jnp.floor(uniforms[None, :] * count[:, None]).astype(jnp.int32)
  rank = jnp.clip(rank, 0, jnp.maximum(count - 1, 0)[:, None])
  order = jnp.argsort(~mask, axis=1, stable=True)                             # real positions first
  return jnp.take_along_axis(order, rank, axis=1)


@register_attention("kernelized", KernelizedConfig)
class KernelizedAttention(nn.Module):
  """Σ_j exp(−‖q̃_i − k̃_j‖²/2) v_j over allowed keys (exact, unnormalised)."""

  config: KernelizedConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    allowed = mask[:, None, None, :]                                          # [B, 1, 1, K]
    if self.config.causal:
      allowed = allowed & _common.causal_allowed(length, length)[None, None]
    weights = gaussian_kernel(scaled(query), scaled(key)) * allowed          # [B, H, Q, K]
    weights = _common.apply_dropout(weights, self.config.dropout_rate, deterministic)
    out = jnp.einsum("bhqk,bkhv->bqhv", weights, value.astype(weights.dtype))
    return out.astype(value.dtype)


@register_attention("skyformer", SkyformerConfig)
class SkyformerAttention(nn.Module):
  """Nyström approximation of Gaussian-kernel attention (module docstring)."""

  config: SkyformerConfig

  def uniforms(self, count: int) -> jax.Array:
    """u [M] in [0, 1): from the ``"attention"`` stream, or the fixed per-layer draw."""
    cfg = self.config
    rng = _common.draw_key(self, cfg.redraw, cfg.seed)
    return jax.random.uniform(rng, (count,))

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("skyformer has no causal form: its landmarks and their inverse mix all "
                                "positions")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    num_q = cfg.nb_features // 2
    positions = real_positions(mask, self.uniforms(cfg.nb_features))          # [B, M]
    positions = positions + jnp.where(jnp.arange(cfg.nb_features) < num_q, 0, length)
    self.sow("intermediates", "landmarks", positions)
    q, k = scaled(query), scaled(key)
    landmarks = jnp.take_along_axis(jnp.concatenate([q, k], axis=1), positions[:, :, None, None], axis=1)
    core = gaussian_kernel(landmarks, landmarks)                               # [B, H, M, N]
    core = core + cfg.ridge * jnp.eye(cfg.nb_features, dtype=core.dtype)
    inv_sqrt = jax.lax.rsqrt(jnp.sum(core, axis=-1))                           # [B, H, M]
    inverse = iterative_pinv(inv_sqrt[..., :, None] * core * inv_sqrt[..., None, :],
                             cfg.pinv_iterations, cfg.pinv_init)               # Z [B, H, N, M]
    key_side = gaussian_kernel(k, landmarks) * mask[:, None, :, None]          # [B, H, L, N]
    key_side = _common.apply_dropout(key_side, cfg.dropout_rate, deterministic)
    context = jnp.einsum("bhln,blhv->bhnv", key_side, value.astype(q.dtype))   # [B, H, N, V]
    mixed = inv_sqrt[..., :, None] * jnp.einsum("bhnm,bhnv->bhmv", inverse, inv_sqrt[..., None] * context)
    out = jnp.einsum("bhlm,bhmv->blhv", gaussian_kernel(q, landmarks), mixed)
    return out.astype(value.dtype)
