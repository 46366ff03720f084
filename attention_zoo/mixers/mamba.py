"""Mamba (Gu & Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", 2023): the Mamba
block of ``state-spaces/mamba`` ``mamba_ssm/modules/mamba_simple.py`` (``Mamba``) with its S6 selective
scan, a diagonal SSM whose step Δ and input / output maps B, C are functions of the token.

Axis legend: ``B`` batch, ``L`` length, ``D`` features (d_model), ``E`` inner width (``expand·D``),
``N`` state size per channel (``d_state``), ``R`` rank of the Δ projection (``dt_rank``), ``W`` width
of the short convolution (``d_conv``), ``T`` chunk length (``chunk_size``).

Equations (one direction; input ``x [B, L, D]``)::

    [u; z]   = in_proj(x)                                     u, z [B, L, E]
    u'_t     = SiLU(b_conv + Σ_k w_conv[k] ⊙ u_{t−(W−1)+k})   depthwise causal conv over the real tokens
    [δ; B; C]_t = x_proj(u'_t)                                δ [R], B_t [N], C_t [N]
    Δ_t      = softplus(dt_proj(δ_t))                         [E]   (dt_proj has the Δ bias)
    A        = −exp(A_log)                                    [E, N]
    h_t      = exp(Δ_t A) ⊙ h_{t−1} + (Δ_t ⊙ u'_t) B_tᵀ       [E, N], h_{−1} = 0
    y_t      = h_t C_t + D ⊙ u'_t                             [E]
    out      = drop(out_proj(y ⊙ SiLU(z)))                    [B, L, D]

``selective_scan_ref`` (``mamba_ssm/ops/selective_scan_interface.py``) is the token-by-token reference
of h_t and y_t; the tests transcribe it. Two evaluations of the scan, the same numbers (float64 ≤ 1e-12):

- ``mode="chunk"`` (the training default): the length is cut into chunks of ``chunk_size`` positions
  (the last one filled with identity steps Δ = 0); inside a chunk ``jax.lax.associative_scan`` with
  (a_i, b_i) ∘ (a_j, b_j) = (a_j a_i, a_j b_i + b_j) gives every state [B, T, E, N] (O(log T) depth), and
  a ``jax.lax.scan`` over the chunks carries h [B, E, N] from one chunk to the next. Each chunk is
  rematerialised in the backward pass (``jax.checkpoint``), so the [B, L, E, N] states are never stored
  whole. ``chunk_size ≥ L`` is one associative scan over the whole length.
- ``mode="recurrent"``: ``jax.lax.scan`` token by token (the reference).

Bidirectional (``bidirectional=True``, the default, ignored under ``causal``): Vision Mamba's "v2"
bidirectional block (``hustvl/Vim`` ``mamba-1p1p1/mamba_ssm/modules/mamba_simple.py``, ``bimamba_type="v2"``):
the backward direction shares ``in_proj`` (so u and z) and ``out_proj`` and has its own ``conv1d_b``,
``x_proj_b``, ``dt_proj_b``, ``A_b_log`` and ``D_b``; it runs on the reversed sequence, and the two
directions' gated outputs are summed before ``out_proj``: ``out = out_proj((y^f + y^b) ⊙ SiLU(z))``
(Vim's ``if_devide_out=False``: no halving). Caduceus' ``BiMambaWrapper`` (``kuleshov-group/caduceus``
``caduceus/modeling_caduceus.py``, its defaults ``bidirectional_strategy="add"``,
``bidirectional_weight_tie=True``: two Mamba blocks with tied in/out projections, outputs added) computes
the same function. Hydra (goombalab/hydra) is a bidirectional Mamba-2 (a quasiseparable mixer), not this
block. Here the reverse branch runs in place: its convolution looks ahead (``u_{t+(W−1)−k}``) and its
scan runs from the last real token to the first, which equals Vim's flip / scan / flip on the real tokens.

Defaults and initialisation from state-spaces/mamba (read at e9594ce) ``mamba_ssm/modules/mamba_simple.py``
(``Mamba.__init__``):

- ``d_state`` 16, ``d_conv`` 4, ``expand`` 2, ``dt_rank`` "auto" = ⌈D/16⌉ (``dt_rank=None`` here),
  ``dt_min`` 1e-3, ``dt_max`` 0.1, ``dt_init`` "random", ``dt_scale`` 1, ``dt_init_floor`` 1e-4,
  ``conv_bias`` True, ``bias`` False (no bias in ``in_proj`` / ``out_proj``; ``x_proj`` never has one,
  ``dt_proj`` always has one).
- ``dt_proj`` weight ~ U[−σ, σ], σ = dt_scale·R^−½ ("random"; ``"constant"``: every entry σ).
- Δ bias: dt = exp(v (log dt_max − log dt_min) + log dt_min), v ~ U[0, 1), clamped to ≥ dt_init_floor;
  bias = dt + log(−expm1(−dt)) (the inverse of softplus), so softplus(bias) ∈ [dt_min, dt_max].
- ``A_log[e, n] = log(n + 1)`` (S4D-real: A = −(1, 2, …, N) in every channel), ``D = 1``.
- Every other weight as PyTorch's default for ``nn.Linear`` / ``nn.Conv1d``: U[−1/√fan_in, 1/√fan_in]
  (``in_proj`` fan_in D, ``x_proj`` and ``out_proj`` E, the depthwise conv W, its bias too).
- ``A_log`` and ``D`` are the original's ``_no_weight_decay`` parameters; here they are ``ssm_A_log``,
  ``ssm_D`` (``ssm_A_b_log``, ``ssm_D_b``), the harness's SSM group (``lra_bench.training.optim``):
  a recipe that sets ``ssm_learning_rate`` to the main rate and ``ssm_weight_decay`` 0 reproduces the
  original's split exactly.

Padding (mask False): the row is packed first — its real tokens moved, in order, to the front
(``_layer_common.pack_rows``), the padding behind them — and unpacked at the end, so padding anywhere in the row
(the tail or the middle) acts as if it were not there:

- the convolution input u is zeroed at the padded slots, so the causal convolution of a real token
  reads the W−1 previous *real* tokens (zeros before the first), and the reverse one the W−1 next real
  tokens (zeros after the last): exactly the window of the row with its padding removed;
- Δ = 0 at padded slots: exp(0·A) = 1 and Δ u B = 0, the state passes unchanged (no decay, no write)
  in both directions;
- outputs at padded positions are zero.

Differences from the original:

- Padding is handled (above); the original has no mask (mamba #49: "pad on the right") and its
  convolution and scan run through whatever the padded positions hold.
- Bidirectional option (above, Vim v2 / Caduceus "add"); the original is causal only.
- Dropout: the original has none; ``config.dropout_rate`` is applied to the block's output only.
- No language-model re-initialisation: ``mamba_ssm/models/mixer_seq_simple.py`` ``_init_weights`` rescales
  ``out_proj``'s weight by 1/√n_layer and zeroes the Linear biases other than Δ's (none exist at the
  defaults); the mixer does not know the depth and keeps the module's own initialisation.
- The computation runs in float32 (float64 for float64 input; parameters are created in that dtype),
  the output is cast to the input's dtype; the original's fused CUDA kernels (``mamba_inner_fn``,
  ``causal_conv1d_fn``) are replaced by the two scans above, which compute the same function.
- Parameters are flat and stored input-major: ``in_proj_kernel`` [D, 2E], ``x_proj_kernel`` [E, R + 2N],
  ``dt_proj_kernel`` [R, E], ``dt_proj_bias`` [E], ``out_proj_kernel`` [E, D] (PyTorch's ``weight`` is
  [out, in]); ``conv1d_weight`` [W, E] (PyTorch [E, 1, W]; ``conv1d_weight[k]`` multiplies the token
  W−1−k steps back, as ``conv1d(x)[..., :L]`` with padding W−1), ``conv1d_bias`` [E]; ``ssm_A_log``
  [E, N], ``ssm_D`` [E]. The reverse direction's copies carry ``_b`` (``conv1d_b_weight``,
  ``x_proj_b_kernel``, ``dt_proj_b_kernel``, ``dt_proj_b_bias``, ``ssm_A_b_log``, ``ssm_D_b``).
- The inference cache (``step``, ``allocate_inference_cache``) is not implemented: the causal form is
  evaluated over whole sequences.

State for causal generation (``state_size``): h [E, N] plus the W−1 previous convolution inputs [E],
E·(N + W − 1) per layer.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers._layer_common import (MODES, check_mode, compute_dtype, default_mask, dt_bias_init, finish,
                                                pack, short_conv, uniform, unpack)
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class MambaConfig(MixerConfig):
  """Mamba block options (defaults: ``mamba_ssm/modules/mamba_simple.py`` ``Mamba``).

  Attributes:
    d_state: N, the states per inner channel.
    d_conv: W, the width of the depthwise causal convolution.
    expand: E = expand·d_model inner channels.
    dt_rank: R, the rank of the Δ projection; None = ⌈d_model/16⌉ (the original's "auto").
    dt_min, dt_max: the range of softplus(Δ bias) at initialisation (log-uniform).
    dt_init: "random" (dt_proj weight ~ U[−σ, σ]) or "constant" (every entry σ), σ = dt_scale·R^−½.
    dt_scale: the factor of σ.
    dt_init_floor: the smallest initial Δ.
    conv_bias: the convolution has a bias.
    bias: in_proj and out_proj have biases.
    bidirectional: add the reverse direction (Vim v2; ignored when ``causal``).
    mode: "chunk" (associative scan per chunk, training default) or "recurrent" (token by token).
    chunk_size: T, the positions of one associative scan in "chunk" mode.
  """

  d_state: int = 16
  d_conv: int = 4
  expand: int = 2
  dt_rank: int | None = None
  dt_min: float = 1e-3
  dt_max: float = 1e-1
  dt_init: str = "random"
  dt_scale: float = 1.0
  dt_init_floor: float = 1e-4
  conv_bias: bool = True
  bias: bool = False
  bidirectional: bool = True
  mode: str = "chunk"
  chunk_size: int = 64

  paper_name: ClassVar[str | None] = "Mamba"
  family: ClassVar[str] = "ssm"

  def inner_width(self, d_model: int) -> int:
    """E = int(expand·d_model)."""
    return int(self.expand * d_model)

  def rank(self, d_model: int) -> int:
    """R = dt_rank, or ⌈d_model/16⌉ when None."""
    return self.dt_rank if self.dt_rank is not None else math.ceil(d_model / 16)

  def state_size(self, length: int, d_model: int) -> int:
    """expand·d_model·(d_state + d_conv − 1): the scan state h [E, N] and the d_conv − 1 previous
    convolution inputs of the E channels (the forward direction: the causal form).

    Independent of the length. Zoology counts 2·d_model·d_state for its Mamba (the scan state only)."""
    del length
    return self.inner_width(d_model) * (self.d_state + self.d_conv - 1)


def _combine(left, right):
  a_i, b_i = left
  a_j, b_j = right
  return a_j * a_i, a_j * b_i + b_j


def _chunk_scan(u, delta, a, b, c, reverse, chunk_size):
  """y [B, L, E] (no D term) by associative scans over chunks of ``chunk_size``, h carried across chunks."""
  batch, length, e = u.shape
  n = a.shape[-1]
  t = max(1, min(chunk_size, length))
  pad = -length % t
  if pad:  # Δ = 0 steps: decay 1, write 0, states unchanged
    u, delta, b, c = (jnp.pad(z, ((0, 0), (0, pad), (0, 0))) for z in (u, delta, b, c))
  chunks = (length + pad) // t

  def split(z):  # [B, L, X] -> [chunks, B, T, X]
    return jnp.swapaxes(z.reshape(batch, chunks, t, z.shape[-1]), 0, 1)

  @jax.checkpoint
  def body(h, inputs):
    u_c, delta_c, b_c, c_c = inputs
    decay = jnp.exp(jnp.einsum("bte,en->bten", delta_c, a))
    write = jnp.einsum("bte,btn->bten", delta_c * u_c, b_c)
    decay_prod, states = jax.lax.associative_scan(_combine, (decay, write), axis=1, reverse=reverse)
    states = states + decay_prod * h[:, None]
    y = jnp.einsum("bten,btn->bte", states, c_c)
    return (states[:, 0] if reverse else states[:, -1]), y

  h0 = jnp.zeros((batch, e, n), u.dtype)
  _, ys = jax.lax.scan(body, h0, tuple(split(z) for z in (u, delta, b, c)), reverse=reverse)
  return jnp.swapaxes(ys, 0, 1).reshape(batch, chunks * t, e)[:, :length]


def _recurrent_scan(u, delta, a, b, c, reverse):
  """y [B, L, E] (no D term) token by token (``jax.lax.scan``)."""
  batch, _, e = u.shape

  def step(h, inputs):
    u_t, delta_t, b_t, c_t = inputs
    h = jnp.exp(jnp.einsum("be,en->ben", delta_t, a)) * h + jnp.einsum("be,bn->ben", delta_t * u_t, b_t)
    return h, jnp.einsum("ben,bn->be", h, c_t)

  h0 = jnp.zeros((batch, e, a.shape[-1]), u.dtype)
  _, ys = jax.lax.scan(step, h0, tuple(jnp.swapaxes(z, 0, 1) for z in (u, delta, b, c)), reverse=reverse)
  return jnp.swapaxes(ys, 0, 1)


def selective_scan(u, delta, a, b, c, reverse=False, mode="chunk", chunk_size=64):
  """The S6 scan without its D term: y_t = h_t C_t, h_t = exp(Δ_t A) ⊙ h_{t∓1} + (Δ_t ⊙ u_t) B_tᵀ, h = 0
  before the first step.

  Args:
    u: [B, L, E] inputs. delta: [B, L, E] steps Δ (0 = identity step). a: [E, N] (A, negative).
    b, c: [B, L, N] the input and output maps.
    reverse: run from the last position to the first.
    mode: "chunk" (associative scan per chunk) or "recurrent" (``jax.lax.scan``).
    chunk_size: T in "chunk" mode.
  Returns:
    [B, L, E].
  """
  if mode == "chunk":
    return _chunk_scan(u, delta, a, b, c, reverse, chunk_size)
  if mode == "recurrent":
    return _recurrent_scan(u, delta, a, b, c, reverse)
  raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")


def torch_uniform(key, shape, dtype=jnp.float32):
  """PyTorch's default ``nn.Linear`` / ``nn.Conv1d`` weight init of a kernel whose first axis is the fan-in
  (flax's [in, out] Dense kernel; the [W, E] depthwise kernel): U[−1/√fan_in, 1/√fan_in]
  (kaiming_uniform with a = √5). PyTorch draws the biases from the same range."""
  return uniform(shape[0] ** -0.5)(key, shape, dtype)


@functools.partial(jax.jit, static_argnames=("d_state", "dt_rank", "bidirectional", "mode", "chunk_size"))
def mamba_block(p, x, mask, *, d_state, dt_rank, bidirectional, mode="chunk", chunk_size=64):
  """The Mamba block (module docstring) on x [B, L, D] with mask bool [B, L], from the parameters ``p``
  (the names :class:`Mamba` declares; the ``_b`` ones for the reverse direction, biases optional).

  Returns [B, L, D], zero at padded positions (before the module's dropout).
  """
  xp, packed, dest = pack(x, mask)                                  # real tokens first, padding behind
  keep = packed[..., None]
  xz = jnp.einsum("bld,df->blf", xp, p["in_proj_kernel"]) + p.get("in_proj_bias", 0)
  u, z = jnp.split(xz, 2, axis=-1)                                  # [B, L, E] each
  u = jnp.where(keep, u, 0)                                         # the convolutions read no padded slot

  def direction(suffix, reverse):
    """y [B, L, E] of one direction, D term included."""
    uc = nn.silu(short_conv(u, p[f"conv1d{suffix}_weight"], p.get(f"conv1d{suffix}_bias"), reverse=reverse))
    dt, b, c = jnp.split(jnp.einsum("ble,ef->blf", uc, p[f"x_proj{suffix}_kernel"]),
                         [dt_rank, dt_rank + d_state], axis=-1)       # [B, L, R], [B, L, N], [B, L, N]
    delta = jax.nn.softplus(jnp.einsum("blr,re->ble", dt, p[f"dt_proj{suffix}_kernel"]) + p[f"dt_proj{suffix}_bias"])
    delta = jnp.where(keep, delta, 0)                               # padded slots: exp(0·A) = 1, no write
    a = -jnp.exp(p[f"ssm_A{suffix}_log"])                            # [E, N]
    y = selective_scan(uc, delta, a, b, c, reverse=reverse, mode=mode, chunk_size=chunk_size)
    return y + p[f"ssm_D{suffix}"] * uc

  y = direction("", False)
  if bidirectional:
    y = y + direction("_b", True)
  out = jnp.einsum("ble,ed->bld", y * nn.silu(z), p["out_proj_kernel"]) + p.get("out_proj_bias", 0)
  return unpack(out, dest, mask)


@register_mixer("mamba", MambaConfig)
class Mamba(nn.Module):
  """The Mamba block (module docstring): in_proj → conv → SiLU → S6 scan (+ reverse) → ⊙ SiLU(z) →
  out_proj → dropout. The parameters are declared here, the computation is :func:`mamba_block`."""

  config: MambaConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    check_mode("mamba", cfg.mode)
    if cfg.dt_init not in ("random", "constant"):
      raise ValueError(f"unknown dt_init {cfg.dt_init!r}; expected 'random' or 'constant'")
    d_model = x.shape[-1]
    e, n, r, w = cfg.inner_width(d_model), cfg.d_state, cfg.rank(d_model), cfg.d_conv
    real = compute_dtype(x)
    p = {}

    def param(name, init, shape):
      p[name] = self.param(name, init, shape, real)

    param("in_proj_kernel", torch_uniform, (d_model, 2 * e))
    if cfg.bias:
      param("in_proj_bias", uniform(d_model ** -0.5), (2 * e,))
    bidirectional = cfg.bidirectional and not cfg.causal
    sigma = cfg.dt_scale * r ** -0.5
    for suffix in ("", "_b") if bidirectional else ("",):
      param(f"conv1d{suffix}_weight", torch_uniform, (w, e))
      if cfg.conv_bias:
        param(f"conv1d{suffix}_bias", uniform(w ** -0.5), (e,))
      param(f"x_proj{suffix}_kernel", torch_uniform, (e, r + 2 * n))
      param(f"dt_proj{suffix}_kernel", uniform(sigma) if cfg.dt_init == "random" else nn.initializers.constant(sigma),
            (r, e))
      param(f"dt_proj{suffix}_bias", dt_bias_init(cfg.dt_min, cfg.dt_max, cfg.dt_init_floor), (e,))
      param(f"ssm_A{suffix}_log", lambda _key, shape, dtype: jnp.broadcast_to(
          jnp.log(jnp.arange(1, n + 1, dtype=dtype)), shape), (e, n))
      param(f"ssm_D{suffix}", nn.initializers.ones, (e,))
    param("out_proj_kernel", torch_uniform, (e, d_model))
    if cfg.bias:
      param("out_proj_bias", uniform(e ** -0.5), (d_model,))
    mask = default_mask(x, mask)
    out = mamba_block(p, x.astype(real), mask, d_state=n, dt_rank=r, bidirectional=bidirectional,
                      mode=cfg.mode, chunk_size=cfg.chunk_size)
    return finish(out, mask, x.dtype, cfg.dropout_rate, deterministic)
