"""mLSTM, the matrix LSTM of xLSTM (Beck et al., "xLSTM: Extended Long Short-Term Memory", NeurIPS 2024):
a matrix memory written with an exponential input gate and a sigmoid forget gate, read by a query and divided
by a normaliser state, inside a pre-up-projection block (causal conv + SiLU on the query/key path, a
SiLU output gate, a learnable skip, a down-projection).

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``E`` inner width (the up-projection), ``H`` heads,
``K`` head dim (``E / H``, keys, queries and values alike), ``J`` blocks of the block-diagonal q/k/v
projections (``E / Q``), ``Q`` their block size (``qkv_proj_blocksize``), ``W`` the conv kernel width.

Equations (one layer, input ``x [B, L, D]``; ``σ`` the logistic function)::

    [x_m, z] = x W_up                                     x_m, z [B, L, E]    (proj_up, D -> 2E, no bias)
    c        = SiLU(conv_W(x_m))                           [B, L, E]           (depthwise causal conv, width W)
    q, k     = blockdiag(W_q) c,  blockdiag(W_k) c        [B, L, E] -> [B, L, H, K]
    v        = blockdiag(W_v) x_m                          [B, L, E] -> [B, L, H, K]
    ĩ, f̃     = [q; k; v] W_i + b_i,  [q; k; v] W_f + b_f   [B, L, H]            (igate, fgate: 3E -> H)
    C_t      = σ(f̃_t) C_{t-1} + exp(ĩ_t) k_t v_tᵀ/√K      [H, K, K]
    n_t      = σ(f̃_t) n_{t-1} + exp(ĩ_t) k_t/√K           [H, K]
    h̃_t      = C_tᵀ q_t / max(|n_tᵀ q_t|, 1)               [H, K]   (eps aside, below)
    h        = MultiHeadLayerNorm(h̃) + skip ⊙ c           [B, L, E]           (group norm per head)
    y        = drop((h ⊙ SiLU(z)) W_down)                  [B, L, D]           (proj_down, E -> D, no bias)

The recurrence is the shared engine's (``attention_zoo.mixers._linear_recurrence.linear_recurrence``) with
``log_decay = log σ(f̃)`` and ``log_input_gate = ĩ``: it keeps xLSTM's stabiliser
``m_t = max(log σ(f̃_t) + m_{t-1}, ĩ_t)`` (m_0 = 0) and divides by ``max(|n'_tᵀ q_t|, exp(−m_t)) + eps`` with
the stabilised states ``C'_t = exp(−m_t) C_t``, ``n'_t = exp(−m_t) n_t`` (``backends.py``
``recurrent_step_stabilized_simple``; ``parallel_stabilized_simple`` is the same sum in matrix form); the
stabiliser cancels but for the eps, giving the line for ``h̃_t`` above. ``mode="recurrent"`` is the engine's
token-by-token ``lax.scan``, ``mode="chunk"`` its chunked-parallel form (the training default), same outputs.
The ``1/√K`` is applied to q instead of k (same products: ``qᵀ(k/√K) = (q/√K)ᵀk`` in the numerator and in
``n_tᵀ q_t``).

Bidirectional (``causal=False``, the LRA default; xLSTM has no bidirectional form): the engine's
``causal=False``, a forward pass that reads the state including token t plus a backward pass over the reversed
sequence that reads it before writing token t, each token counted once. The two stabilised (numerator,
normaliser) pairs are brought to the common stabiliser ``max(m^f_t, m^b_t)``, added, and divided once::

    h̃_t = Σ_j w_tj (q_tᵀk_j/√K) v_j / max(|Σ_j w_tj q_tᵀk_j/√K|, 1),
    w_tj = exp(ĩ_j + Σ_{l=min(t,j)+1}^{max(t,j)} log σ(f̃_l))          (all real j, both sides of t)

so the gates between two tokens weigh them alike in both directions. The conv stays causal (left to right)
in both settings.

Defaults and initialisation, from NX-AI/xlstm (read at 032a6fb; ``xlstm/blocks/mlstm/layer.py`` ``mLSTMLayerConfig``,
``mLSTMLayer.reset_parameters``; ``xlstm/blocks/mlstm/cell.py`` ``mLSTMCell``; ``xlstm/utils.py``
``UpProjConfigMixin``; ``xlstm/components/{init,conv,linear_headwise,ln}.py``):

- ``proj_factor`` 2, the inner width ``E = ⌈2D / 64⌉·64`` (``round_proj_up_to_multiple_of`` 64,
  ``round_proj_up_dim_up`` True): d_model 16 -> 64, 64 -> 128, 128 -> 256, 256 -> 512, 512 -> 1024.
- ``num_heads`` 4 (``K = E / 4``; E is a multiple of 64, so 4 always divides it), ``qkv_proj_blocksize`` 4
  (``J = E / 4`` blocks of 4 x 4), ``conv1d_kernel_size`` 4, ``bias`` False (proj_up, q/k/v, proj_down).
- proj_up, q_proj, k_proj, v_proj weights ~ N(0, 2/(5D)) (``small_init_init_`` with ``dim=embedding_dim``:
  the q/k/v blocks use D, not E, as the layer's ``_init_qkv_proj`` says); proj_down ~ N(0, (2/(num_blocks·√D))²)
  (``wang_init_``); biases (when ``bias``) zero.
- conv: depthwise (groups = E) with a bias (``CausalConv1dConfig.causal_conv_bias`` True), torch's Conv1d
  default init: weight and bias ~ U(−1/√W, 1/√W) (fan-in W).
- igate, fgate: Linear(3E -> H) with a bias; weights zero; fgate bias ``linspace(3, 6, H)``
  (``bias_linspace_init_``), igate bias ~ N(0, 0.1²).
- outnorm: ``MultiHeadLayerNorm(weight=True, bias=False)``, eps 1e-5, the scale stored as a residual
  weight ``1 + w`` with w = 0 at init (``ln.LayerNorm.residual_weight``).
- learnable_skip ones [E]. Dropout: ``mLSTMLayer.dropout`` after proj_down (``config.dropout_rate``).
- ``eps`` 1e-6, added to the denominator ``max(|n'_tᵀq_t|, exp(−m_t)) + eps`` (``backends.py``), with the
  recurrent step's stabiliser started at m_0 = 0 (the engine's ``normalizer_eps``; its chunked form carries the
  same m_t). ``parallel_stabilized_simple`` instead takes m_t = max_j (row-wise), which differs from it only
  through this eps; ``eps=0`` makes both exact.

Differences from the original:

- Padding (the original has none): the recurrence is the engine's masked one (a padded position neither
  decays nor writes the state, in both directions; its output is 0). The causal conv runs over the real
  tokens only: they are packed to the front of the row (in order), convolved with zeros before the first
  one, and scattered back, so the window of a real token is the W−1 previous REAL tokens, padding at the
  end or in the middle alike. Removing the padded positions from a row leaves the real outputs unchanged.
  Outputs at padded positions are 0.
- ``causal=False`` makes the recurrence bidirectional (above); the original is causal only. There the eps
  is added at the stabiliser max(m^f_t, m^b_t).
- ``num_blocks`` (the wang_init depth of the stack, ``_num_blocks``, set by ``xLSTMBlockStack``) is a
  config field, default 1 (``mLSTMLayerConfig._num_blocks``'s default): the mixer does not know the
  encoder's depth.
- The block around the layer (pre-LayerNorm, residual: ``xlstm_block.py``) is the encoder's.
- Compute in float32 (float64 for float64 inputs, bfloat16 inputs computed in float32); parameters float32;
  output cast to the input's dtype. Flax Dense kernels are [in, out] (torch: [out, in]); the q/k/v block
  weights keep the original's [J, Q_out, Q_in].
- ``context_length`` (the original's causal-mask buffer size) does not exist: any length works.
- Parameter names: ``conv1d_kernel`` [W, E] / ``conv1d_bias`` (the original's ``conv1d.conv.weight`` [E, 1, W]
  / ``.bias``), ``outnorm_weight`` (``mlstm_cell.outnorm.weight``), ``igate`` / ``fgate`` directly in the layer
  (the original's are in ``mlstm_cell``); the rest keep the original's names.
- Weight decay is the harness optimizer's business: the original exempts biases, ``learnable_skip`` and the
  norm weight (``WeightDecayOptimGroupMixin``: decay only names with "weight" and without "norm").
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers._layer_common import (check_mode, finish, group_normalize, layer_input, short_conv_real,
                                                uniform)
from attention_zoo.mixers._linear_recurrence import linear_recurrence
from attention_zoo.registry import MixerConfig, register_mixer

# The engine compiled as one program: called op by op (outside an enclosing jit), each of its many small ops
# would otherwise be dispatched and compiled on its own. Inside a jit it is inlined.
_engine = jax.jit(linear_recurrence, static_argnames=("read", "causal", "mode", "chunk_size", "normalizer_eps"))


@dataclasses.dataclass(frozen=True)
class MLSTMConfig(MixerConfig):
  """mLSTM options (defaults: NX-AI/xlstm ``mLSTMLayerConfig`` / ``UpProjConfigMixin``).

  Attributes:
    proj_factor: the up-projection factor, E = proj_factor·D rounded to ``round_proj_up_to_multiple_of``.
    round_proj_up_to_multiple_of: E is a multiple of this.
    round_proj_up_dim_up: round E up (True) or down (False).
    num_heads: H; must divide E.
    qkv_proj_blocksize: Q, the block size of the block-diagonal q/k/v projections; must divide E.
    conv1d_kernel_size: W, the causal conv width (0: no conv).
    bias: biases on proj_up, the q/k/v projections and proj_down.
    num_blocks: the stack depth in proj_down's wang_init std 2/(num_blocks·√D).
    mode: "chunk" (chunked-parallel, the training default) or "recurrent" (token-by-token scan).
    chunk_size: the engine's chunk length in "chunk" mode.
    eps: added to the normaliser's stabilised denominator (the original's backend ``eps``).
  """

  proj_factor: float = 2.0
  round_proj_up_to_multiple_of: int = 64
  round_proj_up_dim_up: bool = True
  num_heads: int = 4
  qkv_proj_blocksize: int = 4
  conv1d_kernel_size: int = 4
  bias: bool = False
  num_blocks: int = 1
  mode: str = "chunk"
  chunk_size: int = 64
  eps: float = 1e-6

  # xLSTM Table 6's "xLSTM" row is the best of xLSTM[1:0] (mLSTM blocks only, this layer) and [0:1] (sLSTM).
  paper_name: ClassVar[str | None] = "xLSTM"
  family: ClassVar[str] = "linear-recurrent"

  def __post_init__(self):
    check_mode("mLSTM", self.mode)
    if self.chunk_size < 1 or self.num_heads < 1 or self.qkv_proj_blocksize < 1:
      raise ValueError("mLSTM: chunk_size, num_heads and qkv_proj_blocksize must be positive")
    if self.conv1d_kernel_size < 0 or self.round_proj_up_to_multiple_of < 1:
      raise ValueError("mLSTM: conv1d_kernel_size must be >= 0 and round_proj_up_to_multiple_of >= 1")

  def inner_dim(self, d_model: int) -> int:
    """E: proj_factor·D rounded (up by default) to a multiple of ``round_proj_up_to_multiple_of``
    (``UpProjConfigMixin._set_proj_up_dim``)."""
    blocks = self.proj_factor * d_model / self.round_proj_up_to_multiple_of
    blocks = math.ceil(blocks) if self.round_proj_up_dim_up else math.floor(blocks)
    inner = int(blocks * self.round_proj_up_to_multiple_of)
    if inner < 1 or inner % self.num_heads or inner % self.qkv_proj_blocksize:
      raise ValueError(f"mLSTM: the inner width {inner} (d_model {d_model}) must be positive and divisible by "
                       f"num_heads ({self.num_heads}) and qkv_proj_blocksize ({self.qkv_proj_blocksize})")
    return inner

  def state_size(self, length: int, d_model: int) -> int:
    """H·(K² + K + 1) + (W − 1)·E with E = ``inner_dim(d_model)``, K = E/H: per head the matrix memory C
    [K, K], the normaliser n [K] and the stabiliser m, plus the conv's W − 1 previous inputs of width E.

    Independent of the length. The original's ``conv1d_step`` buffer holds W inputs, the current one
    included; only the W − 1 previous ones are carried between steps.
    """
    del length
    inner = self.inner_dim(d_model)
    k = inner // self.num_heads
    return self.num_heads * (k * k + k + 1) + max(self.conv1d_kernel_size - 1, 0) * inner


def small_init(dim: int):
  """N(0, 2/(5·dim)) (``small_init_init_``)."""
  return nn.initializers.normal(math.sqrt(2.0 / (5.0 * dim)))


def wang_init(dim: int, num_blocks: int):
  """N(0, (2/(num_blocks·√dim))²) (``wang_init_``)."""
  return nn.initializers.normal(2.0 / num_blocks / math.sqrt(dim))


def linspace_init(start: float, end: float):
  """linspace(start, end, n) for a bias [n] (``bias_linspace_init_``)."""
  return lambda _key, shape, dtype=jnp.float32: jnp.linspace(start, end, shape[0], dtype=dtype)


class HeadwiseLinear(nn.Module):
  """Block-diagonal linear map (``LinearHeadwiseExpand`` with expand factor 1): the E features split into J
  blocks of Q, each mapped by its own [Q, Q] weight (stored [J, Q_out, Q_in]); ``init_dim`` sets the
  small_init std."""

  blocks: int
  init_dim: int
  use_bias: bool = False
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    *lead, e = x.shape
    q = e // self.blocks
    weight = self.param("weight", small_init(self.init_dim), (self.blocks, q, q))
    y = jnp.einsum("...jq,jpq->...jp", x.reshape(*lead, self.blocks, q), weight.astype(self.dtype))
    y = y.reshape(*lead, e)
    if self.use_bias:
      y = y + self.param("bias", nn.initializers.zeros, (e,)).astype(self.dtype)
    return y


@register_mixer("mlstm", MLSTMConfig)
class MLSTM(nn.Module):
  """The mLSTM layer (``mLSTMLayer``): up-projection, conv + SiLU, block-diagonal q/k/v, the mLSTM cell with
  its multi-head layer norm, learnable skip, SiLU output gate, down-projection, dropout (module docstring)."""

  config: MLSTMConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    b, length, d = x.shape
    inner = cfg.inner_dim(d)
    heads = cfg.num_heads
    k_dim = inner // heads
    real, mask, u = layer_input(x, mask)

    up = nn.Dense(2 * inner, use_bias=cfg.bias, dtype=real, kernel_init=small_init(d), name="proj_up")(u)
    x_m, z = up[..., :inner], up[..., inner:]                                        # [B, L, E] each

    if cfg.conv1d_kernel_size > 0:
      width = cfg.conv1d_kernel_size
      kernel = self.param("conv1d_kernel", uniform(width ** -0.5), (width, inner))
      bias = self.param("conv1d_bias", uniform(width ** -0.5), (inner,))
      conv = short_conv_real(x_m, mask, kernel.astype(real), bias.astype(real))
    else:
      conv = x_m
    c = jax.nn.silu(conv)

    blocks = inner // cfg.qkv_proj_blocksize
    proj = lambda name: HeadwiseLinear(blocks, d, cfg.bias, real, name=name)
    q, k, v = proj("q_proj")(c), proj("k_proj")(c), proj("v_proj")(x_m)      # [B, L, E] each

    gate_in = jnp.concatenate([q, k, v], axis=-1)                                   # [B, L, 3E]
    igate = nn.Dense(heads, dtype=real, kernel_init=nn.initializers.zeros,
                     bias_init=nn.initializers.normal(0.1), name="igate")(gate_in)   # [B, L, H]
    fgate = nn.Dense(heads, dtype=real, kernel_init=nn.initializers.zeros, bias_init=linspace_init(3.0, 6.0),
                     name="fgate")(gate_in)                                          # [B, L, H]

    split = lambda t: t.reshape(b, length, heads, k_dim)
    h_tilde = _engine(
        split(q) * k_dim ** -0.5, split(k), split(v),
        log_decay=jax.nn.log_sigmoid(fgate), log_input_gate=igate, read="after", mask=mask,
        causal=cfg.causal, mode=cfg.mode, chunk_size=cfg.chunk_size, normalizer_eps=cfg.eps)  # [B, L, H, K]

    norm_weight = self.param("outnorm_weight", nn.initializers.zeros, (inner,))
    # MultiHeadLayerNorm: a group norm per head over K, eps 1e-5, scale 1 + weight, no bias
    h = group_normalize(h_tilde.astype(real), 1e-5) * (1.0 + norm_weight.astype(real).reshape(heads, k_dim))
    h = h.reshape(b, length, inner)
    skip = self.param("learnable_skip", nn.initializers.ones, (inner,))
    h = (h + skip.astype(real) * c) * jax.nn.silu(z)

    y = nn.Dense(d, use_bias=cfg.bias, dtype=real, kernel_init=wang_init(d, cfg.num_blocks), name="proj_down")(h)
    return finish(y, mask, x.dtype, cfg.dropout_rate, deterministic)
