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
import jax
import jax.numpy as jnp

from attention_zoo.mixers._linear_recurrence import linear_recurrence
from attention_zoo.registry import MixerConfig, register_mixer

L2_EPS = 1e-6  # fla/modules/l2norm.py l2norm_fwd


def compute_dtype(x) -> jnp.dtype:
  """float64 for float64 input, else float32 (bfloat16 and float32 inputs)."""
  return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def real_first_order(mask):
  """[B, L] indices that put each row's real positions first (in order), then its padded ones (in order)."""
  length = mask.shape[1]
  position = jnp.arange(length)
  return jnp.argsort(jnp.where(mask, position, position + length), axis=1)


def take_rows(x, order):
  """x [B, L, ...] reordered along L by ``order`` [B, L]."""
  return jnp.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), axis=1)


def causal_conv(x, kernel):
  """Depthwise causal convolution ``y_t = Σ_{i<W} kernel_i ⊙ x_{t−W+1+i}`` (zeros before the row starts):
  x [B, L, C], kernel [W, C] -> [B, L, C] (PyTorch's Conv1d with padding W − 1, the first L outputs)."""
  width, length = kernel.shape[0], x.shape[1]
  padded = jnp.pad(x, ((0, 0), (width - 1, 0), (0, 0)))
  return sum(padded[:, i:i + length] * kernel[i] for i in range(width))


def l2_normalize(x, eps=L2_EPS):
  """``x / sqrt(Σ x² + eps)`` over the last axis (fla ``l2norm``)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def rms_normalize(x, eps):
  """``x · rsqrt(mean x² + eps)`` over the last axis (fla ``RMSNorm`` before its weight)."""
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def inverse_softplus(y):
  """softplus⁻¹(y) = y + log(−expm1(−y)) (fla's ``inv_dt``)."""
  return y + jnp.log(-jnp.expm1(-y))


def dt_bias_init(key, shape, dtype=jnp.float32, dt_min=1e-3, dt_max=0.1, floor=1e-4):
  """Mamba-2's Δ bias: dt = exp(U[log dt_min, log dt_max]) clamped at ``floor``, stored as softplus⁻¹(dt)."""
  u = jax.random.uniform(key, shape, dtype)
  dt = jnp.maximum(jnp.exp(u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)), floor)
  return inverse_softplus(dt)


def log_uniform_init(low, high):
  """Initialiser log(U[low, high)) (fla's ``A_log``)."""
  def init(key, shape, dtype=jnp.float32):
    return jnp.log(jax.random.uniform(key, shape, dtype, low, high))
  return init


class ShortConvolution(nn.Module):
  """fla's ``ShortConvolution``: a depthwise causal convolution over the length axis, then SiLU if
  ``silu``. Parameters ``kernel`` [W, C] (and ``bias`` [C]), N(0, init_std²) / zeros."""

  width: int
  use_bias: bool = False
  silu: bool = True
  init_std: float = 0.02

  @nn.compact
  def __call__(self, x):
    channels = x.shape[-1]
    kernel = self.param("kernel", nn.initializers.normal(self.init_std), (self.width, channels))
    y = causal_conv(x, kernel.astype(x.dtype))
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (channels,)).astype(x.dtype)
    return jax.nn.silu(y) if self.silu else y


def projection(features, std, dtype, name, use_bias=False):
  """A Dense layer as fla's ``nn.Linear`` under the models' init: kernel N(0, std²), zero bias."""
  return nn.Dense(features, use_bias=use_bias, kernel_init=nn.initializers.normal(std), dtype=dtype,
                  param_dtype=jnp.float32, name=name)


def project_qkv(x, cfg, key_dim, value_dim, dtype, qk_silu=True):
  """q [B, L, H·K], k [B, L, H·K], v [B, L, H·V]: the q/k/v projections and their short convolutions
  (``q_proj``/``q_conv1d`` ...), as fla's layers; without ``use_short_conv`` SiLU on the projections."""
  std = cfg.initializer_range
  out = []
  for name, features, silu in (("q", key_dim, qk_silu), ("k", key_dim, qk_silu), ("v", value_dim, True)):
    u = projection(features, std, dtype, f"{name}_proj")(x)
    if cfg.use_short_conv:
      u = ShortConvolution(cfg.conv_size, cfg.conv_bias, silu, std, name=f"{name}_conv1d")(u)
    elif silu:
      u = jax.nn.silu(u)
    out.append(u)
  return out


def packed_rows(x, mask):
  """(x, mask, inverse): each row with its real positions first (``real_first_order``); ``take_rows(y,
  inverse)`` restores the original order of an output computed on the packed rows."""
  order = real_first_order(mask)
  inverse = jnp.argsort(order, axis=1)
  packed_mask = jnp.take_along_axis(mask, order, axis=1)
  return jnp.where(packed_mask[..., None], take_rows(x, order), 0), packed_mask, inverse


def finish(y, mask, inverse, x_dtype, dropout_rate, deterministic):
  """The packed output back in row order, dropout, zeros at padded positions, cast to the input's dtype."""
  y = take_rows(y, inverse)
  y = nn.Dropout(dropout_rate)(y, deterministic=deterministic)
  return jnp.where(mask[..., None], y, 0).astype(x_dtype)


@dataclasses.dataclass(frozen=True)
class DeltaNetConfig(MixerConfig):
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

  def state_size(self, length: int, d_model: int) -> int:
    """H·K·V + (W − 1)·H·(2K + V): the delta-rule states [K, V] of the H heads plus, with use_short_conv, the
    last W − 1 inputs of the q, k and v short convolutions (independent of the length).

    (H, K, V) from :meth:`dims`; W = conv_size.
    """
    del length
    heads, k, v = self.dims(d_model)
    conv = (self.conv_size - 1) * heads * (2 * k + v) if self.use_short_conv else 0
    return heads * k * v + conv


@register_mixer("deltanet", DeltaNetConfig)
class DeltaNet(nn.Module):
  """The DeltaNet layer (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: DeltaNetConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    batch, length, d_model = x.shape
    dtype = compute_dtype(x)
    if mask is None:
      mask = jnp.ones((batch, length), bool)
    heads, dk, dv = cfg.dims(d_model)
    h, packed_mask, inverse = packed_rows(x.astype(dtype), mask)

    q, k, v = project_qkv(h, cfg, heads * dk, heads * dv, dtype, qk_silu=cfg.qk_activation == "silu")
    q, k = (u.reshape(batch, length, heads, dk) for u in (q, k))
    v = v.reshape(batch, length, heads, dv)
    if cfg.qk_activation == "relu":
      q, k = jax.nn.relu(q), jax.nn.relu(k)
    elif cfg.qk_activation == "elu":
      q, k = jax.nn.elu(q) + 1, jax.nn.elu(k) + 1
    if cfg.qk_norm == "l2":
      q, k = l2_normalize(q), l2_normalize(k)
    else:
      q, k = q / q.sum(-1, keepdims=True), k / k.sum(-1, keepdims=True)

    if cfg.use_beta:
      beta = jax.nn.sigmoid(projection(heads, cfg.initializer_range, dtype, "b_proj")(h))
    else:
      beta = jnp.ones((batch, length, heads), dtype)
    if cfg.allow_neg_eigval:
      beta = 2 * beta

    o = linear_recurrence(q * dk**-0.5, k, v, beta=beta, mask=packed_mask, causal=cfg.causal, mode=cfg.mode,
                          chunk_size=cfg.chunk_size)  # [B, L, H, V]
    o = rms_normalize(o, cfg.norm_eps) * self.param("o_norm", nn.initializers.ones, (dv,)).astype(dtype)
    if cfg.use_gate:
      g = projection(heads * dv, cfg.initializer_range, dtype, "g_proj")(h).reshape(batch, length, heads, dv)
      o = o * jax.nn.silu(g)
    y = projection(d_model, cfg.initializer_range, dtype, "o_proj")(o.reshape(batch, length, heads * dv))
    return finish(y, mask, inverse, x.dtype, cfg.dropout_rate, deterministic)
