"""RWKV-6 "Finch" time mixing (Peng et al., "Eagle and Finch: RWKV with Matrix-Valued States and Dynamic
Recurrence", 2024): a multi-head linear recurrence with a per-key, data-dependent decay, a "bonus" for the
current token, token shift with data-dependent interpolation (ddlerp), a per-head GroupNorm and a SiLU gate.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key (and value) dim per head
(``H·K = D``), ``R`` rank of the token-mix LoRA, ``Q`` rank of the decay LoRA, ``F`` the five mixed inputs
(w, k, v, r, g).

Equations (one layer, input ``x [B, L, D]``; ``x'_t`` the token shift, below)::

    Δ_t      = x'_t − x_t                                                       [B, L, D]
    m_t      = tanh((x_t + Δ_t ⊙ μ_x) A) B_F                                      [B, L, F, D]
               (A = time_maa_w1 [D, F·R], B_F = time_maa_w2 [F, R, D])
    x^◻_t    = x_t + Δ_t ⊙ (μ_◻ + m^◻_t),  ◻ ∈ {w, k, v, r, g}                      (ddlerp)
    r, k, v  = x^r W_r, x^k W_k, x^v W_v;   g = silu(x^g W_g)                      [B, L, H, K]
    d_t      = time_decay + tanh(x^w_t W_1) W_2;   log w_t = −exp(d_t) ≤ 0         [B, L, H, K]
    S_t      = diag(w_t) S_{t−1} + k_t v_tᵀ                                        [B, H, K, V]
    o_t      = r_tᵀ S_{t−1} + (r_t ⊙ u ⊙ k_t)·1 v_t      (u = time_faaaa [H, K], the bonus)
    y_t      = (GroupNorm_H(o_t) ⊙ g_t) W_o                                       [B, L, D]

The recurrence is the shared engine's (``_linear_recurrence.linear_recurrence`` with ``read="before"``,
``log_decay=log w`` per key); the bonus term is added here, as fla's ``naive_recurrent_rwkv6`` does inside
its loop (``o_i = (h + u ⊙ k_i v_iᵀ)ᵀ q_i``, then ``h = h ⊙ w_i + k_i v_iᵀ``). Scale 1 on r (fla calls its
kernels with ``scale=1``).

Bidirectional mode (``causal=False``): the same recurrence runs on the row and on the reversed row (the same
r, k, v, w, flipped), both reading before writing, and the bonus counts token t once:

    o_t = r_tᵀ S^f_{t−1} + r_tᵀ S^b_{t+1} + (r_t ⊙ u ⊙ k_t)·1 v_t,   S^b_t = diag(w_t) S^b_{t+1} + k_t v_tᵀ

so the weight between t and j is the product of the decays strictly between them in both directions. This is
Vision-RWKV-6's "Bi-WKV" (``OpenGVLab/Vision-RWKV`` ``classification/mmcls_custom/models/backbones/cuda_v6/
wkv6_cuda.cu`` ``kernel_forward``: a loop from the end that adds r·state before writing, then the forward
loop with the bonus). It is two causal calls of the engine (:func:`both_ways`), not the engine's own
``causal=False``, whose backward pass gives token t the next token's decay (a LION-style mask, with the
decay of the far end j included backward but not forward).

Token shift (a causal convolution of width 2 in the original: ``x'_t = x_{t−1}``, zero before the first
token). Here it skips padded positions: ``x'_t`` is the previous REAL token of the row (zero if there is
none), so padding in the middle of a row neither enters the window nor shifts it, and removing the padded
positions from the row leaves the real outputs unchanged. In bidirectional mode the shift looks both ways
(one set of r, k, v, w, g serves both directions): in every block of K input channels the first ⌈K/2⌉
channels take the previous real token and the others the NEXT real token (zero if none). This is
Vision-RWKV's ``q_shift_multihead`` (``vrwkv6.py``: each head's channels split into four quarters shifted
from the four image neighbours) reduced to the one sequence axis.

Heads: ``K = head_dim`` (64, RWKV-LM's ``head_size_a``) when it divides d_model, H = D / K. Otherwise
``H = max(1, D // head_dim)`` lowered until it divides D, and K = D / H (d_model 16 → one head of 16,
d_model 128 → 2 heads of 64, d_model 100 → one head of 100).

Defaults and initialisation (``BlinkDL/RWKV-LM`` ``RWKV-v5/src/model.py`` ``RWKV_Tmix_x060`` and
``RWKV.generate_init_weight``; ``RWKV-v5/train.py`` for head_size_a = 64, head_size_divisor = 8; fla
``fla/layers/rwkv6.py`` ``RWKV6Attention`` for the layer structure: LerpLinear/DDLerpLinear, the
LoRAs, ``bonus``, ``g_norm``; it leaves these inits to RWKV-LM), as layer 0 of a one-layer model
(``ratio_0_to_1 = 0``, ``ratio_1_to_almost0 = 1``; ``ddd_i = i / D``):

- ``time_maa_x, time_maa_w, time_maa_k`` = 1 − ddd; ``time_maa_v`` = 1 − (ddd + 0.3·ratio_0_to_1);
  ``time_maa_r, time_maa_g`` = 1 − ddd^0.5.
- ``time_maa_w1`` [D, 5·32]: zero in RWKV-LM (see the differences); ``time_maa_w2`` [5, 32, D] ~ U(−0.01, 0.01).
  D_MIX_LORA = 32 (``mix_low_rank_dim``; fla ``proj_low_rank_dim``).
- ``time_decay_n = −6 + 5·(n / (D − 1))^(0.7 + 1.3·ratio_0_to_1)`` [D]; ``time_decay_w1`` [D, 64]: zero in
  RWKV-LM (differences); ``time_decay_w2`` [64, D] ~ U(−0.01, 0.01). D_DECAY_LORA = 64
  (``decay_low_rank_dim``; fla ``gate_low_rank_dim``).
- ``time_faaaa_n = ratio_0_to_1·(1 − n / (D − 1)) + ((n + 1) mod 3 − 1)·0.1`` [H, K] (the bonus u).
- ``receptance``, ``value``: orthogonal, gain 1; ``key``, ``gate``: orthogonal, gain 0.1 (``generate_init_weight``).
- ``ln_x``: GroupNorm(H groups), eps = 1e-5·head_size_divisor² = 6.4e-4 (``norm_eps``); weight
  ((1 + layer_id) / n_layer)^0.7 = 1, bias 0.

Differences from the original:

- Zero initialisations that would leave a parameter without gradient at initialisation (the project's
  contract: every parameter gets a non-zero gradient): ``output`` (zero in RWKV-LM) is drawn as fla's
  ``RWKV6Attention._initialize_weights`` draws its ``o_proj`` (xavier_uniform, gain 2^−2.5); ``time_maa_w1``
  and ``time_decay_w1`` (zero in RWKV-LM; zero also in fla's LoRA first layers) are drawn from
  U(−1e-4, 1e-4) as Vision-RWKV-6 does (``vrwkv6.py`` ``_init_weights``).
- Padding: the token shift skips padded positions (above), and the engine leaves the state unchanged at
  them (no decay, no write) in both directions; outputs at padded positions are zero. RWKV-LM has no
  padding; fla zeroes padded inputs and values (left padding only) but shifts through them.
- Bidirectional mode (``causal=False``, the LRA default) does not exist in RWKV-LM or fla: Vision-RWKV-6's
  Bi-WKV and a one-axis q-shift (above). Vision-RWKV-6 itself differs from this layer in its image q-shift
  (four directions), its init of time_maa_w2/time_decay_w2 (U(−1e-4, 1e-4)) and ln_x eps (1e-5).
- Every layer is initialised as layer 0 of a one-layer RWKV (the mixer does not know its depth):
  RWKV-LM's depth-dependent ramps (``ratio_0_to_1``, ``ratio_1_to_almost0``, ln_x's layer scale) take
  that layer's values.
- Key and value dims are d_model (RWKV-LM's ``dim_att = n_embd``); fla's defaults (``expand_k = 0.5``,
  4 heads) are not used. Heads are derived from d_model (above) where RWKV-LM takes H = dim_att / 64 (its
  CUDA kernel is compiled for head size 64).
- RWKV-LM's optimizer groups (time_decay at 2× the learning rate with ``layerwise_lr``, weight decay
  only on 2-D weights) are not reproduced: the harness's optimizer treats every parameter alike.
- ``config.dropout_rate`` is applied to the layer's output (the time-mix of RWKV-LM has no dropout; its
  Block drops after the residual sum).
- Computation in float32 (float64 for float64 inputs; RWKV-LM's kernels take bfloat16 and accumulate in
  float32); parameters are float32; the output is cast to the input's dtype. Parameter names are
  RWKV-LM's (flax's ``kernel`` [in, out] for the linear maps; ``ln_x_scale``, ``ln_x_bias`` for ln_x's
  weight and bias).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.mixers._linear_recurrence import linear_recurrence
from attention_zoo.registry import MixerConfig, register_mixer

MODES = ("chunk", "recurrent")


@dataclasses.dataclass(frozen=True)
class RWKV6Config(MixerConfig):
  """RWKV-6 time-mix options (module docstring; defaults of RWKV-LM ``RWKV_Tmix_x060``).

  Attributes:
    head_dim: K, the key/value dim per head when it divides d_model (RWKV-LM ``head_size_a``).
    mix_low_rank_dim: R, rank of the token-mix LoRA (RWKV-LM D_MIX_LORA).
    decay_low_rank_dim: Q, rank of the decay LoRA (RWKV-LM D_DECAY_LORA).
    norm_eps: the per-head GroupNorm's epsilon (RWKV-LM 1e-5·head_size_divisor², divisor 8).
    mode: "chunk" (the engine's chunked-parallel form) or "recurrent" (its token-by-token scan).
    chunk_size: the engine's chunk length in "chunk" mode.
  """

  head_dim: int = 64
  mix_low_rank_dim: int = 32
  decay_low_rank_dim: int = 64
  norm_eps: float = 64e-5
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "RWKV-6"
  family: ClassVar[str] = "linear-recurrent"

  def state_size(self, length: int, d_model: int) -> int:
    """H·K·K + D = d_model·K + d_model: the H matrix states S [K, V] (V = K) and the token-shift buffer (the
    last real token, D floats); K the head dim derived from d_model (module docstring). Independent of the
    length."""
    del length
    _, k = heads(d_model, self.head_dim)
    return d_model * k + d_model


def both_ways(cfg, mask, read: str, **arrays):
  """The engine's causal recurrence (``read``, ``cfg.mode``, ``cfg.chunk_size``) on [B, L, ...] ``arrays`` (q,
  k, v, log_decay, a, b); with ``cfg.causal`` False plus the same recurrence on the reversed row, flipped back
  (token t is then in both passes with read="after", in neither with read="before")."""
  def run(m, **z):
    return linear_recurrence(**z, read=read, mask=m, causal=True, mode=cfg.mode, chunk_size=cfg.chunk_size)

  o = run(mask, **arrays)
  if cfg.causal:
    return o
  flip = lambda z: jnp.flip(z, axis=1)
  return o + flip(run(flip(mask), **{name: flip(z) for name, z in arrays.items()}))


def heads(d_model: int, head_dim: int) -> tuple[int, int]:
  """(H, K): K = head_dim when it divides d_model; else H = max(1, d_model // head_dim) lowered until it
  divides d_model, K = d_model / H."""
  h = max(1, d_model // max(1, head_dim))
  while d_model % h:
    h -= 1
  return h, d_model // h


def token_shift(x, mask, causal: bool, block: int):
  """x' [B, L, D]: the previous real token of each position (zero if none), skipping padded positions.

  With ``causal=False``, in each block of ``block`` channels the first ⌈block/2⌉ take the previous real
  token and the rest the next real token (zero if none): Vision-RWKV's q-shift on one axis.
  """
  _, length, d = x.shape
  pos = jnp.arange(length)
  last_real = jax.lax.cummax(jnp.where(mask, pos, -1), axis=1)  # [B, L]: last real index <= t
  prev = jnp.concatenate([jnp.full_like(last_real[:, :1], -1), last_real[:, :-1]], axis=1)
  shifted = _gather(x, prev, prev >= 0)
  if causal:
    return shifted
  first_real = jax.lax.cummin(jnp.where(mask, pos, length), axis=1, reverse=True)  # first real index >= t
  nxt = jnp.concatenate([first_real[:, 1:], jnp.full_like(first_real[:, :1], length)], axis=1)
  from_next = _gather(x, nxt, nxt < length)
  backward_channels = (jnp.arange(d) % block) >= (block + 1) // 2
  return jnp.where(backward_channels, from_next, shifted)


def _gather(x, index, valid):
  """x[b, index[b, l], :] where ``valid``, else 0."""
  index = jnp.clip(index, 0, x.shape[1] - 1)
  taken = jnp.take_along_axis(x, index[..., None], axis=1)
  return jnp.where(valid[..., None], taken, 0)


def group_norm(o, scale, bias, eps):
  """GroupNorm with one group per head: o [B, L, H, V] normalised over V, then ⊙ scale + bias ([H·V])."""
  mean = jnp.mean(o, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(o - mean), axis=-1, keepdims=True)
  normed = (o - mean) * jax.lax.rsqrt(var + eps)
  return normed.reshape(*o.shape[:-2], -1) * scale + bias


def ramp(d: int) -> np.ndarray:
  """ddd_i = i / D [D] (RWKV-LM's channel ramp)."""
  return np.arange(d, dtype=np.float64) / d


def time_maa_init(power: float, offset: float = 0.0):
  """1 − (ddd^power + offset) [D] (RWKV-LM ``time_maa_*`` with ratio_1_to_almost0 = 1)."""
  def init(_key, shape, dtype=jnp.float32):
    return jnp.asarray(1.0 - (ramp(shape[0]) ** power + offset), dtype)
  return init


def time_decay_init(_key, shape, dtype=jnp.float32, ratio_0_to_1: float = 0.0):
  """−6 + 5·(n / (D − 1))^(0.7 + 1.3·ratio_0_to_1) [D] (RWKV-LM ``time_decay``)."""
  n = np.arange(shape[0], dtype=np.float64)
  return jnp.asarray(-6 + 5 * (n / max(shape[0] - 1, 1)) ** (0.7 + 1.3 * ratio_0_to_1), dtype)


def time_faaaa_init(_key, shape, dtype=jnp.float32, ratio_0_to_1: float = 0.0):
  """ratio_0_to_1·(1 − n / (D − 1)) + ((n + 1) mod 3 − 1)·0.1, as [H, K] (RWKV-LM ``time_faaaa``)."""
  n = np.arange(math.prod(shape), dtype=np.float64)
  zigzag = ((n + 1) % 3 - 1) * 0.1
  return jnp.asarray((ratio_0_to_1 * (1 - n / max(n.size - 1, 1)) + zigzag).reshape(shape), dtype)


def uniform(bound: float):
  """U(−bound, bound)."""
  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


# fla's ``xavier_uniform_(gain=2 ** -2.5)``: variance_scaling with scale = gain², fan_avg, uniform.
xavier_uniform_fla = nn.initializers.variance_scaling(2.0 ** -5, "fan_avg", "uniform")


@register_mixer("rwkv6", RWKV6Config)
class RWKV6(nn.Module):
  """RWKV-6 time mixing (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: RWKV6Config

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    if cfg.mode not in MODES:
      raise ValueError(f"rwkv6: mode must be one of {MODES}, got {cfg.mode!r}")
    b, length, d = x.shape
    h, kd = heads(d, cfg.head_dim)
    real = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    if mask is None:
      mask = jnp.ones((b, length), bool)
    mask = jnp.asarray(mask, bool)
    keep = mask[..., None]
    xs = jnp.where(keep, x, 0).astype(real)

    p = lambda name, init, shape: self.param(name, init, shape).astype(real)
    maa_x = p("time_maa_x", time_maa_init(1.0), (d,))
    maa = jnp.stack([p("time_maa_w", time_maa_init(1.0), (d,)), p("time_maa_k", time_maa_init(1.0), (d,)),
                     p("time_maa_v", time_maa_init(1.0), (d,)), p("time_maa_r", time_maa_init(0.5), (d,)),
                     p("time_maa_g", time_maa_init(0.5), (d,))])  # [F, D], F = (w, k, v, r, g)
    rank, drank = cfg.mix_low_rank_dim, cfg.decay_low_rank_dim
    maa_w1 = p("time_maa_w1", uniform(1e-4), (d, 5 * rank))
    maa_w2 = p("time_maa_w2", uniform(0.01), (5, rank, d))
    decay = p("time_decay", time_decay_init, (d,))
    decay_w1 = p("time_decay_w1", uniform(1e-4), (d, drank))
    decay_w2 = p("time_decay_w2", uniform(0.01), (drank, d))
    bonus = p("time_faaaa", time_faaaa_init, (h, kd))
    ln_scale = p("ln_x_scale", nn.initializers.ones, (d,))
    ln_bias = p("ln_x_bias", nn.initializers.zeros, (d,))

    def dense(name, init, z):
      return nn.Dense(d, use_bias=False, kernel_init=init, dtype=real, name=name)(z)

    delta = token_shift(xs, mask, cfg.causal, kd) - xs                                  # Δ [B, L, D]
    lora = jnp.tanh(jnp.einsum("bld,dr->blr", xs + delta * maa_x, maa_w1)).reshape(b, length, 5, rank)
    mixes = jnp.einsum("blfr,frd->blfd", lora, maa_w2)                                 # m [B, L, F, D]
    xw, xk, xv, xr, xg = jnp.unstack(xs[:, :, None] + delta[:, :, None] * (maa + mixes), axis=2)

    split = lambda z: z.reshape(b, length, h, kd)  # [B, L, D] -> [B, L, H, K]
    r = split(dense("receptance", nn.initializers.orthogonal(1.0), xr))
    k = split(dense("key", nn.initializers.orthogonal(0.1), xk))
    v = split(dense("value", nn.initializers.orthogonal(1.0), xv))
    g = nn.silu(dense("gate", nn.initializers.orthogonal(0.1), xg))                  # [B, L, D]
    decay_lora = jnp.einsum("blq,qd->bld", jnp.tanh(jnp.einsum("bld,dq->blq", xw, decay_w1)), decay_w2)
    log_w = split(-jnp.exp(decay + decay_lora))                                      # log w [B, L, H, K]

    o = both_ways(cfg, mask, "before", q=r, k=k, v=v, log_decay=log_w)                 # [B, L, H, V]
    o = o + jnp.einsum("blhk,hk,blhk->blh", r, bonus, k)[..., None] * v             # the bonus, token t
    o = jnp.where(keep[..., None], o, 0)
    y = dense("output", xavier_uniform_fla, group_norm(o, ln_scale, ln_bias, cfg.norm_eps) * g)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    return jnp.where(keep, y, 0).astype(x.dtype)
