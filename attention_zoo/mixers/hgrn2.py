"""HGRN2 (Qin, Yang, Sun, Shen, Li, Sun, Zhong, "HGRN2: Gated Linear RNNs with State Expansion", COLM 2024): a
gated linear RNN whose forget gate f_t (bounded below) decays an outer-product state, with input key 1 − f_t
(the "state expansion" of HGRN's h_t = f_t ⊙ h_{t-1} + (1 − f_t) ⊙ i_t), run on GLA's kernel.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` forget/query dim per head (the
expand ratio E), ``V`` input (value) dim per head (D/H).

Equations (one layer, input ``x [B, L, D]``; per head the state ``S_t [K, V]``; lower bound ``β`` in [0, 1))::

    q_t = swish(W_q x_t)·K^(-1/2)                           [B, L, H, K]   (the output gate of the original)
    f_t = β + (1 − β)·σ(W_f x_t)                             [B, L, H, K]   (forget gate, log f_t is the decay)
    k_t = 1 − f_t = (1 − β)·σ(−W_f x_t)                      [B, L, H, K]
    v_t = W_i x_t                                            [B, L, H, V]
    S_t = Diag(f_t) S_{t-1} + k_t v_t^T                      (fla's [K, V] state)
    o_t = S_t^T q_t                                          [B, L, H, V]
    y_t = W_o RMSNorm_D(concat_h o_t) ⊙ w_norm               [B, L, D]

The recurrence is the shared engine's (``attention_zoo.mixers._linear_recurrence.linear_recurrence``, decay kind
"per-key vector", log f_t = logaddexp(log β, log(1 − β) + logsigmoid(W_f x_t))): ``mode="chunk"`` its
chunked-parallel form, ``mode="recurrent"`` its token-by-token scan. Computed in float32 (float64 for float64
inputs); the output is cast back to the input's dtype.

Defaults and initialisation, from fla-org/flash-linear-attention (read at bc3b101):

- ``fla/layers/hgrn2.py`` ``HGRN2Attention``: expand_ratio 128 (num_heads = D / expand_ratio), use_short_conv
  False, q = swish(q_proj x), g = logsigmoid(f_proj x), k = 1 − exp(g), projections without bias, the output
  ``rms_norm_linear(o, g_norm.weight, …, o_proj.weight, …)``: an RMSNorm over all of D (weight [D], eps 1e-5, the
  fused function's default) then o_proj; ``chunk_gla`` / ``fused_recurrent_gla`` called without a scale, so
  K^(-1/2) (``fla/ops/gla/chunk.py``).
- The lower bound: fla applies ``g = logaddexp(log β, log1p(−β) + g)`` only when the model passes a bound and
  ``layer_idx > 0`` ("the lower bound for the first layer is zero"); ``HGRN2Model`` builds the bounds as a
  learned cumulative softmax over layers, ``(softmax(lower_bounds, 0).cumsum(0) − softmax[0])[layer_idx]``
  (``fla/models/hgrn2/modeling_hgrn2.py``), so a single layer, or a layer whose index is None, has β = 0. This
  mixer knows no layer index: ``lower_bound`` is a constant β (default 0, the first layer's / a lone layer's
  value).
- ``fla/ops/gla/naive.py`` ``naive_recurrent_gla``: the token-by-token reference the tests transcribe (HGRN2 runs
  on GLA's kernels).
- ``fla/models/hgrn2/modeling_hgrn2.py`` ``_init_weights``: every Linear weight ~ N(0, 0.02²); the norm's
  weight 1.

Head count: fla sets H = D // expand_ratio, which is 0 below D = 128. Here E = the largest divisor of D that is
<= expand_ratio and H = D / E: one head with E = D up to D = 128 (16 -> E 16, 64 -> E 64, 128 -> E 128), then
D/128 heads of 128 (256 -> 2, 512 -> 4), fla's own count wherever fla's is defined and divides.

Bidirectional (``causal=False``, the LRA default): the engine's two passes over the same q, k, v, f: a forward
pass reading S_t and a backward pass over the reversed sequence reading before its write, so token t is counted
once (LION's "forward + backward − diagonal", Afzal et al. 2025).

Differences from the original:

- The bidirectional form (above) is not in fla or the paper; ``causal=True`` is fla's layer.
- Padding: a padded position (mask False) neither decays nor writes the state in either direction and its output
  is 0, so real outputs do not depend on the number, place (padding inside a row included) or content of padded
  positions; fla unpads through ``cu_seqlens`` (same outputs at real positions).
- Head count derived for small widths (above).
- The lower bound is a constant config value, not the model's learned per-layer bound (above).
- fla's layer is followed here, not the paper's first code (OpenNLPLab/HGRN2's ``Hgru2_1d``: silu on the input,
  sigmoid on the output gate, a LayerNorm, biased projections, no K^(-1/2) scale).
- Dropout: fla's layer has none; ``config.dropout_rate`` is applied to the layer's output only.
- ``use_short_conv`` (off, as fla's default): fla's width-4 causal depthwise convolutions, without activation
  or bias, on the q, f and i projections; the rows are packed (real tokens first, in order, as fla's unpadding)
  so each window holds the previous real tokens, and the convolutions stay causal when ``causal=False``.
  Parameters ``q_conv1d``/``f_conv1d``/``i_conv1d`` N(0, 0.02²) (fla's ``_init_weights`` covers ``nn.Conv1d``,
  ``fla/models/hgrn2/modeling_hgrn2.py``).
- Left out: the model-level ``prenorm_residual_strategy`` rescaling of ``o_proj``.
- Parameters are created in the compute dtype (float32; float64 for float64 inputs). Initialisation uses fla's
  model-level ``_init_weights`` (N(0, 0.02²)); a bare fla layer would keep PyTorch's default Linear init.

State for causal generation (``state_size``): H·K·V = D·E floats per example and layer; with ``use_short_conv``
also the convolutions' last W − 1 inputs, (W − 1)·(2·H·K + D).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.mixers._layer_common import (QKVConvStateSize, check_mode, fla_short_convs, finish, fla_heads,
                                                fla_linear, gather, largest_divisor, layer_input, pack, recurrence,
                                                rms_normalize)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class HGRN2Config(QKVConvStateSize, MixerConfig):
  """HGRN2 options (defaults: fla ``fla/layers/hgrn2.py`` ``HGRN2Attention``).

  Attributes:
    expand_ratio: E, the most forget/query channels per head; the layer uses the largest divisor of d_model
      that is ≤ this, and H = d_model / E heads.
    lower_bound: β, the forget gate's constant lower bound in [0, 1) (0: fla's first / lone layer).
    norm_eps: the output RMSNorm's epsilon.
    use_short_conv, conv_size, conv_bias: fla's optional causal depthwise convolutions (no activation) on the q,
      f and i projections (off by default, as fla's).
    mode: "chunk" (chunked-parallel, training default) or "recurrent" (token-by-token scan, the reference).
    chunk_size: the chunk length of mode "chunk".
  """

  expand_ratio: int = 128
  lower_bound: float = 0.0
  norm_eps: float = 1e-5
  use_short_conv: bool = False
  conv_size: int = 4
  conv_bias: bool = False
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "HGRN2"
  family: ClassVar[str] = "linear-recurrent"

  def __post_init__(self):
    check_mode("HGRN2", self.mode)
    if self.expand_ratio < 1 or self.chunk_size < 1 or self.conv_size < 1:
      raise ValueError("HGRN2: expand_ratio, chunk_size and conv_size must be positive")
    if not 0.0 <= self.lower_bound < 1.0:
      raise ValueError(f"HGRN2: lower_bound must lie in [0, 1), got {self.lower_bound}")

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(H, K, V): heads, forget dim and input dim per head at width ``d_model`` (K = V = E)."""
    expand = largest_divisor(d_model, self.expand_ratio)
    heads = d_model // expand
    return heads, expand, d_model // heads


@register_mixer("hgrn2", HGRN2Config)
class HGRN2(nn.Module):
  """HGRN2 (module docstring): x [B, L, D], mask [B, L] -> [B, L, D] in x's dtype."""

  config: HGRN2Config

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

    q, f, v = fla_heads(u, dtype, heads, q_proj=k_dim, f_proj=k_dim, i_proj=v_dim)   # [B, L, H, K|K|V]
    if cfg.use_short_conv:  # fla's ShortConvolution with activation=None on each projection
      q, f, v = fla_short_convs(cfg, silu=False, q=q, f=f, i=v)
    q = jax.nn.silu(q)
    beta = cfg.lower_bound
    log_decay = jax.nn.log_sigmoid(f)
    k = jax.nn.sigmoid(-f)                                                              # 1 − σ(f)
    if beta > 0:
      log_decay = jnp.logaddexp(np.log(beta), np.log1p(-beta) + log_decay)
      k = (1.0 - beta) * k

    o = recurrence(cfg, q * k_dim ** -0.5, k, v, real, log_decay=log_decay)                   # [B, L, H, V]
    norm_weight = self.param("g_norm_weight", nn.initializers.ones, (d_model,), dtype)
    o = rms_normalize(o.astype(dtype).reshape(batch, length, heads * v_dim), cfg.norm_eps) * norm_weight
    y = fla_linear(d_model, "o_proj", dtype)(o)
    if cfg.use_short_conv:
      y = gather(y, dest)
    return finish(y, mask, x.dtype, cfg.dropout_rate, deterministic)
