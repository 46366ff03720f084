"""RG-LRU, the Real-Gated Linear Recurrent Unit of Hawk and Griffin (De et al., "Griffin: Mixing Gated
Linear Recurrences with Local Attention for Efficient Language Models", 2024), inside Griffin's recurrent
block, as ``google-deepmind/recurrentgemma`` ``recurrentgemma/jax/modules.py`` ``RecurrentBlock`` and
``recurrentgemma/jax/layers.py`` ``RGLRU``, ``Conv1D``, ``BlockDiagonalLinear``.

Axis legend: ``B`` batch, ``L`` length, ``D`` features (d_model), ``W`` recurrence width (``lru_width``),
``H`` gate blocks (``num_heads``), ``I = W/H`` block width, ``K`` temporal width of the convolution
(``conv_width``).

Equations (input ``x [B, L, D]``; ``c = 8``; the block, then the RG-LRU)::

    y      = GeLU(linear_y(x))                                        [B, L, W]  (tanh GeLU)
    u_t    = b_conv + Σ_k w_conv[k] ⊙ v_{t−(K−1)+k},  v = linear_x(x)  [B, L, W]  (no activation)
    r_t    = σ(a_gate(u_t)),  i_t = σ(input_gate(u_t))                 block-diagonal: [H, I, I] weights
    log a_t = −c · r_t ⊙ softplus(Λ)                                   Λ = ``a_param`` [W]
    m_t    = √(1 − a_t²),  except at the segment start: m = 1, a = 0   (``reset``)
    h_t    = a_t ⊙ h_{t−1} + m_t ⊙ (i_t ⊙ u_t)                         [B, L, W], h_{−1} = 0
    out    = drop(linear_out(h ⊙ y))                                   [B, L, D]

The gradient of √· is bounded as in the original (``sqrt_bound_derivative(1 − a², 1000)``: the
derivative is taken at max(1 − a², 1/(4·1000²))). The segment start is the row's first real token.

Two evaluations of the recurrence, the same numbers (float64 ≤ 1e-12), both through
``attention_zoo/mixers/_scan.py`` ``diagonal_recurrence``:

- ``mode="chunk"`` (the training default): ``jax.lax.associative_scan`` over the whole length with
  (a_i, b_i) ∘ (a_j, b_j) = (a_j a_i, a_j b_i + b_j), the original's ``ScanType.ASSOCIATIVE_NATIVE``
  (``recurrentgemma/jax/scan.py`` ``lru_associative_scan``). The state is [B, L, W], the size of the
  activations, so there is nothing to chunk (no ``chunk_size``).
- ``mode="recurrent"``: ``jax.lax.scan`` token by token, the original's ``lru_linear_scan``
  (``ScanType.LINEAR_NATIVE``, its default off TPU).

Bidirectional (``bidirectional=True``, the default, ignored under ``causal``): Griffin is causal and no
bidirectional Griffin was found to follow, so this takes the pattern of the bidirectional Mambas (Vision
Mamba "v2", ``hustvl/Vim`` ``mamba-1p1p1/mamba_ssm/modules/mamba_simple.py``; Caduceus ``BiMambaWrapper``,
``add`` with tied in/out projections; see ``attention_zoo/mixers/mamba.py``): the input and output maps
(``linear_x``, ``linear_y``, ``linear_out``) are shared; the reverse direction has its own convolution
and RG-LRU (``conv_w_b``, ``conv_bias_b``, ``ssm_a_param_b`` and both gates' ``_b`` copies), reads the
sequence backwards (its convolution looks ahead, its scan runs from the last real token, which is its
segment start), and the two directions' states are summed before the GeLU branch multiplies them:
``out = linear_out((h^f + h^b) ⊙ y)``.

Defaults and initialisation (google-deepmind/recurrentgemma read at 2efa84d: ``recurrentgemma/jax/modules.py``
``RecurrentBlock``, ``recurrentgemma/jax/layers.py``):

- ``lru_width`` = d_model (``RecurrentBlock``: ``lru_width or width``), ``conv_width`` 4
  (``conv1d_temporal_width``), ``min_rad`` 0.9 (``RGLRU.min_rad``), ``max_rad`` 0.999
  (``a_real_param_init``), c = 8, ``final_w_init_variance_scale`` 1.0 (``RecurrentBlock``; the LM in
  ``griffin.py`` passes 2/num_layers), real-valued (``lru_only_real=True``).
- ``num_heads`` (the gate blocks): None derives it as the largest divisor of W that is at most
  max(1, W // 256), the 256-wide blocks of both RecurrentGemma presets (``recurrentgemma/common.py``:
  2B width 2560 with 10 heads, 9B 4096 with 16), so any width works: one block (dense gates) up to
  W = 511, two at 512.
- ``linear_x``, ``linear_y``: weights N(0, 1/D) (``variance_scaling(1, fan_in, normal)``), biases 0;
  ``linear_out``: N(0, final_w_init_variance_scale/W), bias 0.
- ``conv_1d``: weight [K, W] ~ N(0, 0.01/K) (``Conv1D.w_init_variance_scale`` 0.01, flax's fan-in of a
  [K, W] kernel is K), bias 0.
- gates: ``BlockDiagonalLinear`` weight [H, I, I] ~ N(0, 1/W) (flax's fan-in of [H, I, I] is H·I = W:
  the block count is counted as receptive field), bias [H, I] = 0.
- ``a_param``: ρ² ~ U[min_rad², max_rad²] (+ 1e-8), Λ = softplus⁻¹(−log ρ) = log(1/ρ − 1), so that
  softplus(Λ) = −log ρ and a_t = ρ^{c·r_t}: a^c ∈ [0.9, 0.999] where the gate r_t = 1
  (``rnn_real_param_init``, ``RGLRU.a_real_param_init``).
- ``a_param`` is named ``ssm_a_param`` (``ssm_a_param_b``): the harness's SSM group
  (``lra_bench.training.optim``; used only when a recipe sets ``ssm_learning_rate``).

Padding (mask False): the row is packed (``attention_zoo/mixers/_layer_common.py`` ``pack``: real tokens to
the front, in order) and unpacked at the end, and the convolution input is zeroed at the padded slots, so
the convolution of a real token reads the K−1 previous (reverse: next) real tokens and zeros past the
row's ends — the window of the row with its padding removed; at padded slots a = 1 and the input is 0, so
the state passes unchanged (no decay, no write) in both directions; the segment start (reset) is the first
real token forward and the last real token backward; outputs at padded positions are zero.

Differences from the original:

- Padding is handled (above); the original marks document starts with ``segment_pos`` and has no
  padding mask. Here each row is one segment (its first real token resets).
- Bidirectional option (above); the original is causal only.
- Dropout: the block has none; ``config.dropout_rate`` is applied to its output only.
- ``num_heads`` is derived from the width when not given (above); the original requires it.
- The default evaluation is the associative scan (``mode="chunk"``, the harness's training default); the
  original's ``ScanType.AUTO`` takes its linear scan off TPU and its Pallas kernel on TPU (same function).
- Only the real-valued RG-LRU (the original's default); its complex option (``lru_only_real=False``,
  ``a_imag_param``) is not implemented, nor its Pallas / sharded scans, nor the decoding cache.
- Flat parameter names instead of the nested modules: ``linear_x/kernel`` → ``linear_x_kernel`` [D, W]
  (likewise ``linear_y``, ``linear_out`` [W, D], their ``_bias``), ``conv_1d/w`` → ``conv_w`` [K, W],
  ``conv_1d/b`` → ``conv_bias``, ``rg_lru/input_gate/w`` → ``input_gate_w`` [H, I, I], ``…/b`` →
  ``input_gate_bias`` [H, I] (likewise ``a_gate``), ``rg_lru/a_param`` → ``ssm_a_param`` [W]; the reverse
  direction's copies end in ``_b``.
- The computation runs in float32 (float64 for float64 input; parameters are created in that dtype),
  the output is cast to the input's dtype (the original computes in ``dtype``, its scan accumulates in
  float32).

State for causal generation (``state_size``): h [W] plus the K−1 previous convolution inputs [W]: W·K
per layer (the original's ``RecurrentBlockCache``: ``rg_lru_state`` [W], ``conv1d_state`` [K−1, W]).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers import _scan
from attention_zoo.mixers._layer_common import (check_mode, compute_dtype, default_mask, finish, largest_divisor, pack,
                                                short_conv, unpack)
from attention_zoo.registry import MixerConfig, register_mixer

GATE_SCALE = 8.0  # c in log a_t = −c·r_t·softplus(Λ) (``RGLRU.__call__``)
MAX_SQRT_GRADIENT = 1000.0  # ``sqrt_bound_derivative(1 - a_squared, 1000)``
HEAD_WIDTH = 256  # the RecurrentGemma presets' gate block width (width / num_heads)


@dataclasses.dataclass(frozen=True)
class RGLRUConfig(MixerConfig):
  """Griffin recurrent block options (defaults: recurrentgemma ``RecurrentBlock`` / ``RGLRU``).

  Attributes:
    lru_width: W, the recurrence width; None = d_model.
    num_heads: H, the blocks of the block-diagonal gates; None = the largest divisor of W that is at
      most max(1, W // 256).
    conv_width: K, the temporal width of the convolution.
    min_rad, max_rad: the ring a^c = r ∈ [min_rad, max_rad] of the initial decays (r² uniform).
    final_w_init_variance_scale: the variance scale of ``linear_out``'s weights.
    bidirectional: add the reverse direction (ignored when ``causal``).
    mode: "chunk" (associative scan, training default) or "recurrent" (token by token).
  """

  lru_width: int | None = None
  num_heads: int | None = None
  conv_width: int = 4
  min_rad: float = 0.9
  max_rad: float = 0.999
  final_w_init_variance_scale: float = 1.0
  bidirectional: bool = True
  mode: str = "chunk"

  paper_name: ClassVar[str | None] = "Hawk"
  family: ClassVar[str] = "ssm"

  def width(self, d_model: int) -> int:
    """W = lru_width, or d_model when None."""
    return self.lru_width or d_model

  def heads(self, d_model: int) -> int:
    """H = num_heads, or the largest divisor of W that is at most max(1, W // 256)."""
    width = self.width(d_model)
    if self.num_heads is not None:
      if width % self.num_heads:
        raise ValueError(f"num_heads={self.num_heads} does not divide lru_width={width}")
      return self.num_heads
    return largest_divisor(width, width // HEAD_WIDTH)

  def state_size(self, length: int, d_model: int) -> int:
    """lru_width·conv_width: the RG-LRU state h [W] and the conv_width − 1 previous convolution inputs
    [W] (the forward direction: the causal form).

    Independent of the length (recurrentgemma's ``RecurrentBlockCache``)."""
    del length
    return self.width(d_model) * self.conv_width


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def sqrt_bounded_gradient(x, max_gradient):
  """√x whose derivative is taken at max(x, 1/(4·max_gradient²)), i.e. bounded by max_gradient."""
  del max_gradient
  return jnp.sqrt(x)


def _sqrt_fwd(x, max_gradient):
  del max_gradient
  return jnp.sqrt(x), x


def _sqrt_bwd(max_gradient, x, g):
  return (g * 0.5 / jnp.sqrt(jnp.maximum(x, 0.25 / max_gradient**2)),)


sqrt_bounded_gradient.defvjp(_sqrt_fwd, _sqrt_bwd)


def a_param_init(min_rad, max_rad, eps=1e-8):
  """Λ with softplus(Λ) = −log r, r² ~ U[min_rad², max_rad²] (+ eps): Λ = log(exp(−log r) − 1)."""

  def init(key, shape, dtype=jnp.float32):
    log_r = 0.5 * jnp.log(jax.random.uniform(key, shape, dtype) * (max_rad**2 - min_rad**2) + min_rad**2 + eps)
    return jnp.log(jnp.exp(-log_r) - 1.0)

  return init


def fan_in_normal(scale):
  """N(0, scale/fan_in) with flax's fan-in (``variance_scaling(scale, "fan_in", "normal")``)."""
  return nn.initializers.variance_scaling(scale, "fan_in", "normal")


def block_diagonal(x, w, b):
  """x [B, L, H·I] through H independent [I, I] blocks (weights w [H, I, I], biases b [H, I]): [B, L, H·I]."""
  heads = w.shape[0]
  xh = x.reshape(x.shape[:-1] + (heads, -1))
  return (jnp.einsum("blhi,hij->blhj", xh, w) + b).reshape(x.shape)


@functools.partial(jax.jit, static_argnames=("bidirectional", "mode"))
def recurrent_block(p, x, mask, *, bidirectional, mode="chunk"):
  """Griffin's recurrent block (module docstring) on x [B, L, D] with mask bool [B, L], from the parameters
  ``p`` (the names :class:`RGLRU` declares; the ``_b`` ones for the reverse direction).

  Returns [B, L, D], zero at padded positions (before the module's dropout).
  """
  xp, packed, dest = pack(x, mask)                                    # real tokens first, padding behind
  keep = packed[..., None]
  first_real = jnp.arange(x.shape[1])[None] == 0                                  # [1, L]
  last_real = jnp.arange(x.shape[1])[None] == jnp.sum(packed, axis=1, keepdims=True) - 1  # [B, L]
  y = nn.gelu(jnp.einsum("bld,dw->blw", xp, p["linear_y_kernel"]) + p["linear_y_bias"])
  v = jnp.einsum("bld,dw->blw", xp, p["linear_x_kernel"]) + p["linear_x_bias"]
  v = jnp.where(keep, v, 0)                                           # the convolutions read no padded slot

  def direction(suffix, reverse):
    """h [B, L, W] of one direction's RG-LRU."""
    u = short_conv(v, p[f"conv_w{suffix}"], p[f"conv_bias{suffix}"], reverse=reverse)
    gate_x = jax.nn.sigmoid(block_diagonal(u, p[f"input_gate_w{suffix}"], p[f"input_gate_bias{suffix}"]))
    gate_a = jax.nn.sigmoid(block_diagonal(u, p[f"a_gate_w{suffix}"], p[f"a_gate_bias{suffix}"]))
    log_a = -GATE_SCALE * gate_a * jax.nn.softplus(p[f"ssm_a_param{suffix}"])
    multiplier = sqrt_bounded_gradient(1 - jnp.exp(2 * log_a), MAX_SQRT_GRADIENT)
    reset = (last_real if reverse else first_real)[..., None]       # this direction's segment start
    multiplier = jnp.where(reset, 1.0, multiplier)
    a = jnp.where(keep, jnp.where(reset, 0.0, jnp.exp(log_a)), 1.0)  # padded slots: no decay ...
    inputs = jnp.where(keep, u * gate_x * multiplier, 0)             # ... and no write
    method = "associative" if mode == "chunk" else "sequential"
    return _scan.diagonal_recurrence(a, inputs, reverse=reverse, method=method)

  h = direction("", False)
  if bidirectional:
    h = h + direction("_b", True)
  out = jnp.einsum("blw,wd->bld", h * y, p["linear_out_kernel"]) + p["linear_out_bias"]
  return unpack(out, dest, mask)


@register_mixer("rg_lru", RGLRUConfig)
class RGLRU(nn.Module):
  """Griffin's recurrent block with the RG-LRU (module docstring): linear_y → GeLU; linear_x → Conv1D →
  RG-LRU (+ reverse); multiply; linear_out → dropout. The parameters are declared here, the computation
  is :func:`recurrent_block`."""

  config: RGLRUConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    check_mode("rg_lru", cfg.mode)
    d_model = x.shape[-1]
    width, heads = cfg.width(d_model), cfg.heads(d_model)
    block = width // heads
    real = compute_dtype(x)
    p = {}

    def param(name, init, shape):
      p[name] = self.param(name, init, shape, real)

    zeros = nn.initializers.zeros
    for name in ("linear_y", "linear_x"):
      param(f"{name}_kernel", fan_in_normal(1.0), (d_model, width))
      param(f"{name}_bias", zeros, (width,))
    bidirectional = cfg.bidirectional and not cfg.causal
    for suffix in ("", "_b") if bidirectional else ("",):
      param(f"conv_w{suffix}", fan_in_normal(0.01), (cfg.conv_width, width))
      param(f"conv_bias{suffix}", zeros, (width,))
      for gate in ("input_gate", "a_gate"):
        param(f"{gate}_w{suffix}", fan_in_normal(1.0), (heads, block, block))
        param(f"{gate}_bias{suffix}", zeros, (heads, block))
      param(f"ssm_a_param{suffix}", a_param_init(cfg.min_rad, cfg.max_rad), (width,))
    param("linear_out_kernel", fan_in_normal(cfg.final_w_init_variance_scale), (width, d_model))
    param("linear_out_bias", zeros, (d_model,))
    mask = default_mask(x, mask)
    out = recurrent_block(p, x.astype(real), mask, bidirectional=bidirectional, mode=cfg.mode)
    return finish(out, mask, x.dtype, cfg.dropout_rate, deterministic)
