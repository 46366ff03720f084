"""KDA, Kimi Delta Attention (Kimi Team, "Kimi Linear: An Expressive, Efficient Attention Architecture", 2025), as
fla's layer ``KimiDeltaAttention``: Gated DeltaNet with a per-key-channel decay (a vector gate per head).

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key dim per head, ``V`` value dim per
head (``expand_v·K``), ``R`` rank of the low-rank gate projections (= V), ``W`` short-convolution width.

Equations (one layer, input ``x [B, L, D]``; per head, state ``S [K, V]``, ``S_0 = 0``)::

    q, k   = silu(conv_W(x W_q)), silu(conv_W(x W_k))           [B, L, H, K]
    v      = silu(conv_W(x W_v))                                [B, L, H, V]
    q, k   = q / sqrt(|q|² + 1e-6),  k / sqrt(|k|² + 1e-6)                     (per head)
    β      = sigmoid(x W_b)                                     [B, L, H]      (×2 with allow_neg_eigval)
    log α  = −exp(A_log)_h · softplus(x W_f↓ W_f↑ + dt_bias)    [B, L, H, K]   (α_t ∈ (0, 1]^K)
    S_t    = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t−1} + β_t k_t v_tᵀ
    o_t    = S_tᵀ (K^−½ q_t)                                    [B, L, H, V]
    y      = (RMSNorm_V(o) ⊙ w ⊙ sigmoid(x W_g↓ W_g↑ + b_g)) W_o               [B, L, D]

``W_f↓`` [D, R], ``W_f↑`` [R, H·K], ``W_g↓`` [D, R], ``W_g↑`` [R, H·V] (+ bias b_g) are the low-rank gate and
output-gate projections. ``conv_W`` is the depthwise causal convolution of width W (``_layer_common.short_conv``).
The recurrence runs in the shared engine (``linear_recurrence`` with ``log_decay`` [B, L, H, K] and ``beta``;
``mode`` "chunk" is its chunked form, "recurrent" the token-by-token scan).

Defaults and initialisation, from fla-org/flash-linear-attention (read at bc3b101; the KDA files say "modified
and supported by the Moonshot AI Team"):

- ``fla/layers/kda.py`` ``KimiDeltaAttention.__init__``: expand_v 1, head_dim 128, num_heads 16 (16 × 128 =
  hidden_size 2048), use_short_conv True, conv_size 4, conv_bias False, allow_neg_eigval False, norm_eps 1e-5;
  q/k/v/b/o projections without bias; SiLU in the three short convolutions; ``f_proj`` = Linear(D, V) →
  Linear(V, H·K), both without bias; ``g_proj`` = Linear(D, V) → Linear(V, H·V) with bias;
  ``A_log = log U[1, 16)`` [H]; ``dt_bias`` [H·K]: dt = exp(U[log 0.001, log 0.1]) clamped at 1e-4, stored as
  softplus⁻¹(dt); ``o_norm`` = ``FusedRMSNormGated(V, activation="sigmoid")`` (RMSNorm, weight init 1, then
  ⊙ sigmoid(g)).
- ``KimiDeltaAttention.forward`` → ``chunk_kda(..., use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
  use_beta_sigmoid_in_kernel=True)``: l2-normalised q, k (eps 1e-6), β = sigmoid(b), scale K^−½.
- ``fla/ops/kda/gate.py`` ``naive_kda_gate``: ``g = −exp(A_log)[h] · softplus(g + dt_bias.view(H, K))``.
- ``fla/ops/kda/naive.py`` ``naive_recurrent_kda``: per token ``S ← S ⊙ exp(g)`` (over K),
  ``S += (β k)(v − Sᵀk)ᵀ``, ``o = Sᵀ(K^−½ q)`` (the reference transcribed in the tests).
- Weights: ``fla/models/kda/modeling_kda.py`` ``_init_weights``: every ``nn.Linear`` and ``nn.Conv1d`` N(0, 0.02²)
  (``initializer_range``), biases zero; A_log and dt_bias as above.

Everything KDA's recurrence, gate and output path need is in the stored fla code; the equations above agree
with the Kimi Linear paper's (its fine-grained gate α_t = f(W↑W↓x_t), the sigmoid output gate after RMSNorm).

Heads for any d_model: fla's defaults keep H·K = D (16 × 128 at 2048) with K = 128; here the key dim is D,
H = ⌈D / 128⌉ and K = D // H: 16 → 1 × 16, 64 → 1 × 64, 128 → 1 × 128, 256 → 2 × 128, 512 → 4 × 128. Setting
``num_heads`` (or ``head_dim``) derives the other from D; setting both uses them as given.

Padding: as ``deltanet`` (each row's real tokens packed first, as fla's ``unpad_hidden_states``): the short
convolutions see the previous W − 1 real tokens, padded positions neither decay nor write the state, the
outputs at real positions equal those of the row with its padding removed; padded positions output 0.

Parameters ``ssm_A_log`` and ``ssm_dt_bias`` carry the harness's ``ssm_`` prefix: fla excludes them from
weight decay, which here is ``optimizer.ssm_learning_rate`` = the learning rate with ``ssm_weight_decay`` 0.

Differences from the original:

- Bidirectional (``causal=False``, the LRA default): the engine adds a backward pass over the reversed sequence
  that reads before writing (``linear_recurrence(..., causal=False)``); fla's layer is causal only. The short
  convolutions stay causal.
- Head count / head dim derived from d_model as above (fla's fixed 16 × 128 needs D = 2048).
- Not implemented: grouped value heads (``num_v_heads``, GVA), and the ``safe_gate`` / ``lower_bound`` options
  (a clamped gate ``lower_bound · sigmoid(exp(A_log)(g + dt_bias))`` for fla's faster kernels; off by default).
- Without the ``ssm_`` optimizer settings above, A_log and dt_bias get the ordinary weight decay.
- Dropout: fla's layer has none; ``config.dropout_rate`` is applied to the layer's output only.
- norm_eps is the layer's default 1e-5; fla's ``KDAConfig`` passes 1e-6 to its layers.
- Computation in float32 (float64 for float64 input), output cast to the input's dtype; parameters float32.
- No inference cache and no ``fused_recurrent`` switch for short inputs: the mode is ``config.mode``.
- Parameter layout is flax's: Dense kernels [in, out], short-convolution kernels [W, C]; the two-layer
  ``f_proj`` / ``g_proj`` are ``f_proj_0``/``f_proj_1`` and ``g_proj_0``/``g_proj_1``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers._layer_common import (QKVConvStateSize, delta_rule_layer, dt_bias_init, key_heads,
                                                log_uniform_init, value_head_dim)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class KDAConfig(QKVConvStateSize, MixerConfig):
  """KDA options (defaults: fla ``fla/layers/kda.py`` ``KimiDeltaAttention``; module docstring).

  Attributes:
    num_heads, head_dim: heads and key dim per head; None derives them from d_model (module docstring).
    expand_v: value dim per head as a multiple of the key dim (also the rank of the low-rank gates).
    use_short_conv, conv_size, conv_bias: the causal depthwise convolutions on q, k, v.
    allow_neg_eigval: β ∈ (0, 2) instead of (0, 1).
    norm_eps: the output RMSNorm's epsilon.
    initializer_range: std of the projections' and convolutions' N(0, std²) initialisation.
    mode: "chunk" (the engine's chunked form) or "recurrent" (token-by-token scan).
    chunk_size: the chunk length of mode "chunk".
  """

  num_heads: int | None = None
  head_dim: int | None = None
  expand_v: float = 1.0
  use_short_conv: bool = True
  conv_size: int = 4
  conv_bias: bool = False
  allow_neg_eigval: bool = False
  norm_eps: float = 1e-5
  initializer_range: float = 0.02
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "KDA"
  family: ClassVar[str] = "linear-recurrent"

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(H, K, V) at width ``d_model``: key dim D, K ≤ 128 (module docstring), V = expand_v·K."""
    heads, dk = key_heads(max(1, d_model), 128, self.num_heads, self.head_dim)
    return heads, dk, value_head_dim(dk, self.expand_v, "kda")


@register_mixer("kda", KDAConfig)
class KDA(nn.Module):
  """The Kimi Delta Attention layer (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: KDAConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    def decay(h, linear, heads, dk, dv):  # fla's naive_kda_gate on the low-rank f_proj (rank V) [B, L, H, K]
      f = linear(heads * dk, "f_proj_1")(linear(dv, "f_proj_0")(h))
      a_log = self.param("ssm_A_log", log_uniform_init(1.0, 16.0), (heads,)).astype(h.dtype)
      dt_bias = self.param("ssm_dt_bias", dt_bias_init(), (heads * dk,)).astype(h.dtype)
      return -jnp.exp(a_log)[:, None] * jax.nn.softplus((f + dt_bias).reshape(*h.shape[:2], heads, dk))

    def gate(h, linear, heads, dk, dv):  # sigmoid of the low-rank g_proj (rank V) [B, L, H, V]
      del dk
      g = linear(heads * dv, "g_proj_1", use_bias=True)(linear(dv, "g_proj_0")(h))
      return jax.nn.sigmoid(g.reshape(*h.shape[:2], heads, dv))

    return delta_rule_layer(self, x, mask, deterministic, decay, gate)
