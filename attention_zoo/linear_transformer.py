"""Linear Transformer ("Transformers are RNNs", Katharopoulos et al. 2020). O(L·D·V) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim (= features M),
``V`` value dim.

Feature map ``φ(x) = elu(x) + 1`` (positive, deterministic), and::

    out_i = φ(q_i)ᵀ (Σ_j φ(k_j) v_jᵀ) / (φ(q_i)ᵀ Σ_j φ(k_j) + eps),   eps = 1e-6

over all real keys (bidirectional) or j ≤ i (causal, chunked prefix sums), computed by
:func:`attention_zoo._linear_attention.feature_attention` without the L×L matrix. The effective matrix
``P_ij = φ(q_i)·φ(k_j) / (Σ_j φ(q_i)·φ(k_j) + eps)`` is non-negative and its rows sum to 1 up to eps
(relative error ≤ eps / (φ(q_i)·Σ_j φ(k_j)), about 1e-7 for unit-scale inputs).

Differences from the reference code (LRA ``lra_benchmarks/models/linear_transformer/linear_attention.py``;
original idiap/fast-transformers ``attention/linear_attention.py`` and ``causal_linear_attention.py``;
eps is added to the denominator in all three, as here):

- **Padding is masked**: padded keys get zero features, hence zero weight (LRA ignored the padding
  mask; fast-transformers masks keys by their lengths as here).
- **Causal**: LRA silently ignored ``causal_mask`` (its attention was always bidirectional); here
  ``causal=True`` is the fast-transformers causal form, by chunked prefix sums (chunk ``causal_chunk``)
  instead of its CUDA causal dot product.
- **Dropout** (LRA deleted its dropout arguments: "figure out how to apply attention dropout"): with no
  probability matrix, ``dropout_rate`` drops whole keys from the numerator (kept with probability
  1 − p and scaled by 1/(1 − p), the denominator keeps every key): attention dropout with one mask per
  key shared by all queries, unbiased.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax

from attention_zoo import _common, _linear_attention
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class LinearTransformerConfig(AttentionConfig):
  """Linear Transformer options.

  Attributes:
    eps: added to the denominator (upstream 1e-6).
    causal_chunk: chunk length C of the causal prefix sums.
  """

  family = "kernel"
  eps: float = 1e-6
  causal_chunk: int = 64

  paper_name = "Linear Trans."

  def __post_init__(self):
    if self.eps < 0 or self.causal_chunk < 1:
      raise ValueError("linear_transformer eps must be >= 0 and causal_chunk >= 1")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(F·D + F), F = D: the running sums Σ φ(k) vᵀ and Σ φ(k) per head, whatever the length."""
    del length
    return num_heads * (head_dim * head_dim + head_dim)


def elu_features(x: jax.Array) -> jax.Array:
  """``elu(x) + 1`` [B, L, H, D] in float32 or wider."""
  return jax.nn.elu(x.astype(_common.accum_dtype(x))) + 1.0


@register_attention("linear_transformer", LinearTransformerConfig)
class LinearTransformerAttention(nn.Module):
  """elu+1 feature-map attention; see the module docstring."""

  config: LinearTransformerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, _ = query.shape
    mask = _common.default_mask(mask, batch, length)
    q_features, k_features = elu_features(query), elu_features(key)
    keep = _linear_attention.key_dropout(cfg.dropout_rate, deterministic, (batch, length, heads),
                                        q_features.dtype)
    out = _linear_attention.feature_attention(q_features, k_features, value, mask, causal=cfg.causal,
                                             chunk=cfg.causal_chunk, keep=keep, eps=cfg.eps)
    return out.astype(value.dtype)
