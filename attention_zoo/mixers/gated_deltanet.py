"""Gated DeltaNet (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025),
as fla's layer ``GatedDeltaNet``: the delta rule with a Mamba-2-style data-dependent scalar decay per head.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key dim per head, ``V`` value dim per
head (``expand_v·K``), ``W`` short-convolution width (``conv_size``).

Equations (one layer, input ``x [B, L, D]``; per head, state ``S [K, V]``, ``S_0 = 0``)::

    q, k   = silu(conv_W(x W_q)), silu(conv_W(x W_k))     [B, L, H, K]
    v      = silu(conv_W(x W_v))                          [B, L, H, V]
    q, k   = q / sqrt(|q|² + 1e-6),  k / sqrt(|k|² + 1e-6)               (per head)
    β      = sigmoid(x W_b)                               [B, L, H]      (×2 with allow_neg_eigval)
    log α  = −exp(A_log) · softplus(x W_a + dt_bias)      [B, L, H]      (α_t ∈ (0, 1])
    S_t    = (I − β_t k_t k_tᵀ) α_t S_{t−1} + β_t k_t v_tᵀ                (decay, then the delta rule)
    o_t    = S_tᵀ (K^−½ q_t)                              [B, L, H, V]
    y      = (RMSNorm_V(o) ⊙ w ⊙ silu(x W_g)) W_o         [B, L, D]      (use_gate; RMSNorm_V(o) ⊙ w without)

``conv_W`` is the depthwise causal convolution of width W (``_layer_common.short_conv``). The recurrence runs in the
shared engine (``linear_recurrence`` with ``log_decay`` [B, L, H] and ``beta``; ``mode`` "chunk" is its
chunked WY/UT form, "recurrent" the token-by-token scan).

Defaults and initialisation, from fla-org/flash-linear-attention (read at bc3b101):

- ``fla/layers/gated_deltanet.py`` ``GatedDeltaNet.__init__``: expand_v 2, head_dim 256, num_heads 6, use_gate
  True, use_short_conv True, conv_size 4, conv_bias False, allow_neg_eigval False, norm_eps 1e-5; q/k/v/a/b/g/o
  projections without bias; the three short convolutions apply SiLU; ``A_log = log U[0, 16)`` [H];
  ``dt_bias``: dt = exp(U[log 0.001, log 0.1]) clamped at 1e-4, stored as softplus⁻¹(dt) [H] (Mamba-2's);
  ``o_norm`` = ``FusedRMSNormGated`` (RMSNorm, weight init 1, then ⊙ silu(g)) or ``RMSNorm`` without use_gate.
  Its docstring: "num_heads * head_dim = 0.75 * hidden_size" (2048 → 6 × 256).
- ``GatedDeltaNet.forward`` → ``chunk_gated_delta_rule(..., use_qk_l2norm_in_kernel=True,
  use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)``: l2-normalised q, k (``fla/modules/l2norm.py``,
  eps 1e-6), β = sigmoid(b) (×2 with allow_neg_eigval), scale K^−½.
- ``fla/ops/gated_delta_rule/gate.py`` ``naive_gdn_gate``: ``g = −exp(A_log) · softplus(a + dt_bias)``.
- ``fla/ops/gated_delta_rule/naive.py`` ``naive_recurrent_gated_delta_rule``: per token ``S ← S·exp(g)``,
  ``v' = β (v − Sᵀk)``, ``S += k v'ᵀ``, ``o = Sᵀ(K^−½ q)`` (the reference transcribed in the tests).
- Weights: ``fla/models/gated_deltanet/modeling_gated_deltanet.py`` ``_init_weights``: every ``nn.Linear`` and
  ``nn.Conv1d`` N(0, 0.02²) (``initializer_range``), biases zero; A_log and dt_bias as above.

Heads for any d_model: fla keeps ``H·K = 0.75·D`` with K = 256 at its widths; here the key dim is
``max(1, int(0.75·D))``, H = ⌈key dim / 256⌉ and K = key dim // H (so K ≤ 256 as the original's, and 2048 →
6 × 256): 16 → 1 × 12, 64 → 1 × 48, 128 → 1 × 96, 256 → 1 × 192, 512 → 2 × 192. Setting ``num_heads`` (or
``head_dim``) derives the other from the same key dim; setting both uses them as given.

Padding: as ``deltanet`` (each row's real tokens packed first, as fla's ``unpad_hidden_states``): the short
convolutions see the previous W − 1 real tokens, padded positions neither decay nor write the state, the
outputs at real positions equal those of the row with its padding removed; padded positions output 0.

Parameters ``ssm_A_log`` and ``ssm_dt_bias`` carry the harness's ``ssm_`` prefix: fla excludes them from
weight decay (``_no_weight_decay``), which here is ``optimizer.ssm_learning_rate`` = the learning rate with
``optimizer.ssm_weight_decay`` 0.

Differences from the original:

- Bidirectional (``causal=False``, the LRA default): the engine adds a backward pass over the reversed sequence
  that reads before writing (``linear_recurrence(..., causal=False)``); fla's layer is causal only. The short
  convolutions stay causal.
- Head count / head dim derived from d_model as above (fla's fixed 6 × 256 needs D = 2048).
- Grouped value heads (``num_v_heads`` > ``num_heads``, GVA) are not implemented: one value head per key head.
- Without the ``ssm_`` optimizer settings above, A_log and dt_bias get the ordinary weight decay.
- Dropout: fla's layer has none; ``config.dropout_rate`` is applied to the layer's output only.
- norm_eps is the layer's default 1e-5; fla's ``GatedDeltaNetConfig`` passes 1e-6 to its layers.
- Computation in float32 (float64 for float64 input), output cast to the input's dtype; parameters float32.
- No inference cache and no ``fused_recurrent`` switch for short inputs: the mode is ``config.mode``.
- Parameter layout is flax's: Dense kernels [in, out], short-convolution kernels [W, C].
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers._layer_common import (QKVConvStateSize, delta_rule_layer, dt_bias_init, key_heads,
                                                log_uniform_init, silu_gate, value_head_dim)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class GatedDeltaNetConfig(QKVConvStateSize, MixerConfig):
  """Gated DeltaNet options (defaults: fla ``fla/layers/gated_deltanet.py``; module docstring).

  Attributes:
    num_heads, head_dim: heads and key dim per head; None derives them from d_model (module docstring).
    expand_v: value dim per head as a multiple of the key dim.
    use_gate: output gate RMSNorm(o) ⊙ silu(x W_g) (True) or RMSNorm(o) alone.
    use_short_conv, conv_size, conv_bias: the causal depthwise convolutions on q, k, v.
    allow_neg_eigval: β ∈ (0, 2) instead of (0, 1).
    norm_eps: the output RMSNorm's epsilon.
    initializer_range: std of the projections' and convolutions' N(0, std²) initialisation.
    mode: "chunk" (the engine's chunked form) or "recurrent" (token-by-token scan).
    chunk_size: the chunk length of mode "chunk".
  """

  num_heads: int | None = None
  head_dim: int | None = None
  expand_v: float = 2.0
  use_gate: bool = True
  use_short_conv: bool = True
  conv_size: int = 4
  conv_bias: bool = False
  allow_neg_eigval: bool = False
  norm_eps: float = 1e-5
  initializer_range: float = 0.02
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "Gated DeltaNet"
  family: ClassVar[str] = "linear-recurrent"

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(H, K, V) at width ``d_model``: key dim int(0.75·D), K ≤ 256 (module docstring), V = expand_v·K."""
    heads, dk = key_heads(max(1, int(0.75 * d_model)), 256, self.num_heads, self.head_dim)
    return heads, dk, value_head_dim(dk, self.expand_v, "gated_deltanet")


@register_mixer("gated_deltanet", GatedDeltaNetConfig)
class GatedDeltaNet(nn.Module):
  """The Gated DeltaNet layer (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: GatedDeltaNetConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    def decay(h, linear, heads, dk, dv):  # fla's naive_gdn_gate: −exp(A_log)·softplus(a_proj(h) + dt_bias) [B, L, H]
      del dk, dv
      a_log = self.param("ssm_A_log", log_uniform_init(0.0, 16.0), (heads,)).astype(h.dtype)
      dt_bias = self.param("ssm_dt_bias", dt_bias_init(), (heads,)).astype(h.dtype)
      a = linear(heads, "a_proj")(h)
      return -jnp.exp(a_log) * jax.nn.softplus(a + dt_bias)

    return delta_rule_layer(self, x, mask, deterministic, decay, silu_gate if self.config.use_gate else None)
