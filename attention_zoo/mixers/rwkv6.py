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
loop with the bonus). It is two causal calls of the engine (``_layer_common.both_ways``), not the engine's own
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

Defaults and initialisation (``BlinkDL/RWKV-LM`` at 524481d, ``RWKV-v5/src/model.py`` ``RWKV_Tmix_x060`` and
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
import jax.numpy as jnp
import numpy as np

from attention_zoo.mixers._layer_common import (RWKVStateSize, both_ways, check_mode, finish, group_norm, layer_input,
                                                ramp, rwkv_heads, rwkv_linear, rwkv_receptance_key_value, token_shift,
                                                uniform, xavier_uniform_fla)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class RWKV6Config(RWKVStateSize, MixerConfig):
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


@register_mixer("rwkv6", RWKV6Config)
class RWKV6(nn.Module):
  """RWKV-6 time mixing (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: RWKV6Config

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    check_mode("rwkv6", cfg.mode)
    b, length, d = x.shape
    h, kd = rwkv_heads(d, cfg.head_dim)
    real, mask, xs = layer_input(x, mask)

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

    delta = token_shift(xs, mask, cfg.causal, kd) - xs                                  # Δ [B, L, D]
    lora = jnp.tanh(jnp.einsum("bld,dr->blr", xs + delta * maa_x, maa_w1)).reshape(b, length, 5, rank)
    mixes = jnp.einsum("blfr,frd->blfd", lora, maa_w2)                                 # m [B, L, F, D]
    xw, xk, xv, xr, xg = jnp.unstack(xs[:, :, None] + delta[:, :, None] * (maa + mixes), axis=2)

    r, k, v = rwkv_receptance_key_value(xr, xk, xv, h, real)                          # [B, L, H, K]
    g = nn.silu(rwkv_linear("gate", nn.initializers.orthogonal(0.1), xg, real))       # [B, L, D]
    decay_lora = jnp.einsum("blq,qd->bld", jnp.tanh(jnp.einsum("bld,dq->blq", xw, decay_w1)), decay_w2)
    log_w = (-jnp.exp(decay + decay_lora)).reshape(b, length, h, kd)                  # log w [B, L, H, K]

    o = both_ways(cfg, mask, "before", q=r, k=k, v=v, log_decay=log_w)                 # [B, L, H, V]
    o = o + jnp.einsum("blhk,hk,blhk->blh", r, bonus, k)[..., None] * v             # the bonus, token t
    o = jnp.where(mask[..., None, None], o, 0)
    y = rwkv_linear("output", xavier_uniform_fla, group_norm(o, ln_scale, ln_bias, cfg.norm_eps) * g, real)
    return finish(y, mask, x.dtype, cfg.dropout_rate, deterministic)
