"""DeltaNet: linear attention with the delta rule (Schlag, Irie, Schmidhuber, "Linear Transformers Are Secretly
Fast Weight Programmers", ICML 2021; Yang, Wang, Zhang, Shen, Kim, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", NeurIPS 2024), as fla's layer ``DeltaNet``.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key dim per head, ``V`` value dim per
head, ``W`` short-convolution width (``conv_size``), ``C`` channels of a short convolution.

Equations (one layer, input ``x [B, L, D]``; per head, state ``S [K, V]``, ``S_0 = 0``)::

    q, k   = act(conv_W(x W_q)), act(conv_W(x W_k))       [B, L, H, K]   (act = SiLU inside the short conv)
    v      = silu(conv_W(x W_v))                          [B, L, H, V]
    q, k   = q / sqrt(|q|² + 1e-6),  k / sqrt(|k|² + 1e-6)               (qk_norm "l2", per head)
    β      = sigmoid(x W_b)                               [B, L, H]      (×2 with allow_neg_eigval)
    S_t    = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ                    (the delta rule)
    o_t    = S_tᵀ (K^−½ q_t)                              [B, L, H, V]
    y      = (RMSNorm_V(o) ⊙ w) W_o                       [B, L, D]      (use_gate: ⊙ silu(x W_g) after the norm)

``conv_W`` is a depthwise causal convolution of width W over the length axis (no bias):
``conv_W(u)_t = Σ_{i<W} w_i ⊙ u_{t−W+1+i}``. The recurrence runs in the shared engine
(``attention_zoo.mixers._linear_recurrence.linear_recurrence`` with ``beta``; ``mode`` "chunk" is its WY/UT
chunked form, "recurrent" the token-by-token scan).

Defaults and initialisation, from fla-org/flash-linear-attention (read at bc3b101):

- ``fla/layers/delta_net.py`` ``DeltaNet.__init__``: expand_k 1, expand_v 1, num_heads 4, use_beta True,
  use_gate False, use_short_conv True, conv_size 4, conv_bias False, allow_neg_eigval False, qk_activation
  "silu", qk_norm "l2", norm_eps 1e-5; q/k/v/b/o projections without bias; the q and k short convolutions
  apply SiLU only when qk_activation is "silu", the v convolution always; output norm RMSNorm over V (weight
  init 1) or, with use_gate, ``FusedRMSNormGated`` (RMSNorm then ⊙ silu(g)).
- ``DeltaNet.forward``: β = sigmoid(b_proj(x)) (ones without use_beta), ×2 with allow_neg_eigval; the "sum"
  qk_norm divides by the sum over K; "relu"/"elu" (elu + 1)/"identity" activations after the convolutions.
- ``fla/ops/delta_rule/naive.py`` ``delta_rule_recurrence``: q scaled by K^−½, then per token
  ``v' = β (v − Sᵀk)``, ``S += k v'ᵀ``, ``o = Sᵀq`` (the reference transcribed in the tests).
- ``fla/modules/l2norm.py``: ``x / sqrt(Σx² + eps)``, eps 1e-6 (``use_qk_l2norm_in_kernel``).
- ``fla/modules/layernorm.py`` ``RMSNorm``: ``x · rsqrt(mean x² + eps) · weight``, weight init 1, no bias.
- Weights: ``fla/models/delta_net/modeling_delta_net.py`` ``DeltaNetPreTrainedModel._init_weights`` draws every
  ``nn.Linear`` and ``nn.Conv1d`` (the short convolutions) from N(0, initializer_range²), initializer_range 0.02
  (``configuration_delta_net.py``), biases zero. (The bare layer would keep PyTorch's kaiming-uniform defaults;
  fla's models, which produced the published numbers, re-initialise them as above.)

Head count for any d_model: key dim ``int(expand_k·D)``, value dim ``int(expand_v·D)``; the heads are
``gcd(num_heads, key dim, value dim)`` so both divide (4 heads at every width the harness uses: 16 → K = 4,
64 → 16, 128 → 32, 512 → 128). fla asserts divisibility instead.

Padding (``mask``): each row is run with its real tokens first, in order, and its padded positions after them
(a stable permutation; the outputs are permuted back), as fla's ``unpad_hidden_states`` packs the real tokens
for its variable-length kernels. So the short convolution's window at a real token holds the previous W − 1
*real* tokens even when padding sits in the middle of the row, and the engine's mask makes the padded
positions leave the state unchanged (no write). Removing the padded positions from a row gives the same
outputs at its real positions; padded positions output 0.

Differences from the original:

- Bidirectional (``causal=False``, the LRA default): the engine adds a backward pass over the reversed sequence
  that reads before writing (``linear_recurrence(..., causal=False)``); fla's layer is causal only. The short
  convolutions stay causal in both settings (as fla's), so the bidirectional layer sees one side's local
  context through them.
- Dropout: fla's layer has none; ``config.dropout_rate`` is applied to the layer's output only.
- Computation in float32 (float64 for float64 input), output cast to the input's dtype; parameters float32.
  fla's kernels take bf16/fp32 inputs and accumulate in float32.
- Head count derived as above when ``num_heads`` does not divide the key and value dims. (fla's layer default
  is 4 heads, kept here; its ``DeltaNetConfig`` model default is 16, with norm_eps 1e-6 passed to the layer:
  the layer's own 1e-5 is kept.)
- No inference cache (``past_key_values``) and no ``fused_recurrent`` switch below 64 tokens: the mode is
  ``config.mode``.
- Parameter layout is flax's: Dense kernels [in, out], short-convolution kernels [W, C] (fla: Conv1d
  weights [C, 1, W]).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn

from attention_zoo.mixers._layer_common import QKVConvStateSize, delta_rule_layer, silu_gate
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class DeltaNetConfig(QKVConvStateSize, MixerConfig):
  """DeltaNet options (defaults: fla ``fla/layers/delta_net.py`` ``DeltaNet``; module docstring).

  Attributes:
    num_heads: heads (reduced to gcd(num_heads, key dim, value dim) where it does not divide them).
    expand_k, expand_v: key / value dims as multiples of d_model.
    use_beta: β = sigmoid(x W_b); False: β = 1.
    use_gate: output gate RMSNorm(o) ⊙ silu(x W_g) instead of RMSNorm(o).
    use_short_conv, conv_size, conv_bias: the causal depthwise convolutions on q, k, v.
    allow_neg_eigval: β ∈ (0, 2) (Grazzi et al. 2025) instead of (0, 1).
    qk_activation: "silu" (inside the short conv), "relu", "elu" (elu + 1) or "identity".
    qk_norm: "l2" or "sum" normalisation of q and k over K.
    norm_eps: the output RMSNorm's epsilon.
    initializer_range: std of the projections' and convolutions' N(0, std²) initialisation.
    mode: "chunk" (the engine's chunked WY form) or "recurrent" (token-by-token scan).
    chunk_size: the chunk length of mode "chunk".
  """

  num_heads: int = 4
  expand_k: float = 1.0
  expand_v: float = 1.0
  use_beta: bool = True
  use_gate: bool = False
  use_short_conv: bool = True
  conv_size: int = 4
  conv_bias: bool = False
  allow_neg_eigval: bool = False
  qk_activation: str = "silu"
  qk_norm: str = "l2"
  norm_eps: float = 1e-5
  initializer_range: float = 0.02
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "DeltaNet"
  family: ClassVar[str] = "linear-recurrent"

  def __post_init__(self):
    if self.qk_activation not in ("silu", "relu", "elu", "identity"):
      raise ValueError(f"deltanet: qk_activation must be silu, relu, elu or identity, got {self.qk_activation!r}")
    if self.qk_norm not in ("l2", "sum"):
      raise ValueError(f"deltanet: qk_norm must be l2 or sum, got {self.qk_norm!r}")

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(H, K, V): heads and per-head key / value dims at width ``d_model`` (module docstring)."""
    key_dim = max(1, int(d_model * self.expand_k))
    value_dim = max(1, int(d_model * self.expand_v))
    heads = math.gcd(self.num_heads, math.gcd(key_dim, value_dim))
    return heads, key_dim // heads, value_dim // heads


@register_mixer("deltanet", DeltaNetConfig)
class DeltaNet(nn.Module):
  """The DeltaNet layer (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: DeltaNetConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    return delta_rule_layer(self, x, mask, deterministic, gate=silu_gate if cfg.use_gate else None,
                            qk_activation=cfg.qk_activation, qk_norm=cfg.qk_norm, use_beta=cfg.use_beta)
