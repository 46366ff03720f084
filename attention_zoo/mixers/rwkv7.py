"""RWKV-7 "Goose" time mixing (Peng et al., "RWKV-7 "Goose" with Expressive Dynamic State Evolution", 2025):
a multi-head generalised delta rule with a per-key, data-dependent decay and a data-dependent in-context
learning rate, i.e. a diagonal-plus-low-rank state transition.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``H`` heads, ``K`` key (and value) dim per head
(``H·K = D``), ``Q_w, Q_a, Q_g`` ranks of the decay / learning-rate / gate LoRAs.

Equations (one layer, input ``x [B, L, D]``; ``x'_t`` the token shift, below)::

    Δ_t   = x'_t − x_t;   x^◻_t = x_t + Δ_t ⊙ μ_◻,   ◻ ∈ {r, w, k, v, a, g}          (static lerps)
    r, k, v = x^r W_r, x^k W_k, x^v W_v                                           [B, L, H, K]
    log w_t = −e^{−1/2} σ(w_0 + tanh(x^w_t W_1) W_2)     ∈ (−0.607, 0)                [B, L, H, K]
    a_t   = σ(a_0 + (x^a_t A_1) A_2)                     (in-context learning rate)
    g_t   = σ(x^g_t G_1) G_2                                                       [B, L, D]
    κ_t   = l2norm_K(k_t ⊙ k_k)                          (the "removal key" kk, per head)
    k̃_t   = k_t ⊙ (1 + (a_t − 1) ⊙ k_a)
    S_t   = (diag(w_t) − (κ_t ⊙ a_t) κ_tᵀ) S_{t−1} + k̃_t v_tᵀ                        [B, H, K, V]
    o_t   = S_tᵀ r_t                                                               (reads after writing)
    y_t   = ((GroupNorm_H(o_t) + (r_t · (k̃_t ⊙ r_k)) v_t) ⊙ g_t) W_o   (bonus per head, after the norm)

In RWKV's own layout (state [V, K], ``S_t = S_{t−1}(diag(w_t) − κ_tᵀ(κ_t ⊙ a_t)) + v_t k̃_tᵀ``) this is
the transpose. The recurrence is the shared engine's DPLR update (``_linear_recurrence.linear_recurrence``
with ``a``, ``b``: ``S_t = (D_t + a_t b_tᵀ) S_{t−1} + k_t v_tᵀ``, here ``a_t = κ_t ⊙ a_t``,
``b_t = −κ_t``), the form of fla's ``dplr_recurrence`` (``fla/ops/generalized_delta_rule/dplr/naive.py``:
``S = S·exp(gk) + k vᵀ + β (αᵀ S)`` with ``α = −κ``, ``β = κ ⊙ a``, as ``RWKV7Attention`` calls
``chunk_rwkv7(a=-kk, b=kk*a)``) and of RWKV-LM's CUDA kernel (``wkv7``, called with ``a = −κ``, ``b = κ ⊙ a``:
``sa = S·a``, ``S = S ⊙ w + sa bᵀ + v kᵀ``). Scale 1 on r. The decay is RWKV-LM's: its older
``w = −softplus(−(w_0 + ...)) − 0.5`` with the kernel's ``exp(−exp(w))`` and its newer clamp-w kernels'
``exp(−e^{−1/2} σ(w_0 + ...))`` (fla: ``w = −0.6065 σ(...)``, ``safe_gate``) are one map, used here in log form.

Value residual: RWKV-7 mixes every layer's v with the first layer's (``v = lerp(v, v_first, σ(v_0 +
x^v V_1 V_2))``); the first layer sets ``v_first = v`` and has no value LoRA. A mixer is one layer and
receives no ``v_first``, so every layer here is a first layer: ``v_first = v``, no value LoRA.

Bidirectional mode (``causal=False``): the same recurrence runs on the row and on the reversed row (the same
r, w, k̃, v, κ, a, flipped; ``_layer_common.both_ways``), both reading after writing, and token t's own write, counted
by both, is subtracted once:

    o_t = r_tᵀ S^f_t + r_tᵀ S^b_t − (r_t · k̃_t) v_t,   S^b_t = (diag(w_t) − (κ_t ⊙ a_t) κ_tᵀ) S^b_{t+1} + k̃_t v_tᵀ

i.e. o_t = r_tᵀ (T_t S^f_{t−1} + T_t S^b_{t+1} + k̃_t v_tᵀ) with T_t token t's transition: each direction is
RWKV-7 itself (every token's erase comes just before its own write, in reading order), the mirror image of
the other (LION's "forward + backward − diagonal", Afzal et al. 2025, with RWKV-7's transitions), and the
bonus is added once. This is two causal calls of the engine, not the engine's own ``causal=False``, whose
backward pass gives token t the next token's decay but its own a, b.

Token shift: the previous REAL token (padded positions are skipped: zero before the first real token), and
in bidirectional mode the channel split of ``_layer_common.token_shift`` (in each block of K channels the first
⌈K/2⌉ from the previous real token, the rest from the next real token: Vision-RWKV's q-shift on one axis).

Heads (as ``_layer_common.rwkv_heads``): ``K = head_dim`` (64, RWKV-LM ``head_size``) when it divides d_model,
otherwise ``H = max(1, D // head_dim)`` lowered until it divides D and K = D / H.

Defaults and initialisation (``BlinkDL/RWKV-LM`` at 524481d, ``RWKV-v7/train_temp/src/model.py`` ``RWKV_Tmix_x070``
and ``generate_init_weight``; fla ``fla/layers/rwkv7.py`` ``RWKV7Attention`` for the layer structure and
the same inits), as layer 0 of a one-layer model (``ratio_0_to_1 = 0``, ``ratio_1_to_almost0 = 1``;
``ddd_i = i / D``, ``linear_n = n / (D − 1) − 0.5``, ``zigzag_n = z |z|`` with
``z = ((n mod K) − (K − 1)/2) / ((K − 1)/2)``):

- ``x_r, x_g`` = 1 − ddd^0.2; ``x_w, x_a`` = 1 − ddd^0.9; ``x_k, x_v`` = 1 − ddd^0.7.
- ``w0 = −6 + 6 (n / (D − 1))^(1 + ratio_0_to_1^0.3) + 0.5 + 2.5 zigzag``; ``w1`` [D, Q_w] zero in the
  original (differences); ``w2`` [Q_w, D] orthogonal with gain 0.1·max(1, √(Q_w / D)) (``ortho_init``).
- ``a0 = −0.19 + 0.3 zigzag + 0.4 linear``; ``a1`` zero in the original (differences); ``a2`` as w2.
- ``g1`` [D, Q_g] zero in the original (differences); ``g2`` [Q_g, D] as w2.
- ``k_k = 0.71 − 0.1 linear``; ``k_a = 1.02``; ``r_k = −0.04`` [H, K].
- LoRA ranks: ``Q_w = Q_a = max(32, round(2.5 √D / 32)·32)``, ``Q_g = max(32, round(5 √D / 32)·32)``.
- ``receptance``, ``value``: orthogonal, gain 1; ``key``: orthogonal, gain 0.1 (``generate_init_weight``;
  fla ``_orthogonal_init``).
- ``ln_x``: GroupNorm(H groups), eps = K·1e-5 (RWKV-LM 64e-5 at K = 64; fla ``head_dim·norm_eps``); weight
  ((1 + layer_id) / n_layer)^0.7 = 1, bias 0.
- l2norm: κ = u / max(‖u‖, 1e-12) (``F.normalize``).

Differences from the original:

- Zero initialisations that would leave a parameter without gradient at initialisation (the project's
  contract): ``output`` (zero in RWKV-LM and fla) is drawn as fla's ``RWKV6Attention`` draws ``o_proj``
  (xavier_uniform, gain 2^−2.5); ``w1``, ``a1`` and ``g1`` (zero) are drawn from U(−1e-4, 1e-4) (Vision-RWKV-6's
  choice for its LoRA first layers; a zero g1 would leave ``x_g`` without gradient).
- No value residual (above): every layer is a first layer, so there is no v0/v1/v2.
- Every layer is initialised as layer 0 of a one-layer RWKV (the mixer does not know its depth).
- LoRA ranks follow RWKV-LM's formula in D; fla multiplies the decay/a/v ranks by K/64 (equal at K = 64).
- Padding: the shift skips padded positions, the engine leaves the state unchanged at them in both
  directions, outputs at padded positions are zero. RWKV-LM has no padding; fla zeroes padded inputs and
  values (left padding) but shifts through them.
- Bidirectional mode (``causal=False``, the LRA default) is not in RWKV-LM or fla (above).
- Heads are derived from d_model (above); RWKV-LM's kernels are built for K = 64.
- RWKV-LM's optimizer groups (``att.w0`` at 2× the learning rate with ``layerwise_lr``) are not reproduced.
- ``config.dropout_rate`` is applied to the layer's output (the original's time-mix has no dropout).
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

from attention_zoo.mixers._layer_common import (RWKVStateSize, both_ways, check_mode, finish, group_norm, layer_input,
                                                ramp, rwkv_heads, rwkv_linear, rwkv_receptance_key_value, token_shift,
                                                uniform, xavier_uniform_fla)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class RWKV7Config(RWKVStateSize, MixerConfig):
  """RWKV-7 time-mix options (module docstring; defaults of RWKV-LM ``RWKV_Tmix_x070``).

  Attributes:
    head_dim: K, the key/value dim per head when it divides d_model (RWKV-LM ``head_size``).
    decay_low_rank_dim, a_low_rank_dim, gate_low_rank_dim: the LoRA ranks; None = RWKV-LM's formula in D.
    norm_eps: the per-head GroupNorm's epsilon; None = K·1e-5 (64e-5 at K = 64).
    mode: "chunk" (the engine's chunked-parallel form) or "recurrent" (its token-by-token scan).
    chunk_size: the engine's chunk length in "chunk" mode.
  """

  head_dim: int = 64
  decay_low_rank_dim: int | None = None
  a_low_rank_dim: int | None = None
  gate_low_rank_dim: int | None = None
  norm_eps: float | None = None
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "RWKV-7"
  family: ClassVar[str] = "linear-recurrent"

  def ranks(self, d_model: int) -> tuple[int, int, int]:
    """(Q_w, Q_a, Q_g): the configured ranks, or RWKV-LM's max(32, round(c·√D / 32)·32), c = 2.5, 2.5, 5."""
    suggest = lambda c: max(32, int(round(c * d_model**0.5 / 32) * 32))
    pick = lambda given, c: suggest(c) if given is None else given
    return (pick(self.decay_low_rank_dim, 2.5), pick(self.a_low_rank_dim, 2.5), pick(self.gate_low_rank_dim, 5.0))


def channel_ramps(d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
  """(linear, zigzag) [D]: n / (D − 1) − 0.5 and z|z| with z = ((n mod K) − (K − 1)/2) / ((K − 1)/2)."""
  n = np.arange(d, dtype=np.float64)
  linear = n / max(d - 1, 1) - 0.5
  half = max((k - 1) / 2, 0.5)
  z = ((n % k) - (k - 1) / 2) / half
  return linear, z * np.abs(z)


def constant_init(values):
  """An initializer returning ``values`` (a numpy array of the parameter's shape)."""
  def init(_key, shape, dtype=jnp.float32):
    return jnp.asarray(np.broadcast_to(values, shape), dtype)
  return init


def lora_out_init(key, shape, dtype=jnp.float32):
  """RWKV-LM ``ortho_init(x, 0.1)`` of a [Q, D] LoRA output: orthogonal, gain 0.1·√(Q/D) when Q > D, else 0.1."""
  gain = math.sqrt(shape[0] / shape[1]) if shape[0] > shape[1] else 1.0
  return nn.initializers.orthogonal(0.1 * gain)(key, shape, dtype)


def l2norm(z, eps=1e-12):
  """z / max(‖z‖, eps) over the last axis (``F.normalize``; finite gradient at z = 0)."""
  return z * jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(z), axis=-1, keepdims=True), eps**2))


@register_mixer("rwkv7", RWKV7Config)
class RWKV7(nn.Module):
  """RWKV-7 time mixing (module docstring): x [B, L, D], mask [B, L] -> [B, L, D]."""

  config: RWKV7Config

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    check_mode("rwkv7", cfg.mode)
    b, length, d = x.shape
    h, kd = rwkv_heads(d, cfg.head_dim)
    q_w, q_a, q_g = cfg.ranks(d)
    eps = kd * 1e-5 if cfg.norm_eps is None else cfg.norm_eps
    real, mask, xs = layer_input(x, mask)

    p = lambda name, init, shape: self.param(name, init, shape).astype(real)
    ddd = ramp(d)
    linear, zigzag = channel_ramps(d, kd)
    lerp = lambda power: constant_init(1.0 - ddd**power)
    mu = jnp.stack([p("x_r", lerp(0.2), (d,)), p("x_w", lerp(0.9), (d,)), p("x_k", lerp(0.7), (d,)),
                    p("x_v", lerp(0.7), (d,)), p("x_a", lerp(0.9), (d,)), p("x_g", lerp(0.2), (d,))])
    www = -6 + 6 * (np.arange(d) / max(d - 1, 1)) ** 1.0  # exponent 1 + ratio_0_to_1^0.3, ratio 0
    w0 = p("w0", constant_init(www + 0.5 + zigzag * 2.5), (d,))
    w1 = p("w1", uniform(1e-4), (d, q_w))
    w2 = p("w2", lora_out_init, (q_w, d))
    a0 = p("a0", constant_init(-0.19 + zigzag * 0.3 + linear * 0.4), (d,))
    a1 = p("a1", uniform(1e-4), (d, q_a))
    a2 = p("a2", lora_out_init, (q_a, d))
    g1 = p("g1", uniform(1e-4), (d, q_g))
    g2 = p("g2", lora_out_init, (q_g, d))
    k_k = p("k_k", constant_init(0.71 - linear * 0.1), (d,))
    k_a = p("k_a", constant_init(np.full(d, 1.02)), (d,))
    r_k = p("r_k", constant_init(np.full((h, kd), -0.04)), (h, kd))
    ln_scale = p("ln_x_scale", nn.initializers.ones, (d,))
    ln_bias = p("ln_x_bias", nn.initializers.zeros, (d,))

    delta = token_shift(xs, mask, cfg.causal, kd) - xs                                  # Δ [B, L, D]
    xr, xw, xk, xv, xa, xg = jnp.unstack(xs[:, :, None] + delta[:, :, None] * mu, axis=2)

    r, k, v = rwkv_receptance_key_value(xr, xk, xv, h, real)                          # [B, L, H, K]
    split = lambda z: z.reshape(b, length, h, kd)  # [B, L, D] -> [B, L, H, K]
    down = lambda z, m: jnp.einsum("bld,dq->blq", z, m)  # LoRA in:  [B, L, D] -> [B, L, Q]
    up = lambda z, m: jnp.einsum("blq,qd->bld", z, m)    # LoRA out: [B, L, Q] -> [B, L, D]
    log_w = split(-math.exp(-0.5) * jax.nn.sigmoid(w0 + up(jnp.tanh(down(xw, w1)), w2)))  # log w [B, L, H, K]
    a = split(jax.nn.sigmoid(a0 + up(down(xa, a1), a2)))                              # [B, L, H, K]
    g = up(jax.nn.sigmoid(down(xg, g1)), g2)                                          # [B, L, D]
    kappa = l2norm(k * k_k.reshape(h, kd))                                            # κ [B, L, H, K]
    k = k * (1 + (a - 1) * k_a.reshape(h, kd))                                        # k̃

    o = both_ways(cfg, mask, "after", q=r, k=k, v=v, log_decay=log_w, a=kappa * a, b=-kappa)  # [B, L, H, V]
    if not cfg.causal:  # token t's own write is in both passes
      o = o - jnp.einsum("blhk,blhk->blh", r, k)[..., None] * v
    o = jnp.where(mask[..., None, None], o, 0)
    bonus = jnp.einsum("blhk,blhk,hk->blh", r, k, r_k)[..., None] * v                # [B, L, H, V]
    o = group_norm(o, ln_scale, ln_bias, eps) + bonus.reshape(b, length, d)
    y = rwkv_linear("output", xavier_uniform_fla, o * g, real)
    return finish(y, mask, x.dtype, cfg.dropout_rate, deterministic)
