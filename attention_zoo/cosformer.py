"""cosFormer (Qin et al. 2022, "cosFormer: Rethinking Softmax in Attention"). O(L·D·V) time and memory.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``P`` position blocks (2: sin and cos).

ReLU features re-weighted by position, ``i = 1..L`` (1-based as upstream) and ``M = L``::

    q′_i = [relu(q_i) sin(πi/2M), relu(q_i) cos(πi/2M)],   k′_j likewise,
    out_i = Σ_j (q′_i·k′_j) v_j / max(q′_i·Σ_j k′_j, eps),   eps = 1e-6

so ``q′_i·k′_j = relu(q_i)·relu(k_j)·cos(π(i − j)/2M)``: a locality bias decaying with distance. The
re-weighting is two feature blocks (:func:`attention_zoo._linear_attention.positional_blocks`) and the
attention is :func:`attention_zoo._linear_attention.feature_attention` in linear order, over all real
keys (bidirectional) or j ≤ i (causal, chunked prefix sums).

Effective matrix: non-negative. Rows do NOT always sum to 1: when ``relu(q_i)`` shares no positive
coordinate with any visible key (e.g. q_i ≤ 0 everywhere) the denominator is clamped to eps and the row
is 0 (upstream behaves the same); rows sum to 1 wherever the denominator exceeds eps.

Differences from the reference code (OpenNLPLab/cosFormer ``cosformer.py``):

- ``M`` is the padded array length L here and ``max(source length, target length)`` there: the same
  for self-attention; positions count padded slots, so a middle padding does not shift real positions
  (and a batch's array length sets M, as upstream's tensor length does).
- **Padding is masked**: padded keys get zero features (upstream has no key padding mask).
- Only the ReLU feature map (upstream's ``act_fun="elu"`` branch, ``1 + F.elu``, does not run).
- **Causal** by chunked prefix sums (chunk ``causal_chunk``) instead of upstream's cumulative sum of
  the [L, 2D, V] outer products (memory L·D·V).
- **Dropout** (upstream stores ``dropout_rate`` but never applies it): whole keys are dropped from the
  numerator (kept with probability 1 − p, scaled by 1/(1 − p); the denominator keeps every key), i.e.
  attention dropout with one mask per key shared by all queries, unbiased.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common, _linear_attention
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class CosformerConfig(AttentionConfig):
  """cosFormer options.

  Attributes:
    eps: lower clamp of the denominator (upstream 1e-6).
    causal_chunk: chunk length C of the causal prefix sums.
  """

  family = "kernel"
  eps: float = 1e-6
  causal_chunk: int = 64

  rows_sum_to_one = False  # a denominator clamped to eps gives a zero row (module docstring)

  def __post_init__(self):
    if self.eps <= 0 or self.causal_chunk < 1:
      raise ValueError("cosformer eps must be > 0 and causal_chunk >= 1")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int:
    """H·(F·D + F), F = 2D: the running sums of the sin- and cos-weighted blocks; the re-weighting
    needs only the step i and M = L, known in advance, not a per-layer float."""
    del length
    features = 2 * head_dim
    return num_heads * (features * head_dim + features)


def position_weights(length: int, dtype) -> jax.Array:
  """[L, 2]: ``sin(πi/2L), cos(πi/2L)`` for i = 1..L."""
  angle = (math.pi / 2) * jnp.arange(1, length + 1, dtype=dtype) / length
  return jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1)


@register_attention("cosformer", CosformerConfig)
class CosformerAttention(nn.Module):
  """ReLU features with cos re-weighting; see the module docstring."""

  config: CosformerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    batch, length, heads, _ = query.shape
    mask = _common.default_mask(mask, batch, length)
    dtype = _common.accum_dtype(query, key)
    weights = position_weights(length, dtype)                                # [L, P]
    q_features, k_features = (_linear_attention.positional_blocks(jax.nn.relu(x.astype(dtype)), weights)
                              for x in (query, key))                         # [B, L, H, 2D]
    keep = _linear_attention.key_dropout(cfg.dropout_rate, deterministic, (batch, length, heads), dtype)
    out = _linear_attention.feature_attention(q_features, k_features, value, mask, causal=cfg.causal,
                                             chunk=cfg.causal_chunk, keep=keep, clamp=cfg.eps)
    return out.astype(value.dtype)
