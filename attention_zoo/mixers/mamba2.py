"""Mamba-2 (Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State
Space Duality", ICML 2024): a selective SSM whose transition is a data-dependent scalar per head (SSD), with a
short causal convolution over (x, B, C), a D skip and a gated RMSNorm.

Axis legend: ``B`` batch, ``L`` length, ``D`` d_model, ``E`` d_inner = expand·D, ``H`` heads, ``P`` head dim
(E = H·P), ``N`` d_state, ``G`` groups (ngroups) sharing B and C, ``W`` the convolution width (d_conv),
``C`` conv channels = E + 2·G·N.

Equations (one layer, input ``u [B, L, D]``; per head the state ``S_t [N, P]``)::

    [z, xBC, dt~] = W_in u_t                                 [B, L, E], [B, L, C], [B, L, H]
    xBC_t = silu(Σ_{j<W} w_j ⊙ xBC_{t−W+1+j} + b_conv)       depthwise causal conv (over real tokens, below)
    [x, B, C] = xBC                                          [B, L, H, P], [B, L, G, N], [B, L, G, N]
    Δ_t = softplus(dt~_t + dt_bias)                          [B, L, H]
    A = −exp(A_log)                                          [H]
    S_t = exp(Δ_t A) S_{t-1} + (Δ_t B_t) x_t^T               (B_t, C_t of head h's group)
    y_t = S_t^T C_t + D ⊙ x_t                                [B, L, H, P]
    out_t = W_out (RMSNorm_group(y_t ⊙ silu(z_t)) ⊙ w_norm)  [B, L, D]   (norm_before_gate=False)

In the engine's terms (``attention_zoo.mixers._linear_recurrence.linear_recurrence``, decay kind
"data-dependent scalar"): q = C, k = Δ·B, v = x, log_decay = Δ·A; no query scale. ``mode="chunk"`` is its
chunked-parallel (SSD-style) form, ``mode="recurrent"`` its token-by-token scan. Computed in float32 (float64
for float64 inputs); the output is cast back to the input's dtype.

Short convolution over padded rows: the convolution reads, for each real token, the W − 1 previous REAL tokens of
its row (fewer at the row's start, zeros before it): the real tokens are packed to the front of the row in order
(a stable gather), convolved causally, and each real position takes the output of its packed index. So padding
anywhere (the end or inside a row) neither enters nor shifts any real token's window: removing the padded positions
gives the same outputs at the real positions. Padded positions' outputs are 0.

Defaults and initialisation, from state-spaces/mamba (read at e9594ce):

- ``mamba_ssm/modules/mamba2_simple.py`` ``Mamba2Simple`` and ``mamba_ssm/modules/mamba2.py`` ``Mamba2``: d_conv 4,
  expand 2, ngroups 1, A_init_range (1, 16) with A_log = log A, dt_min 1e-3, dt_max 0.1, dt_init_floor 1e-4
  (Δ0 = exp(U[log dt_min, log dt_max]) clamped to the floor, dt_bias = Δ0 + log(−expm1(−Δ0)), the inverse
  softplus), dt_limit (0, ∞) (no clamp), D = 1 per head, bias False (in_proj, out_proj), conv_bias True, conv_init
  None (PyTorch's Conv1d init), the in_proj order [z, x, B, C, dt], activation silu, ``RMSNormGated(E, eps=1e-5,
  norm_before_gate=False, group_size=E/ngroups)``: rmsnorm(y ⊙ silu(z)) ⊙ weight over groups of E/G channels.
  headdim 64 (``Mamba2``; ``Mamba2Simple`` has 128). d_state: ``Mamba2Simple`` 64, ``Mamba2`` 128; 64 here.
- PyTorch's default inits, as the layer keeps them (``mixer_seq_simple._init_weights`` only zeroes Linear biases,
  and there are none): in_proj / out_proj weights U(±1/√fan_in); conv weight and bias U(±1/√W) (fan_in = W for a
  depthwise conv); the norm weight 1.
- ``mamba_ssm/modules/ssd_minimal.py`` ``ssd_minimal_discrete`` and ``Mamba2.step``: the references the tests
  transcribe (the chunked SSD form and the token-by-token step).

Widths: headdim is a maximum: P = the largest divisor of E that is <= headdim (E = 32 at d_model 16 -> P 32,
one head; 64 -> E 128, P 64, 2 heads; 128 -> 4 heads; 512 -> 16 heads), and ngroups must divide H. d_state 64
at every width: the Mamba2Simple default (``Mamba2``'s 128 is for large widths); the Mamba-2 paper's MQAR runs use
N = 64 and above at model widths 64 to 256. The SSM state is then E·N = 128·D floats per layer, independent of the
width's head split; set ``d_state`` smaller for iso-state comparisons.

Bidirectional (``causal=False``, the LRA default): the engine's two passes over the same q, k, v, decays: a
forward pass reading S_t and a backward pass over the reversed sequence reading before its write, so token t is
counted once; D ⊙ x is added once; the convolution stays causal (over the previous real tokens).

Differences from the original:

- The bidirectional form (above) is not in mamba_ssm (causal only; Hydra and Bi-Mamba2 are separate models
  with their own parameters for the second direction); ``causal=True`` is the original layer.
- Padding: a padded position (mask False) neither decays nor writes the state in either direction and its output
  is 0; the convolution skips padded positions (above). mamba_ssm has no token mask (``seq_idx`` / ``cu_seqlens``
  varlen runs restart per sequence, which is what a padded tail gives here).
- headdim is a maximum (derived to divide, above); mamba_ssm asserts divisibility.
- The GPT-2 style rescaling of out_proj in ``mixer_seq_simple._init_weights`` (kaiming uniform / √n_layer) is a
  model-level choice and left out (this mixer does not know the depth).
- Dropout: the original has none; ``config.dropout_rate`` is applied to the layer's output only.
- Left out: ``d_ssm`` (partial SSM with a gated MLP), ``D_has_hdim``, ``rmsnorm=False``, ``norm_before_gate=True``,
  ``learnable_init_states``, ``dt_limit`` clamping, ``conv_init``.
- Parameter names: ``ssm_A_log`` and ``ssm_dt_bias`` carry the harness's SSM prefix (their own learning rate and
  weight decay when ``optimizer.ssm_learning_rate`` is set; mamba_ssm excludes A_log, dt_bias and D from weight
  decay and otherwise trains them like the rest). Parameters are created in the compute dtype (float32; float64
  for float64 inputs).

State for causal generation (``state_size``): H·P·N = E·N floats for the SSM states plus (W − 1)·C for the
convolution's last W − 1 inputs (mamba_ssm's cache allocates W columns, the newest one being the current input).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers._layer_common import (check_mode, dt_bias_init, finish, largest_divisor, layer_input,
                                                log_uniform_init, recurrence, rms_normalize, short_conv_real, uniform)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class Mamba2Config(MixerConfig):
  """Mamba-2 options (defaults: mamba_ssm ``Mamba2Simple`` / ``Mamba2``; module docstring).

  Attributes:
    d_state: N, the SSM state per head channel.
    d_conv: W, the causal convolution's width.
    expand: E = expand·d_model.
    headdim: the most channels per head; the layer uses the largest divisor of E that is ≤ this.
    ngroups: G, groups of heads sharing B and C (must divide the head count).
    A_init_range: A ~ U[lo, hi] at init (A_log = log A, the transition is exp(−Δ·A)).
    dt_min, dt_max, dt_init_floor: Δ0 = max(exp(U[log dt_min, log dt_max]), floor); dt_bias = softplus⁻¹(Δ0).
    conv_bias: the convolution has a bias.
    norm_eps: the gated RMSNorm's epsilon.
    mode: "chunk" (chunked-parallel, training default) or "recurrent" (token-by-token scan, the reference).
    chunk_size: the chunk length of mode "chunk".
  """

  d_state: int = 64
  d_conv: int = 4
  expand: int = 2
  headdim: int = 64
  ngroups: int = 1
  A_init_range: tuple[float, float] = (1.0, 16.0)
  dt_min: float = 1e-3
  dt_max: float = 0.1
  dt_init_floor: float = 1e-4
  conv_bias: bool = True
  norm_eps: float = 1e-5
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "Mamba2"  # as the published recall tables spell it (Kimi Linear, Fig. 4)
  family: ClassVar[str] = "ssm"

  def __post_init__(self):
    object.__setattr__(self, "A_init_range", tuple(float(a) for a in self.A_init_range))  # a list from a CLI
    check_mode("Mamba2", self.mode)
    if min(self.d_state, self.d_conv, self.expand, self.headdim, self.ngroups, self.chunk_size) < 1:
      raise ValueError("Mamba2: d_state, d_conv, expand, headdim, ngroups and chunk_size must be positive")
    lo, hi = self.A_init_range
    if not 0 < lo <= hi:
      raise ValueError(f"Mamba2: need 0 < A_init_range[0] <= A_init_range[1], got {self.A_init_range}")
    if not 0 < self.dt_min <= self.dt_max:
      raise ValueError(f"Mamba2: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")

  def dims(self, d_model: int) -> tuple[int, int, int]:
    """(E, H, P): inner width, heads and head dim at width ``d_model``."""
    d_inner = self.expand * d_model
    headdim = largest_divisor(d_inner, self.headdim)
    heads = d_inner // headdim
    if heads % self.ngroups:
      raise ValueError(f"Mamba2: ngroups ({self.ngroups}) must divide the head count ({heads}) at d_model "
                       f"{d_model}")
    return d_inner, heads, headdim

  def state_size(self, length: int, d_model: int) -> int:
    """E·N + (W − 1)·(E + 2·G·N): the SSM states (H heads of [N, P]) and the convolution's last W − 1 inputs.

    With the defaults at width D: 2D·64 + 3·(2D + 128)."""
    del length
    d_inner, _, _ = self.dims(d_model)
    return d_inner * self.d_state + (self.d_conv - 1) * (d_inner + 2 * self.ngroups * self.d_state)


@register_mixer("mamba2", Mamba2Config)
class Mamba2(nn.Module):
  """Mamba-2 (module docstring): x [B, L, D], mask [B, L] -> [B, L, D] in x's dtype."""

  config: Mamba2Config

  @nn.compact
  def __call__(self, x, mask=None, deterministic=True):
    cfg = self.config
    batch, length, d_model = x.shape
    d_inner, heads, headdim = cfg.dims(d_model)
    n, groups, width = cfg.d_state, cfg.ngroups, cfg.d_conv
    conv_dim = d_inner + 2 * groups * n
    dtype, mask, u = layer_input(x, mask)

    zxbcdt = nn.Dense(2 * d_inner + 2 * groups * n + heads, use_bias=False, dtype=dtype, param_dtype=dtype,
                      kernel_init=uniform(d_model ** -0.5), name="in_proj")(u)
    z, xbc, dt = jnp.split(zxbcdt, [d_inner, d_inner + conv_dim], axis=-1)
    kernel = self.param("conv1d_kernel", uniform(width ** -0.5), (width, conv_dim), dtype)
    bias = self.param("conv1d_bias", uniform(width ** -0.5), (conv_dim,), dtype) if cfg.conv_bias else None
    xbc = jax.nn.silu(short_conv_real(xbc, mask, kernel, bias))
    xs, b_in, c_in = jnp.split(xbc, [d_inner, d_inner + groups * n], axis=-1)
    xs = xs.reshape(batch, length, heads, headdim)
    per_group = heads // groups
    b_in = jnp.repeat(b_in.reshape(batch, length, groups, n), per_group, axis=2)          # [B, L, H, N]
    c_in = jnp.repeat(c_in.reshape(batch, length, groups, n), per_group, axis=2)          # [B, L, H, N]

    dt_bias = self.param("ssm_dt_bias", dt_bias_init(cfg.dt_min, cfg.dt_max, cfg.dt_init_floor), (heads,), dtype)
    a_log = self.param("ssm_A_log", log_uniform_init(*cfg.A_init_range), (heads,), dtype)
    d_skip = self.param("D", nn.initializers.ones, (heads,), dtype)
    delta = jax.nn.softplus(dt + dt_bias)                                                 # [B, L, H]
    log_decay = delta * -jnp.exp(a_log)                                                   # Δ·A [B, L, H]

    y = recurrence(cfg, c_in, b_in * delta[..., None], xs, mask, log_decay=log_decay)          # [B, L, H, P]
    y = y.astype(dtype) + d_skip[:, None] * xs
    y = y.reshape(batch, length, d_inner) * jax.nn.silu(z)
    y = rms_normalize(y.reshape(batch, length, groups, d_inner // groups), cfg.norm_eps)
    norm_weight = self.param("norm_weight", nn.initializers.ones, (d_inner,), dtype)
    y = y.reshape(batch, length, d_inner) * norm_weight
    out = nn.Dense(d_model, use_bias=False, dtype=dtype, param_dtype=dtype,
                   kernel_init=uniform(d_inner ** -0.5), name="out_proj")(y)
    return finish(out, mask, x.dtype, cfg.dropout_rate, deterministic)
