"""Random Feature Attention (Peng et al. 2021, ICLR). O(L·M·V) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``M`` random frequencies (2M features).

Random Fourier features of ℓ2-normalised queries and keys, ``x̂ = x/|x|``::

    φ(x) = M^{-1/2} [sin(W_h x̂), cos(W_h x̂)],   W_h = σ_h ∘ W̃,  W̃ [M, D] ~ N(0, I)

so ``E[φ(x)·φ(y)] = exp(−Σ_d σ_d² (x̂ − ŷ)_d² / 2)``, which for σ = s·1 is ``exp(s²(x̂·ŷ − 1))``: a
softmax with temperature 1/s² over ``x̂·ŷ``. σ [H, D] is a learned parameter (``learn_sigma``,
initialised to ``init_sigma``; the paper learns σ through ``w = σ ∘ w̃``; per head and dimension
here). Attention is :func:`attention_zoo._linear_attention.feature_attention`::

    out_i = φ(q̂_i)·Σ_j φ(k̂_j) v_jᵀ / max(φ(q̂_i)·Σ_j φ(k̂_j), floor)

bidirectional, or causal (j ≤ i, chunked prefix sums). ``gated=True`` (causal only) is the paper's
gated RFA: a scalar gate per position and head ``g_t = sigmoid(w_h·k_t + b_h)``,
``S_t = g_t S_{t−1} + (1 − g_t) φ(k_t) v_tᵀ`` and ``z_t = g_t z_{t−1} + (1 − g_t) φ(k_t)``,
``out_t = φ(q_t)ᵀS_t / φ(q_t)·z_t``. It is the shared helper with the per-key log scale
``r_j = log(1 − g_j) − Σ_{t≤j} log g_t`` (the per-query factor ``Π_{t≤i} g_t`` cancels in the ratio);
padded positions have ``g = 1`` (neither decay nor input).

Effective matrix: not non-negative (sin/cos features), and rows sum to exactly 1 only while the
denominator estimate stays above ``floor`` (1e-6). The estimate is a sum of kernel values
``exp(σ²(q̂·k̂ − 1))`` plus noise of order M^{-1/2} per key, so with few features or a large σ (small
kernel values) it can fall below the floor: such a row is divided by the floor, not normalised, and can
be huge. Use enough features (default M = 128) for the σ the model learns.

In the gated form the log scale is a cumulative sum over positions: in float32 its rounding grows with
L·|log g| (relative weight error ~1e-4 at L = 4K, g ≈ 0.7).

Differences from the paper (no official code was released; this follows the paper's equations):

- The gate is computed from the key ``k_t`` (the core does not see the layer input ``x_t`` the paper
  uses); its initialisation (``gate_bias_init`` = 1, g ≈ 0.73) is our choice.
- **Redraw** (``redraw``): ``"every_call"`` draws W̃ from the flax ``"attention"`` RNG stream on every
  call, falling back to the fixed draw when the stream is absent; ``"fixed"`` draws it once from
  ``key(seed)`` folded with the module path (as Performer). The paper resamples W̃ during training.
  W̃ rows are iid Gaussian (``orthogonal=False`` of ``performer.draw_projection``), M = ``nb_features``.
- The denominator is clamped at ``floor`` (the paper states none).
- **Padding is masked**: padded keys get zero features.
- **Dropout**: whole keys are dropped from the numerator (kept with probability 1 − p, scaled by
  1/(1 − p); the denominator keeps every key), i.e. attention dropout with one mask per key shared by
  all queries, unbiased.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common, _linear_attention, performer
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class RFAConfig(AttentionConfig):
  """RFA options.

  Attributes:
    nb_features: M, the number of random frequencies (2M features: sin and cos).
    learn_sigma: learn σ [H, D] (else fixed at ``init_sigma``).
    init_sigma: initial σ (σ = 1: ``exp(x̂·ŷ − 1)``).
    gated: the gated causal variant (requires ``causal=True``).
    gate_bias_init: initial gate bias b (g = sigmoid(w·k + b)).
    redraw: ``"every_call"`` (``"attention"`` RNG stream, falling back to the fixed draw) or ``"fixed"``.
    seed: seed of the fixed draw (folded with the module path, so layers differ).
    floor: lower clamp of the denominator.
    causal_chunk: chunk length C of the causal prefix sums.
  """

  family = "kernel"
  nb_features: int = 128
  learn_sigma: bool = True
  init_sigma: float = 1.0
  gated: bool = False
  gate_bias_init: float = 1.0
  redraw: str = "every_call"
  seed: int = 0
  floor: float = 1e-6
  causal_chunk: int = 64

  nonnegative = False      # sin/cos features
  rows_sum_to_one = False  # only while the denominator estimate stays above ``floor``

  def __post_init__(self):
    if self.redraw not in ("every_call", "fixed"):
      raise ValueError(f"rfa redraw must be 'every_call' or 'fixed', got {self.redraw!r}")
    if self.nb_features < 1 or self.causal_chunk < 1 or self.init_sigma <= 0 or self.floor <= 0:
      raise ValueError("rfa nb_features, causal_chunk must be >= 1 and init_sigma, floor > 0")
    if self.gated and not self.causal:
      raise ValueError("rfa gated=True is the causal (recurrent) variant: it needs causal=True")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(F·D + F), F = 2M (sin and cos of ``nb_features`` frequencies): S = Σ φ(k) vᵀ and z = Σ φ(k)
    per head (gated: the same S and z, decayed in place by g_t)."""
    del length
    features = 2 * self.nb_features
    return num_heads * (features * head_dim + features)


def fourier_features(x: jax.Array, projection: jax.Array) -> jax.Array:
  """``M^{-1/2}[sin(W x̂), cos(W x̂)]`` [B, L, H, 2M] of x [B, L, H, D]; projection [H, M, D]."""
  x = x.astype(projection.dtype)
  unit = x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-12))
  angles = jnp.einsum("blhd,hmd->blhm", unit, projection)
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], -1) * projection.shape[1] ** -0.5


def gate_log_scale(key: jax.Array, mask: jax.Array, kernel: jax.Array, bias: jax.Array) -> jax.Array:
  """r_j = log(1 − g_j) − Σ_{t≤j} log g_t [B, L, H] with g = sigmoid(w·k + b), g = 1 on padding."""
  logits = jnp.einsum("blhd,hd->blh", key.astype(kernel.dtype), kernel) + bias
  real = mask[:, :, None]
  log_gate = jnp.where(real, jax.nn.log_sigmoid(logits), 0.0)
  return jax.nn.log_sigmoid(-logits) - jnp.cumsum(log_gate, axis=1)


@register_attention("rfa", RFAConfig)
class RFAAttention(nn.Module):
  """Random Fourier feature attention (optionally gated); see the module docstring."""

  config: RFAConfig

  def base_projection(self, dim: int, dtype) -> jax.Array:
    """W̃ [M, D]: redrawn from the ``"attention"`` stream, or the fixed per-layer draw."""
    cfg = self.config
    key = _common.draw_key(self, cfg.redraw, cfg.seed)
    return performer.draw_projection(key, cfg.nb_features, dim, orthogonal=False, dtype=dtype)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    dtype = _common.accum_dtype(query, key)
    sigma = jnp.full((heads, dim), cfg.init_sigma, dtype)
    if cfg.learn_sigma:
      sigma = self.param("sigma", lambda _, shape: jnp.full(shape, cfg.init_sigma, jnp.float32),
                         (heads, dim)).astype(dtype)
    projection = jnp.einsum("md,hd->hmd", self.base_projection(dim, dtype), sigma)   # [H, M, D]
    self.sow("intermediates", "projection", projection)
    q_features, k_features = fourier_features(query, projection), fourier_features(key, projection)
    log_scale = None
    if cfg.gated:
      kernel = self.param("gate_kernel", nn.initializers.normal(dim ** -0.5), (heads, dim)).astype(dtype)
      bias = self.param("gate_bias", nn.initializers.constant(cfg.gate_bias_init), (heads,)).astype(dtype)
      log_scale = gate_log_scale(key, mask, kernel, bias)
    keep = _linear_attention.key_dropout(cfg.dropout_rate, deterministic, (batch, length, heads), dtype)
    out = _linear_attention.feature_attention(q_features, k_features, value, mask, causal=cfg.causal,
                                             chunk=cfg.causal_chunk, keep=keep, k_log_scale=log_scale,
                                             clamp=cfg.floor)
    return out.astype(value.dtype)
