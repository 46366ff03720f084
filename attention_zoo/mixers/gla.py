"""GLA, Gated Linear Attention (Yang, Wang, Shen, Panda, Kim, "Gated Linear Attention Transformers with
Hardware-Efficient Training", ICML 2024): linear attention whose matrix state decays through a data-dependent
per-key-channel gate, with a low-rank gate projection, a per-head RMSNorm and a swish output gate.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key dim per head, ``V`` value dim
per head, ``R`` the gate's low rank (``gate_low_rank_dim``).

Equations (one layer, input ``x [B, L, D]``; per head the state ``S_t [K, V]``)::

    q_t = (W_q x_t)·K^(-1/2),  k_t = W_k x_t                   [B, L, H, K]
    v_t = W_v x_t                                              [B, L, H, V]
    log α_t = logsigmoid(W_gk2 (W_gk1 x_t) + b_gk) / 16        [B, L, H, K]   (W_gk1: D -> R, W_gk2: R -> H·K)
    S_t = Diag(α_t) S_{t-1} + k_t v_t^T                        (fla's [K, V] state)
    o_t = S_t^T q_t                                            [B, L, H, V]
    y_t = W_o (RMSNorm_V(o_t) ⊙ w_norm ⊙ swish(W_g x_t))       [B, L, D]

The recurrence is the shared engine's (``attention_zoo.mixers._linear_recurrence.linear_recurrence``, decay kind
"per-key vector"): ``mode="chunk"`` its chunked-parallel form, ``mode="recurrent"`` its token-by-token scan.
Computed in float32 (float64 for float64 inputs); the output is cast back to the input's dtype.

Defaults and initialisation, from fla-org/flash-linear-attention (read at bc3b101):

- ``fla/layers/gla.py`` ``GatedLinearAttention``: expand_k 0.5, expand_v 1.0, num_heads 4, feature_map None,
  use_short_conv False, use_output_gate True, gate_fn swish, elementwise_affine True, norm_eps 1e-5,
  gate_logit_normalizer 16, gate_low_rank_dim 16, clamp_min None, fuse_norm True (``FusedRMSNormGated`` over the
  head's value dim, one weight [V] shared by the heads); projections without bias except the gate's second
  low-rank map; ``gk = logsigmoid(gk_proj(x)) / gate_logit_normalizer``.
- ``fla/ops/gla/chunk.py`` ``chunk_gla``: the query scale K^(-1/2) when none is given (the layer gives none);
  ``fla/ops/gla/naive.py`` ``naive_recurrent_gla``: the token-by-token reference the tests transcribe.
- ``fla/models/gla/modeling_gla.py`` ``GLAPreTrainedModel._init_weights``: every Linear weight ~ N(0, 0.02²),
  every bias 0; the norm's weight 1 (``RMSNorm.reset_parameters``).

Head count (``num_heads`` is a maximum): key dim ``int(D·expand_k)`` (at least 1) and value dim
``int(D·expand_v)`` must split into equal heads, so H is the largest h <= num_heads dividing both (4 at
d_model 16, 64, 128, 512: K = 2, 8, 16, 64).

Bidirectional (``causal=False``, the LRA default): the engine's two passes over the same q, k, v, α: a forward
pass reading S_t and a backward pass over the reversed sequence reading before its write, so token t is counted
once (LION's "forward + backward − diagonal", Afzal et al. 2025).

Differences from the original:

- The bidirectional form (above) is not in fla (its layers are causal); ``causal=True`` is fla's layer.
- Padding: a padded position (mask False) neither decays nor writes the state in either direction and its output
  is 0, so real outputs do not depend on the number, place (padding inside a row included) or content of padded
  positions; fla unpads through ``cu_seqlens``, which gives the same outputs at real positions.
- ``num_heads`` is a maximum (derived to divide, above); fla asserts divisibility.
- Dropout: fla's layer has none; ``config.dropout_rate`` is applied to the layer's output only.
- ``use_short_conv`` (off, as fla's default): with it the rows are packed (real tokens first, in order, as
  fla's unpadding) so each window holds the previous real tokens; the convolutions stay causal when
  ``causal=False`` (as the DeltaNet family's here). Parameters ``q_conv1d``/``k_conv1d``/``v_conv1d`` N(0, 0.02²)
  (fla's ``_init_weights`` covers ``nn.Conv1d``), kept in float32.
- Left out: fla's options ``num_kv_heads`` (grouped heads), ``feature_map``, a non-swish
  ``gate_fn`` / ``fuse_norm=False`` (same function for swish), and the GPT-2 style ``prenorm_residual_strategy``
  rescaling of ``o_proj`` (a model-level option, off by default in fla's configs).
- Parameters are created in the compute dtype (float32; float64 for float64 inputs).
- Initialisation uses fla's model-level ``_init_weights`` (N(0, 0.02²)); a bare fla layer would keep PyTorch's
  default Linear init.

State for causal generation (``state_size``): H·K·V floats per example and layer; with the defaults
H·(D/2H)·(D/H) = D²/(2H) (H = 4 at widths divisible by 8); with ``use_short_conv`` also the convolutions' last
W − 1 inputs, (W − 1)·H·(2K + V).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers._layer_common import (QKVConvStateSize, check_mode, fla_short_convs, common_heads, finish,
                                                fla_gated_output, fla_heads, fla_linear, gather, layer_input, pack,
                                                recurrence)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class GLAConfig(QKVConvStateSize, MixerConfig):
  """GLA options (defaults: fla ``fla/layers/gla.py`` ``GatedLinearAttention``).

  Attributes:
    expand_k: key dim = int(d_model·expand_k) (all heads).
    expand_v: value dim = int(d_model·expand_v) (all heads).
    num_heads: the most heads; the layer uses the largest count ≤ this dividing both dims.
    gate_logit_normalizer: log α = logsigmoid(gate logits) / this.
    gate_low_rank_dim: R, the rank of the gate projection D -> R -> H·K.
    clamp_min: if set, log α is clamped from below to this (fla's ``clamp_min``).
    use_output_gate: RMSNorm ⊙ swish(W_g x) (True) or RMSNorm only.
    use_short_conv, conv_size, conv_bias: fla's optional causal depthwise convolutions (then SiLU) on q, k, v
      (off by default, as fla's layer).
    norm_eps: the RMSNorm's epsilon.
    mode: "chunk" (chunked-parallel, training default) or "recurrent" (token-by-token scan, the reference).
    chunk_size: the chunk length of mode "chunk".
  """

  expand_k: float = 0.5
  expand_v: float = 1.0
  num_heads: int = 4
  gate_logit_normalizer: float = 16.0
  gate_low_rank_dim: int = 16
  clamp_min: float | None = None
  use_output_gate: bool = True
  use_short_conv: bool = False
  conv_size: int = 4
  conv_bias: bool = False
  norm_eps: float = 1e-5
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "GLA"
  family: ClassVar[str] = "linear-recurrent"

  def __post_init__(self):
    check_mode("GLA", self.mode)
    if self.num_heads < 1 or self.chunk_size < 1 or self.gate_low_rank_dim < 1 or self.conv_size < 1:
      raise ValueError("GLA: num_heads, chunk_size, gate_low_rank_dim and conv_size must be positive")

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(H, K, V): heads and per-head key / value dims at width ``d_model``."""
    key_dim = max(1, int(d_model * self.expand_k))
    value_dim = max(1, int(d_model * self.expand_v))
    heads = common_heads(self.num_heads, key_dim, value_dim)
    return heads, key_dim // heads, value_dim // heads


@register_mixer("gla", GLAConfig)
class GLA(nn.Module):
  """Gated Linear Attention (module docstring): x [B, L, D], mask [B, L] -> [B, L, D] in x's dtype."""

  config: GLAConfig

  @nn.compact
  def __call__(self, x, mask=None, deterministic=True):
    cfg = self.config
    batch, length, d_model = x.shape
    heads, k_dim, v_dim = cfg.dims(d_model)
    dtype, mask, u = layer_input(x, mask)
    if cfg.use_short_conv:  # real tokens first, so each window holds the previous real tokens (as fla's unpadding)
      u, real, dest = pack(u, mask)
    else:
      real = mask

    q, k, v = fla_heads(u, dtype, heads, q_proj=k_dim, k_proj=k_dim, v_proj=v_dim)   # [B, L, H, K|K|V]
    if cfg.use_short_conv:
      q, k, v = fla_short_convs(cfg, q=q, k=k, v=v)
    gk = fla_linear(cfg.gate_low_rank_dim, "gk_proj_0", dtype)(u)
    gk = fla_linear(heads * k_dim, "gk_proj_1", dtype, use_bias=True)(gk).reshape(batch, length, heads, k_dim)
    log_decay = jax.nn.log_sigmoid(gk) / cfg.gate_logit_normalizer
    if cfg.clamp_min is not None:
      log_decay = jnp.maximum(log_decay, cfg.clamp_min)

    o = recurrence(cfg, q * k_dim ** -0.5, k, v, real, log_decay=log_decay)                   # [B, L, H, V]
    y = fla_gated_output(self, o, u, d_model, dtype, cfg.norm_eps, cfg.use_output_gate)
    if cfg.use_short_conv:
      y = gather(y, dest)
    return finish(y, mask, x.dtype, cfg.dropout_rate, deterministic)
