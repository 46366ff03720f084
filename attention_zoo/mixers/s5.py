"""S5 (Smith, Warrington, Linderman, "Simplified State Space Layers for Sequence Modeling", ICLR 2023):
one multi-input multi-output diagonal linear SSM per layer, run by a parallel (associative) scan.

Axis legend: ``B`` batch, ``L`` length, ``H`` features (d_model), ``P`` state size (``d_state``),
``N = P/2`` modes kept with conjugate symmetry (``N = P`` without), ``J`` blocks.

Continuous system (per example), diagonalised: ``x'(t) = Λ x(t) + B̃ u(t)``, ``y(t) = C̃ x(t) + D ⊙ u(t)``
with ``Λ ∈ C^N``, ``B̃ = V⁻¹B ∈ C^{N×H}``, ``C̃ = C V ∈ C^{H×N}``, ``D ∈ R^H`` and per-state steps
``Δ = step_rescale · exp(log_step) ∈ R^N``. Discretised:

    ZOH:       Λ̄ = exp(ΛΔ),                     B̄ = (Λ̄ − 1)/Λ ⊙ B̃
    bilinear:  Λ̄ = (1 − ΔΛ/2)⁻¹ (1 + ΔΛ/2),     B̄ = (1 − ΔΛ/2)⁻¹ Δ ⊙ B̃
    x_k = Λ̄ ⊙ x_{k−1} + B̄ u_k                   (jax.lax.associative_scan with
                                                  (a_i, b_i)∘(a_j, b_j) = (a_j a_i, a_j b_i + b_j))
    y_k = 2 Re(C̃ x_k) + D ⊙ u_k                  (conj_sym; Re(C̃ x_k) without)

Bidirectional (as ``s5/ssm.py`` ``apply_ssm``): a second, reverse scan ``x'_k = Λ̄ ⊙ x'_{k+1} + B̄ u_k``
with the same Λ̄, B̄; the two state sequences are concatenated ``[x_k, x'_k]`` and read out by the
concatenated ``C̃ = [C̃₁ | C̃₂]`` (width 2N), i.e. ``y_k = 2 Re(C̃₁ x_k + C̃₂ x'_k) + D ⊙ u_k`` (one D).

Initialisation (``s5/ssm_init.py`` ``make_HiPPO``, ``make_NPLR_HiPPO``, ``make_DPLR_HiPPO``,
``init_VinvB``, ``init_CV``, ``init_log_steps``, ``trunc_standard_normal``; the block layout of
``s5/train.py``): with block size ``b = P/J``, the HiPPO-LegS matrix ``A`` [b, b] plus ``p pᵀ``
(``p_n = √(n + ½)``) is the normal matrix ``S = −½ I + skew``; ``Λ = mean(diag S) + i·eig(−iS)`` (the
real part is −½ everywhere), ``V`` its eigenvectors (``eigh``, ascending imaginary part). With
conj_sym the first b/2 modes (negative imaginary parts) are kept, ``V`` [b, b/2]; ``Λ`` is repeated J
times and ``V`` block-diagonal (``V⁻¹ = Vᴴ``). ``B`` [P, H] real lecun_normal, ``B̃ = V⁻¹B`` stored as
(real, imag) [N, H, 2]. ``C`` [H, P] complex: ``trunc_standard_normal`` (the original's name: real and
imaginary parts truncated normal with variance 1/P, each row drawn as lecun_normal of [1, P, 2]),
``lecun_normal`` (variance 1/(H·P), lecun_normal of [H, P, 2]) then ``C̃ = C V``; or ``complex_normal``
(``C̃`` drawn directly, N(0, ½) real and imaginary parts, no V). ``D ~ N(0, 1)``;
``log_step ~ U[log dt_min, log dt_max]``.

The layer (``s5/layers.py`` ``SequenceLayer``, without its norm and residual, which the encoder owns):
``y = S5SSM(u)``, then by ``activation``:

    gelu:       drop(gelu(y))
    half_glu1:  z = drop(gelu(y));  drop(z ⊙ σ(W z))            (run_train.py default)
    half_glu2:  z = drop(gelu(y));  drop(y ⊙ σ(W z))            (LRA ListOps, IMDB)
    full_glu:   z = drop(gelu(y));  drop(W₁z ⊙ σ(W₂z))

Each ``drop`` draws its own mask; with ``tie_dropout`` (the original's ``broadcast_dims=[0]`` on [L, H])
the mask is shared over the length axis.

Defaults reproduced from ``run_train.py``: ``d_state`` 256 (``ssm_size_base``), ``blocks`` 8,
``C_init`` trunc_standard_normal, ``discretization`` zoh, ``activation`` half_glu1, ``conj_sym`` True,
``clip_eigs`` False, ``dt_min`` 1e-3, ``dt_max`` 1e-1, ``step_rescale`` 1 (``s5/ssm.py``). The LRA
scripts (``bin/run_experiments/run_lra_*.sh``) change d_state/blocks/C_init/activation per task
(ListOps: d_state 16, blocks 8, C_init lecun_normal, half_glu2; IMDB: 192, 12, lecun_normal,
half_glu2; CIFAR: 384, 3, lecun_normal, clip_eigs; Pathfinder: 256, 8; Path-X: 256, 16,
complex_normal, dt_min 1e-4; AAN: 256, 16).

SSM parameters (``ssm_`` prefix: their own learning rate, no weight decay — the original's "standard"
``opt_config`` in ``s5/train_helpers.py``): ``ssm_Lambda_re``, ``ssm_Lambda_im`` [N], ``ssm_B``
[N, H, 2], ``ssm_log_step`` [N]. Ordinary parameters: ``C`` or ``C1``/``C2`` (bidirectional), ``D``,
and the GLU's ``out1``/``out2`` Dense layers.

Differences from the original:

- Padding is masked: ``B̄u_k`` is zeroed at padded positions inside both scans, so the outputs at real
  positions depend neither on padded content nor on how many padded positions follow (the reverse
  scan starts clean at the last real token). The original ignores the padding in its layers (padded
  positions hold the input Dense's embedding of the pad token, later the previous layer's outputs, and
  its reverse scan carries them into real positions); it masks only the mean pooling
  (``s5/seq_model.py`` ``masked_meanpool``).
- ``bidirectional`` defaults to True (every LRA script of the original sets it; ``run_train.py``'s
  default is False). ``causal=True`` turns it off.
- The norm, the residual and the input encoder are the encoder's (this mixer is the SSM + activation +
  dropout part of ``SequenceLayer``).
- Λ, V are computed once in numpy float64 (the original: jax float32); the random draws use other
  keys than the original's per-row/per-state key splits (same distributions). ``ssm_log_step`` is [N]
  (the original: [N, 1]). The original's ``dt_global`` / ``opt_config`` variants (Δ or B at the global
  rate, weight decay on B) are the optimizer's business here: the ``ssm_`` split is "standard".
- Compute in float32 (float64 for float64 inputs); parameters are created in that dtype; the output is
  cast to the input's dtype.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.mixers import _scan
from attention_zoo.registry import MixerConfig, register_mixer

C_INITS = ("trunc_standard_normal", "lecun_normal", "complex_normal")
DISCRETIZATIONS = ("zoh", "bilinear")
ACTIVATIONS = ("half_glu1", "half_glu2", "full_glu", "gelu")


@dataclasses.dataclass(frozen=True)
class S5Config(MixerConfig):
  """S5 options (module docstring; defaults of the original's ``run_train.py`` unless noted).

  Attributes:
    d_state: P, the state size before conjugate symmetry (``ssm_size_base``); N = P/2 modes are kept
      with ``conj_sym``.
    blocks: J, the number of HiPPO blocks of the initial Λ (block size P/J, even with conj_sym).
    conj_sym: keep half the modes and read out ``2 Re(C̃x)``.
    C_init: "trunc_standard_normal", "lecun_normal" or "complex_normal".
    discretization: "zoh" or "bilinear".
    dt_min, dt_max: the range of the initial steps Δ (log-uniform).
    bidirectional: add a reverse scan read out by a second C (default True: the original's LRA runs).
      Ignored when ``causal``.
    clip_eigs: clip Re Λ to ≤ −1e-4 (the original's CIFAR run).
    step_rescale: multiplies Δ (the original changes it for other sampling rates).
    activation: "half_glu1", "half_glu2", "full_glu" or "gelu".
    tie_dropout: share the dropout mask over the length axis (the original); False drops elementwise.
  """

  d_state: int = 256
  blocks: int = 8
  conj_sym: bool = True
  C_init: str = "trunc_standard_normal"
  discretization: str = "zoh"
  dt_min: float = 1e-3
  dt_max: float = 1e-1
  bidirectional: bool = True
  clip_eigs: bool = False
  step_rescale: float = 1.0
  activation: str = "half_glu1"
  tie_dropout: bool = True

  paper_name: ClassVar[str | None] = "S5"
  family: ClassVar[str] = "ssm"

  def __post_init__(self):
    if self.d_state <= 0 or self.blocks <= 0 or self.d_state % self.blocks:
      raise ValueError(f"S5: d_state ({self.d_state}) must be a positive multiple of blocks ({self.blocks})")
    if self.conj_sym and (self.d_state // self.blocks) % 2:
      raise ValueError(f"S5: with conj_sym the block size d_state/blocks ({self.d_state // self.blocks}) "
                       "must be even")
    for name, value, options in (("C_init", self.C_init, C_INITS),
                                 ("discretization", self.discretization, DISCRETIZATIONS),
                                 ("activation", self.activation, ACTIVATIONS)):
      if value not in options:
        raise ValueError(f"S5: {name} must be one of {options}, got {value!r}")
    if not 0 < self.dt_min <= self.dt_max:
      raise ValueError(f"S5: need 0 < dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")

  @property
  def num_modes(self) -> int:
    """N: the complex modes kept (P/2 with conj_sym, else P)."""
    return self.d_state // 2 if self.conj_sym else self.d_state

  def state_size(self, length: int, d_model: int) -> int:
    """Real scalars a causal layer keeps: N complex states of 2 reals, i.e. P with conj_sym (the P/2
    conjugate partners are implied) and 2P without; independent of length and d_model."""
    del length, d_model
    return 2 * self.num_modes


def make_dplr_hippo(block_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Λ [b] (complex) and V [b, b] (unitary) of the normal part of HiPPO-LegS (float64 numpy, as the
  original's ``make_DPLR_HiPPO``): ``Λ = mean(diag S) + i·eigh(−iS)``, eigenvalues ascending."""
  n = np.arange(block_size)
  q = np.sqrt(1.0 + 2.0 * n)
  hippo = -(np.tril(np.outer(q, q)) - np.diag(n))
  p = np.sqrt(n + 0.5)
  normal = hippo + np.outer(p, p)
  lambda_re = np.mean(np.diagonal(normal)) * np.ones(block_size)
  m = -1j * normal
  lambda_im, v = np.linalg.eigh((m + m.conj().T) / 2)  # jax's eigh symmetrises its input the same way
  return lambda_re + 1j * lambda_im, v


@functools.lru_cache(maxsize=64)
def init_lambda_v(d_state: int, blocks: int, conj_sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Λ [N], V [P, N] and V⁻¹ = Vᴴ [N, P] (block-diagonal, J blocks) as ``s5/train.py`` builds them
  (cached, read-only arrays)."""
  block_size = d_state // blocks
  lam, v = make_dplr_hippo(block_size)
  if conj_sym:
    block_size //= 2
  lam, v = lam[:block_size], v[:, :block_size]
  v_full = np.zeros((d_state, blocks * block_size), complex)
  rows = d_state // blocks
  for j in range(blocks):
    v_full[j * rows:(j + 1) * rows, j * block_size:(j + 1) * block_size] = v
  arrays = np.tile(lam, blocks), v_full, v_full.conj().T
  for a in arrays:
    a.setflags(write=False)
  return arrays


# The real B drawn before B̃ = V⁻¹B (module level so that tests can record the draw).
B_INIT = jax.nn.initializers.lecun_normal()


def _as_pair(z: jax.Array, dtype) -> jax.Array:
  return jnp.stack([z.real, z.imag], axis=-1).astype(dtype)


def _c_init(kind: str):
  """C [H, P, 2] (real, imag) sampler: ``trunc_standard_normal`` is lecun_normal per row (fan_in P)."""
  if kind == "trunc_standard_normal":
    return jax.nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1,
                                                batch_axis=0)
  return jax.nn.initializers.lecun_normal()


def discretize(lam: jax.Array, b_tilde: jax.Array, step: jax.Array, method: str):
  """(Λ̄ [N], B̄ [N, H]) from Λ [N], B̃ [N, H], Δ [N] (``s5/ssm.py`` discretize_zoh / _bilinear)."""
  if method == "zoh":
    lam_bar = jnp.exp(lam * step)
    return lam_bar, ((lam_bar - 1.0) / lam)[:, None] * b_tilde
  bl = 1.0 / (1.0 - (step / 2.0) * lam)
  return bl * (1.0 + (step / 2.0) * lam), (bl * step)[:, None] * b_tilde


def linear_scan(lam_bar: jax.Array, bu: jax.Array, reverse: bool = False, method: str | None = None) -> jax.Array:
  """States x [B, L, N] of x_k = Λ̄ ⊙ x_{k∓1} + bu_k (bu [B, L, N]) over L: the associative scan (the
  original's), or on a CPU the faster sequential scan (``_scan.diagonal_recurrence``; same result)."""
  return _scan.diagonal_recurrence(lam_bar, bu, reverse=reverse, method=method)


@register_mixer("s5", S5Config)
class S5(nn.Module):
  """The S5 layer (module docstring): x [B, L, H], mask [B, L] -> [B, L, H] in x's dtype."""

  config: S5Config

  @nn.compact
  def __call__(self, x, mask=None, deterministic=True):
    cfg = self.config
    features = x.shape[-1]
    dtype = jnp.result_type(jnp.float32, x.dtype)  # float32, float64 for float64 inputs
    n_modes = cfg.num_modes
    bidirectional = cfg.bidirectional and not cfg.causal
    if mask is None:
      mask = jnp.ones(x.shape[:2], bool)
    lam_init, v, vinv = init_lambda_v(cfg.d_state, cfg.blocks, cfg.conj_sym)

    lam_re = self.param("ssm_Lambda_re", lambda _: jnp.asarray(lam_init.real, dtype))
    lam_im = self.param("ssm_Lambda_im", lambda _: jnp.asarray(lam_init.imag, dtype))
    cdtype = jnp.result_type(dtype, jnp.complex64)  # complex64, complex128 for float64 inputs
    b = self.param("ssm_B", lambda key: _as_pair(
        jnp.asarray(vinv, cdtype) @ B_INIT(key, (cfg.d_state, features), dtype).astype(cdtype), dtype))
    log_dt_min, log_dt_max = np.log(cfg.dt_min), np.log(cfg.dt_max)
    log_step = self.param("ssm_log_step", lambda key: jax.random.uniform(
        key, (n_modes,), dtype, log_dt_min, log_dt_max))

    if cfg.C_init == "complex_normal":
      width = 2 * n_modes if bidirectional else n_modes
      c = self.param("C", jax.nn.initializers.normal(stddev=0.5 ** 0.5), (features, width, 2), dtype)
      c_tilde = c[..., 0] + 1j * c[..., 1]
    else:
      sample = _c_init(cfg.C_init)

      def init_cv(key):
        c_pair = sample(key, (features, cfg.d_state, 2), dtype)
        return _as_pair((c_pair[..., 0] + 1j * c_pair[..., 1]) @ jnp.asarray(v, cdtype), dtype)

      names = ("C1", "C2") if bidirectional else ("C",)
      c_tilde = jnp.concatenate([(lambda p: p[..., 0] + 1j * p[..., 1])(self.param(name, init_cv))
                                 for name in names], axis=-1)
    d = self.param("D", jax.nn.initializers.normal(stddev=1.0), (features,), dtype)

    if cfg.clip_eigs:
      lam_re = jnp.minimum(lam_re, -1e-4)
    lam = lam_re + 1j * lam_im
    step = cfg.step_rescale * jnp.exp(log_step)
    lam_bar, b_bar = discretize(lam, b[..., 0] + 1j * b[..., 1], step, cfg.discretization)

    u = x.astype(dtype)
    # B̄u and Re(C̃x) as real matmuls (u is real): half the work of complex products.
    bu = jax.lax.complex(jnp.einsum("blh,nh->bln", u, b_bar.real), jnp.einsum("blh,nh->bln", u, b_bar.imag))
    bu = jnp.where(mask[:, :, None], bu, jnp.zeros((), bu.dtype))  # padded positions feed no state
    xs = linear_scan(lam_bar, bu)
    if bidirectional:
      xs = jnp.concatenate([xs, linear_scan(lam_bar, bu, reverse=True)], axis=-1)
    y = jnp.einsum("bln,hn->blh", xs.real, c_tilde.real) - jnp.einsum("bln,hn->blh", xs.imag, c_tilde.imag)
    if cfg.conj_sym:
      y = 2.0 * y
    y = y + d * u

    broadcast = (1,) if cfg.tie_dropout else ()

    def drop(z):
      return nn.Dropout(cfg.dropout_rate, broadcast_dims=broadcast)(z, deterministic=deterministic)

    def dense(name):
      return nn.Dense(features, dtype=dtype, param_dtype=dtype, name=name)

    z = drop(nn.gelu(y))
    if cfg.activation == "half_glu1":
      out = drop(z * jax.nn.sigmoid(dense("out2")(z)))
    elif cfg.activation == "half_glu2":
      out = drop(y * jax.nn.sigmoid(dense("out2")(z)))
    elif cfg.activation == "full_glu":
      out = drop(dense("out1")(z) * jax.nn.sigmoid(dense("out2")(z)))
    else:
      out = z
    return out.astype(x.dtype)
