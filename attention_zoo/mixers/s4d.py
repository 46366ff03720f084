"""S4D: the diagonal structured state space model inside S4's layer wrapper.

Gu, Gupta, Goel, Ré, "On the Parameterization and Initialization of Diagonal State Space Models"
(NeurIPS 2022); the reference implementation is the ``state-spaces/s4`` repository (``models/s4/s4d.py``,
the minimal S4D layer; ``src/models/sequence/kernels/ssm.py`` ``SSMKernelDiag``, the full kernel;
``src/models/sequence/kernels/dplr.py`` and ``src/models/hippo/hippo.py``, the initialisations;
``src/models/sequence/kernels/fftconv.py`` ``FFTConv``, the bidirectional kernel;
``src/models/sequence/modules/s4block.py`` ``S4Block``, the wrapper).

Axes: B batch, L length, H channels (= d_model, one independent SSM per channel), N state size
(``d_state``; kept as N/2 complex modes n = 0..N/2-1 whose conjugates are implied), C kernel channels
(1, or 2 for the bidirectional kernel).

Per channel h (h omitted below), with Δ = exp(ssm_log_dt), A_n = -exp(ssm_log_A_re_n) + i·ssm_A_im_n,
B_n (ones, or ``ssm_B`` when trainable), C_n complex (a parameter per kernel channel):

  discretisation ("disc"):
    zoh:      Ā_n = exp(ΔA_n),                    B̄_n = B_n (exp(ΔA_n) − 1) / A_n
    bilinear: Ā_n = (1 + ΔA_n/2) / (1 − ΔA_n/2),  B̄_n = B_n Δ / (1 − ΔA_n/2)
  recurrence:  x_k = Ā x_{k−1} + B̄ u_k,  y_k = 2 Re(Σ_n C_n x_{k,n}) + D u_k
  kernel:      K_l = 2 Re Σ_n C_n B̄_n Ā_n^l        (l = 0..L−1, Vandermonde product, Ā^l = exp(l log Ā))
  convolution: y = irfft(rfft(u, 2L) · rfft(K, 2L))[:L] + D u   (equal to the recurrence)
  bidirectional (two C's give K0, K1):  K = concat(K0, flip(K1)) of length 2L, the same FFT; then
               y_i = Σ_{j≤i} K0_{i−j} u_j + Σ_{j>i} K1_{j−i−1} u_j + D u_i,
    i.e. a forward recurrence plus a backward recurrence z_k = Ā z_{k+1} + B̄ u_k read one step late
    (y_i uses 2 Re(C1 z_{i+1}), z_L = 0): the backward branch never sees the current position, so u_i
    is not counted twice (the original's ``F.pad(k0, (0, L)) + F.pad(k1.flip(-1), (L, 0))``, whose
    comment calls the off-by-one deliberate; reproduced as is).
  layer (S4Block around FFTConv):  out = postact(W · dropout(GELU(y)) + b),
    postact "glu": W maps H → 2H and out = a ⊙ σ(g) for [a, g] = the two halves (torch's GLU order);
    "linear": W maps H → H, no activation; "none": no output linear (out = dropout(GELU(y))).

Defaults reproduced from the original: d_state N = 64; init "legs" (the S4D-LegS of the LRA tables:
Im A = the positive imaginary parts of the eigenvalues of the normal part of HiPPO-LegS, −1/2 I + S with
S skew-symmetric, S_nk = −√(2n+1)√(2k+1)/2 for n > k; ordered as ``hippo.nplr`` leaves them, largest
first), "lin" Im A = π n and "inv" Im A = (N/π)(N/(2n+1) − 1) as options; Re A = −1/2 for every init
(stored as log(1/2), A_re = −exp); B = 1; C ~ CN(0, 1) (``torch.randn(..., dtype=cfloat)``: real and
imaginary parts each N(0, 1/2)); D ~ N(0, 1) per channel; log Δ ~ U[log dt_min, log dt_max] per channel
(one Δ for all modes of a channel, the original's ``dt_tie``) with dt_min = 1e-3, dt_max = 1e-1;
disc "zoh"; GELU (exact, erf form, as torch's ``nn.GELU``) then dropout then a position-wise linear to 2H
and GLU; ``tie_dropout`` draws one dropout mask per (example, channel) shared over the length (S4's
``DropoutNd``); padded positions of u zeroed before the convolution (S4Block's ``lengths`` masking).

Differences from the original:
  - Padding comes as a boolean mask (padding at the end of each row) and u is zeroed at padded
    positions; the outputs at padded positions are not zeroed (as in the original); real positions do not
    depend on the padding (the kernel K_l does not depend on L, and the padded u are zero).
  - The kernel and convolution run in float32 (float64 when x is float64) whatever x's dtype; the output
    is cast back to x's dtype. Parameters are float32.
  - Δ is parameterised as exp(ssm_log_dt), as in the minimal ``s4d.py`` (the full ``SSMKernel`` now
    defaults to a softplus transform); by default every channel has its own A and B (``n_ssm = H``, the
    minimal layer's choice); ``n_ssm`` shares A (and the random B) over the channels as the LRA configs'
    and seq_icl's ``n_ssm: 1`` (Δ stays per channel, as there).
  - B is fixed to ones by default (the minimal ``s4d.py``). The full kernel (``SSMKernelDiag``, what the LRA
    yamls run) trains B at the layer's rate; with ``init: legs`` its initial B is HiPPO-LegS's B in the
    eigenbasis of the normal part, V*·(√(2n+1))_n with the imaginary part clipped to [−2, 2] (``dplr.ssm`` →
    ``hippo.nplr(..., B_clip=2.0)``; |B| between about 0.6 and 2 at N = 4 and 64), one row per SSM copy:
    ``B_init="legs"`` with ``trainable_B=True`` reproduces that (parameter ``ssm_B`` [n_ssm, N/2, 2], stored
    conjugated like A, see below); ``trainable_B=True`` alone trains a B initialised to ones, one row per
    channel. The standalone S4D of S4's repository (and seq_icl's copy) draws B at random and folds it into
    C, which ``B_init="random"`` reproduces.
  - A is stored with Im A > 0 (the original: Im A < 0, ``A_imag`` = −Im A); the LegS B is conjugated with
    it, so with C's symmetric distribution the kernels 2 Re(·) are the original's.
  - ``dt_transform``: Δ = exp(ssm_log_dt) by default (the minimal ``s4d.py``, and the full kernel's
    ``dt_transform: exp``); ``"softplus"`` stores ``ssm_inv_dt`` = softplus⁻¹(Δ₀) and uses Δ = softplus(·),
    the default of S4's layer config (``configs/model/layer/s4.yaml`` ``dt_transform: softplus``) that the
    LRA yamls run.
  - One dropout, after the GELU (as in the minimal ``s4d.py``); the current ``FFTConv`` applies a second,
    untied dropout to y before the activation.
  - The output linear uses flax's default ``Dense`` init (LeCun normal kernel, zero bias) instead of
    torch's ``nn.Linear``/``Conv1d`` init (Kaiming uniform, uniform bias); ``out_init_std`` gives N(0, std²)
    and a zero bias instead (seq_icl's models re-initialise every linear map N(0, 0.02)).
  - Im A for "legs" is computed with numpy's ``eigvalsh`` of the Hermitian i·S in float64 (the original:
    torch's ``eigh`` in double precision).
  - ``causal=True`` uses the forward kernel only (one C) whatever ``bidirectional`` says.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.registry import MixerConfig, register_mixer

INITS = ("legs", "lin", "inv")
DISCS = ("zoh", "bilinear")
POSTACTS = ("glu", "linear", "none")
B_INITS = ("ones", "random", "legs")
DT_TRANSFORMS = ("exp", "softplus")


@dataclasses.dataclass(frozen=True)
class S4DConfig(MixerConfig):
  """S4D layer options (module docstring for the equations).

  Attributes:
    d_state: N, the real-equivalent state size per channel (N/2 complex modes); must be even.
    init: imaginary parts of A: "legs" (HiPPO-LegS normal part's eigenvalues), "lin" (π n) or "inv"
      ((N/π)(N/(2n+1) − 1)).
    disc: discretisation, "zoh" or "bilinear".
    dt_min, dt_max: range of the log-uniform initial step Δ (per channel).
    bidirectional: two-sided kernel (a second C for the backward direction); ignored when causal.
    trainable_B: train B (parameter ``ssm_B``, initialised to ones) instead of fixing B = 1.
    tie_dropout: one dropout mask per (example, channel) shared over the length.
    postact: "glu" (linear H → 2H then GLU), "linear" (linear H → H) or "none" (no output linear).
    out_init_std: None (flax's default init of the output linear, LeCun normal) or the standard
      deviation of a N(0, std²) kernel with a zero bias (seq_icl's models re-initialise every linear
      map N(0, 0.02)).
    B_init: "ones" (B = 1, the minimal layer's), "random" (the standalone S4D of S4's repository and
      seq_icl, ``random_dplr``: B ~ CN(0, 1) per SSM copy, divided by sqrt(2 Σ_n |B_n / A_n|²) at the
      initial A, and folded into C's initial value, C ← C · B, while B itself stays 1) or "legs" (the full
      kernel's HiPPO-LegS B, one row per copy: ``legs_B``; trained with ``trainable_B``).
    n_ssm: None (every channel has its own A: n_ssm = H) or the number of copies of A (and of the random
      or LegS B) shared over the channels, channel h using copy h mod n_ssm (the original's ``repeat``);
      must divide the width. Δ stays per channel.
    dt_transform: "exp" (Δ = exp(ssm_log_dt)) or "softplus" (Δ = softplus(ssm_inv_dt), S4's layer config).
  """

  d_state: int = 64
  init: str = "legs"
  disc: str = "zoh"
  dt_min: float = 1e-3
  dt_max: float = 1e-1
  bidirectional: bool = True
  trainable_B: bool = False
  tie_dropout: bool = False
  postact: str = "glu"
  out_init_std: float | None = None
  B_init: str = "ones"
  n_ssm: int | None = None
  dt_transform: str = "exp"

  paper_name: ClassVar[str | None] = "S4D"
  family: ClassVar[str] = "ssm"

  def __post_init__(self):
    if self.d_state < 2 or self.d_state % 2:
      raise ValueError(f"s4d: d_state must be a positive even number (N/2 complex modes), got {self.d_state}")
    for name, value, allowed in (("init", self.init, INITS), ("disc", self.disc, DISCS),
                                 ("postact", self.postact, POSTACTS)):
      if value not in allowed:
        raise ValueError(f"s4d: {name} must be one of {', '.join(allowed)}; got {value!r}")
    if not 0 < self.dt_min <= self.dt_max:
      raise ValueError(f"s4d: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
    if self.out_init_std is not None and not self.out_init_std > 0:
      raise ValueError(f"s4d: out_init_std must be > 0 (or None), got {self.out_init_std}")
    if self.B_init not in B_INITS:
      raise ValueError(f"s4d: B_init must be one of {', '.join(B_INITS)}; got {self.B_init!r}")
    if self.n_ssm is not None and not (isinstance(self.n_ssm, int) and self.n_ssm >= 1):
      raise ValueError(f"s4d: n_ssm must be a positive integer (or None), got {self.n_ssm!r}")
    if self.dt_transform not in DT_TRANSFORMS:
      raise ValueError(f"s4d: dt_transform must be one of {', '.join(DT_TRANSFORMS)}; got {self.dt_transform!r}")
    if self.B_init == "legs" and self.init != "legs":
      raise ValueError(f"s4d: B_init='legs' goes with init='legs' (the eigenbasis of LegS's A), got init={self.init!r}")

  def state_size(self, length: int, d_model: int) -> int:
    """d_model · d_state: a causal layer keeps N/2 complex modes per channel, i.e. N real scalars per
    channel, whatever the length."""
    del length
    return d_model * self.d_state


def legs_imag(n_state: int) -> np.ndarray:
  """float64 [N/2]: the positive imaginary parts of the eigenvalues of HiPPO-LegS's normal part
  −1/2 I + S (S_nk = −√(2n+1)√(2k+1)/2 for n > k, skew-symmetric), largest first (the original's order)."""
  r = np.sqrt(2 * np.arange(n_state, dtype=np.float64) + 1)
  s = -0.5 * np.tril(np.outer(r, r), -1)
  s = s - s.T
  imag = np.linalg.eigvalsh(-1j * s)  # eigenvalues of the skew S are i·imag, imag real, ascending
  return -imag[:n_state // 2]  # the negative half, negated: the conjugate pair's positive parts


def legs_B(n_state: int, clip: float = 2.0) -> np.ndarray:
  """complex128 [N/2]: HiPPO-LegS's B = (√(2n+1))_n in the eigenbasis of LegS's normal part, V*·B, for the N/2
  modes of ``legs_imag`` (same order), imaginary part clipped to [−clip, clip] (``hippo.nplr``, ``B_clip``),
  conjugated to go with this module's Im A > 0 (the original keeps the modes with Im A < 0)."""
  r = np.sqrt(2 * np.arange(n_state, dtype=np.float64) + 1)
  s = -0.5 * np.tril(np.outer(r, r), -1)
  s = s - s.T                                             # the skew part of A + P Pᵀ (its diagonal is −1/2)
  imag, v = np.linalg.eigh(-1j * s)                       # ascending: the first N/2 have Im A < 0
  b = v[:, :n_state // 2].conj().T @ r                    # V* B
  b = b.real + 1j * np.clip(b.imag, -clip, clip)
  return np.conj(b)


def init_A_imag(init: str, n_state: int) -> np.ndarray:
  """float64 [N/2]: Im A for ``init`` (module docstring)."""
  n = np.arange(n_state // 2, dtype=np.float64)
  if init == "lin":
    return np.pi * n
  if init == "inv":
    return n_state / np.pi * (n_state / (2 * n + 1) - 1)
  if init == "legs":
    return legs_imag(n_state)
  raise ValueError(f"s4d: unknown init {init!r}")


def discretize(dt, A, B, disc: str):
  """Ā, B̄ and log Ā (complex [..., H, N/2]) for dt [H], A, B complex [H, N/2]."""
  dtA = dt[:, None] * A
  if disc == "zoh":
    log_dA = dtA
    dB = B * (jnp.exp(dtA) - 1.0) / A
  elif disc == "bilinear":
    log_dA = jnp.log((1.0 + dtA / 2) / (1.0 - dtA / 2))
    dB = B * dt[:, None] / (1.0 - dtA / 2)
  else:
    raise ValueError(f"s4d: unknown discretisation {disc!r}")
  return jnp.exp(log_dA), dB, log_dA


def s4d_kernel(dt, A, B, C, length: int, disc: str = "zoh"):
  """Real kernel [C, H, L]: K[c, h, l] = 2 Re Σ_n C[c, h, n] B̄[h, n] Ā[h, n]^l.

  dt: real [H]; A, B: complex [H, N/2]; C: complex [C, H, N/2]. Ā^l = exp(l · log Ā) (the original's
  log-Vandermonde product, materialising [H, N/2, L])."""
  _, dB, log_dA = discretize(dt, A, B, disc)
  powers = jnp.exp(log_dA[..., None] * jnp.arange(length, dtype=dt.dtype))  # [H, N/2, L]
  return 2.0 * jnp.einsum("chn,hnl->chl", C * dB, powers).real


def ssm_convolution(u, k_forward, k_backward=None):
  """y [B, L, H] = (K * u) along L by FFT of length 2L (no D term).

  u: real [B, L, H]; k_forward, k_backward: real [H, L]. With ``k_backward`` the kernel is two-sided:
  y_i = Σ_{j≤i} k_forward[i−j] u_j + Σ_{j>i} k_backward[j−i−1] u_j (module docstring)."""
  length = u.shape[1]
  if k_backward is None:
    k = jnp.pad(k_forward, ((0, 0), (0, length)))
  else:
    k = jnp.concatenate([k_forward, k_backward[:, ::-1]], axis=-1)  # pad(K0,(0,L)) + pad(flip(K1),(L,0))
  k_f = jnp.fft.rfft(k, n=2 * length, axis=-1)  # [H, L+1]
  u_f = jnp.fft.rfft(u, n=2 * length, axis=1)  # [B, L+1, H]
  return jnp.fft.irfft(u_f * k_f.T[None], n=2 * length, axis=1)[:, :length].astype(u.dtype)


def random_B(key, copies: int, A: np.ndarray, dtype=jnp.complex64) -> jax.Array:
  """[copies, N/2] complex: B ~ CN(0, 1) (real and imaginary parts N(0, 1/2), torch's complex
  ``randn``), each copy divided by sqrt(ζ), ζ = 2 Σ_n |B_n / A_n|² (the variance of the integrated
  kernel with a random C: ``random_dplr``); ``A`` [N/2] is the initial diagonal."""
  n_half = A.shape[-1]
  real_dtype = jnp.float64 if dtype == jnp.complex128 else jnp.float32
  re, im = jax.random.normal(key, (2, copies, n_half), real_dtype) * math.sqrt(0.5)
  B = jax.lax.complex(re, im)
  zeta = 2 * jnp.sum(jnp.abs(B / jnp.asarray(A, dtype)) ** 2, axis=-1, keepdims=True)
  return B / jnp.sqrt(zeta)


@register_mixer("s4d", S4DConfig)
class S4D(nn.Module):
  """S4D layer: diagonal SSM convolution + D skip, GELU, dropout, output linear (+ GLU)."""

  config: S4DConfig

  def _output_init(self) -> dict:
    std = self.config.out_init_std
    return {} if std is None else {"kernel_init": nn.initializers.normal(std),
                                   "bias_init": nn.initializers.zeros}

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    c = self.config
    batch, length, h = x.shape
    n_half = c.d_state // 2
    dtype = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    cdtype = jnp.complex128 if dtype == jnp.float64 else jnp.complex64
    channels = 2 if (c.bidirectional and not c.causal) else 1
    copies = h if c.n_ssm is None else c.n_ssm
    if h % copies:
      raise ValueError(f"s4d: n_ssm={c.n_ssm} must divide the width {h}")

    draw_log_dt = lambda key, shape: jax.random.uniform(key, shape, jnp.float32, math.log(c.dt_min),
                                                        math.log(c.dt_max))
    if c.dt_transform == "softplus":  # inv_dt = softplus⁻¹(Δ₀) = log(expm1(Δ₀)) (``inv_transform``)
      inv_dt = self.param("ssm_inv_dt", lambda key, shape: jnp.log(jnp.expm1(jnp.exp(draw_log_dt(key, shape)))),
                          (h,))
    else:
      log_dt = self.param("ssm_log_dt", draw_log_dt, (h,))
    log_A_re = self.param("ssm_log_A_re", lambda key, shape: jnp.full(shape, math.log(0.5), jnp.float32),
                          (copies, n_half))
    A_im = self.param(
        "ssm_A_im",
        lambda key, shape: jnp.broadcast_to(jnp.asarray(init_A_imag(c.init, c.d_state), jnp.float32), shape),
        (copies, n_half))
    log_A_re, A_im = (jnp.tile(p, (h // copies, 1)) for p in (log_A_re, A_im))  # channel h: copy h % n_ssm
    if c.B_init == "legs":  # one B per copy of A, tiled over the channels like A
      b0 = legs_B(c.d_state)
      init_b = lambda key, shape: jnp.broadcast_to(jnp.asarray(np.stack([b0.real, b0.imag], -1), jnp.float32),
                                                   shape)
      B_ri = self.param("ssm_B", init_b, (copies, n_half, 2)) if c.trainable_B else init_b(None, (copies, n_half, 2))
      B_ri = jnp.tile(B_ri, (h // copies, 1, 1))
      B = jax.lax.complex(B_ri[..., 0].astype(dtype), B_ri[..., 1].astype(dtype))
    elif c.trainable_B:
      B_ri = self.param("ssm_B", lambda key, shape: jnp.stack([jnp.ones(shape[:-1]), jnp.zeros(shape[:-1])], -1)
                        .astype(jnp.float32), (h, n_half, 2))
      B = jax.lax.complex(B_ri[..., 0].astype(dtype), B_ri[..., 1].astype(dtype))
    else:
      B = jnp.ones((h, n_half), cdtype)

    def C_init(key, shape):
      if c.B_init == "ones":
        return nn.initializers.normal(math.sqrt(0.5))(key, shape)
      key_c, key_b = jax.random.split(key)
      C = nn.initializers.normal(math.sqrt(0.5))(key_c, shape)
      A0 = -0.5 + 1j * init_A_imag(c.init, c.d_state)  # the initial diagonal (log_A_re = log 0.5)
      B0 = jnp.tile(random_B(key_b, copies, A0), (h // copies, 1))  # [H, N/2]
      folded = jax.lax.complex(C[..., 0], C[..., 1]) * B0
      return jnp.stack([folded.real, folded.imag], -1)

    C_ri = self.param("C", C_init, (channels, h, n_half, 2))
    D = self.param("D", nn.initializers.normal(1.0), (h,))

    dt = jax.nn.softplus(inv_dt.astype(dtype)) if c.dt_transform == "softplus" else jnp.exp(log_dt.astype(dtype))
    A = jax.lax.complex(-jnp.exp(log_A_re.astype(dtype)), A_im.astype(dtype))
    C = jax.lax.complex(C_ri[..., 0].astype(dtype), C_ri[..., 1].astype(dtype))
    k = s4d_kernel(dt, A, B, C, length, c.disc)  # [C, H, L]

    u = x.astype(dtype) * mask[..., None].astype(dtype)  # padded positions are zero (again)
    y = ssm_convolution(u, k[0], k[1] if channels == 2 else None) + D.astype(dtype) * u
    self.sow("intermediates", "ssm_output", y)

    y = jax.nn.gelu(y, approximate=False)
    y = nn.Dropout(c.dropout_rate, broadcast_dims=(1,) if c.tie_dropout else ())(y, deterministic=deterministic)
    if c.postact == "glu":
      y = nn.Dense(2 * h, dtype=dtype, name="output_linear", **self._output_init())(y)
      y = y[..., :h] * jax.nn.sigmoid(y[..., h:])
    elif c.postact == "linear":
      y = nn.Dense(h, dtype=dtype, name="output_linear", **self._output_init())(y)
    return y.astype(x.dtype)
