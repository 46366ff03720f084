"""Efficient Attention (Shen et al. 2021, "Efficient Attention: Attention with Linear Complexities").
O(L·D·V) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim (= features M),
``V`` value dim.

``out = ρ_q(Q) (ρ_k(K)ᵀ V)`` with ``ρ_q`` a softmax over the feature axis of each query and ``ρ_k`` a
softmax over the length axis of the keys (masked: padded keys excluded), computed by
:func:`attention_zoo._linear_attention.feature_attention` in linear order. The effective matrix
``P = ρ_q(Q) ρ_k(K)ᵀ`` is non-negative and its rows sum to 1 (rows of ρ_q and columns of ρ_k sum to 1,
so ``Σ_j P_ij = Σ_d ρ_q(q_i)_d = 1``); the shared helper divides by that row sum, which is 1 up to
rounding.

No causal form: ρ_k normalises every feature over ALL key positions, so a past output would depend on
future keys; a prefix-normalised variant is not in the paper. ``causal=True`` raises
``NotImplementedError`` at call time.

Differences from the reference code (cmsflash/efficient-attention ``efficient_attention.py``):

- **Padding is masked**: padded keys are excluded from the length softmax (zero weight). The original
  works on image feature maps without padding.
- The original module's 1×1-convolution projections, re-projection and residual connection belong to
  the model here (the core owns no projections).
- No 1/√D scaling, as in the original (the softmaxes replace it). Multi-head: one ρ_q/ρ_k per head, as
  in the original's per-head channel split.
- **Dropout** (none in the original): whole keys are dropped from the numerator (kept with probability
  1 − p, scaled by 1/(1 − p); the normaliser keeps every key), i.e. attention dropout with one mask
  per key shared by all queries, unbiased.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from attention_zoo import _common, _linear_attention
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class EfficientAttentionConfig(AttentionConfig):
  """Efficient Attention has no options beyond ``causal`` (unsupported) and ``dropout_rate``."""

  family = "kernel"
  no_causal_form = ("the key softmax normalises each feature over all positions, so past outputs would depend "
                    "on future keys")


@register_attention("efficient_attention", EfficientAttentionConfig)
class EfficientAttention(nn.Module):
  """ρ_q(Q)(ρ_k(K)ᵀV); see the module docstring."""

  config: EfficientAttentionConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError(
          "efficient_attention has no causal form: the key softmax normalises each feature over all "
          "positions, so past outputs would depend on future keys")
    batch, length, heads, _ = query.shape
    mask = _common.default_mask(mask, batch, length)
    q_features = jax.nn.softmax(query.astype(_common.accum_dtype(query)), axis=-1)       # ρ_q
    k_features = _common.masked_softmax(key, mask[:, :, None, None], axis=1)            # ρ_k
    keep = _linear_attention.key_dropout(cfg.dropout_rate, deterministic, (batch, length, heads),
                                        q_features.dtype)
    out = _linear_attention.feature_attention(q_features, k_features, value, mask, keep=keep)
    return out.astype(value.dtype)
