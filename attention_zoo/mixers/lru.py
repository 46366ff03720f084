"""LRU, the Linear Recurrent Unit (Orvieto et al., "Resurrecting Recurrent Neural Networks for Long
Sequences", ICML 2023): a diagonal complex linear recurrence, exponentially parametrised and
normalised, run by a parallel (associative) scan, followed by GELU and a GLU output map.

Axis legend: ``B`` batch, ``L`` length, ``H`` features (d_model), ``N`` state size (``d_state``).

Equations (one layer, input ``u [B, L, H]``, states ``x [B, L, N]`` complex)::

    λ      = exp(−exp(ν_log) + i·exp(θ_log))                         [N]    (|λ| < 1 for any ν_log)
    γ      = exp(γ_log)                                              [N]    (init √(1 − |λ|²))
    B      = B_re + i·B_im                                           [N, H]
    C      = C_re + i·C_im                                           [H, N]
    x_k    = λ ⊙ x_{k−1} + γ ⊙ (B u_k),        x_0 = 0
    y_k    = Re(C x_k) + D ⊙ u_k                                     [H]
    out    = drop(GLU(drop(GELU(y))))       GLU(z) = Dense_1(z) ⊙ σ(Dense_2(z))

The recurrence is evaluated with ``jax.lax.associative_scan`` over
``(a_i, b_i) ∘ (a_j, b_j) = (a_j a_i, a_j b_i + b_j)``, in float32 (complex64), or float64
(complex128) when ``x`` is float64; the output is cast back to ``x``'s dtype.

Bidirectional option (``bidirectional=True``, not under ``causal``): a second scan of the same
``λ, γ, B`` runs from the end, ``x^b_k = λ ⊙ x^b_{k+1} + γ ⊙ (B u_k)``, read by its own output matrix
``C_b``: ``y_k = Re(C x_k) + Re(C_b x^b_k) + D ⊙ u_k``. minimal-LRU has no bidirectional option; this is
the combination of S5's bidirectional SSM (``lindermanlab/S5`` ``s5/ssm.py``: both directions share
Λ and B, the concatenated states [x; x^b] are read by a [H, 2N] output matrix).

Initialisation and defaults reproduced from minimal-LRU (``NicolasZucchet/minimal-LRU``,
``lru/model.py``: ``nu_init``, ``theta_init``, ``gamma_log_init``, ``matrix_init``, ``LRU``,
``SequenceLayer``; ``lru/train_helpers.py``: the optimizer groups; ``run_train.py``: the defaults):

- u1, u2 ~ U[0, 1); ν_log = log(−½·log(u1 (r_max² − r_min²) + r_min²)), so |λ|² ~ U[r_min², r_max²]
  (a uniform ring); θ_log = log(max_phase · u2).
- γ_log = log √(1 − |λ|²) at init (a trainable parameter afterwards).
- B_re, B_im ~ N(0, 1/(2H)) [N, H]; C_re, C_im ~ N(0, 1/N) [H, N] (C_b likewise); D ~ N(0, 1) [H].
- r_min = 0.0, r_max = 1.0 (``LRU`` and ``run_train.py``), max_phase = 6.28 (``LRU``). The paper tunes
  the ring and the phase range per task (its Appendix; e.g. ListOps [0, 0.99], Text/Retrieval
  [0.5, 0.9]): set them through ``attention_kwargs``.
- d_state = 256 is this harness's default (minimal-LRU's ``run_train.py`` defaults ``--d_hidden`` to
  128).
- The layer is ``SequenceLayer`` minus its normalisation and skip connection (the encoder block owns
  those): LRU → GELU (flax's tanh approximation, ``nn.gelu``) → dropout → ``out1(y) * sigmoid(out2(y))``
  → dropout, the same dropout rate twice.
- ν_log, θ_log, γ_log, B_re, B_im get the SSM learning rate and no weight decay in minimal-LRU
  (``train_helpers.create_train_state``: "Smaller lr and no weight decay for lambda, gamma and B");
  here they are named ``ssm_nu_log``, ``ssm_theta_log``, ``ssm_gamma_log``, ``ssm_B_re``, ``ssm_B_im``
  so the harness puts them in its SSM group. C_re, C_im, D and the GLU's Dense layers are ordinary.
- Dropout masks are shared across the length axis (``broadcast_dims=(1,)``), as the original's
  ``nn.Dropout(..., broadcast_dims=[0])`` applied to one [L, H] sequence under ``nn.vmap``.

Differences from the original:

- Padding is masked: the recurrence input ``u`` is zeroed at padded positions (the padding sits at the
  end of each row), so a reverse scan starts from a zero state at the last real token and the outputs
  at real positions depend neither on the padded content nor on how many padded positions follow; the
  outputs at padded positions are zeroed. minimal-LRU ignores padding (its LRA loaders pad and the
  scan runs through the pad tokens).
- The bidirectional option (above) is not in minimal-LRU; it follows S5's form with separate
  parameters ``C_b_re``, ``C_b_im``.
- ``causal=True`` runs the forward scan only (``bidirectional`` is then ignored); the forward LRU is
  causal as it stands.
- Parameter names carry the ``ssm_`` prefix (above); C_re/C_im/D keep the original names, the GLU's
  Dense layers are ``out1``/``out2`` as in ``SequenceLayer``.
- The input is a batch [B, L, H] (the original vmaps one [L, H] sequence); parameters are float32
  (``param_dtype``), the computation runs in float32/complex64 (float64/complex128 for float64 input).
- Normalisation (minimal-LRU: batch or layer norm, pre- or post-) and the residual connection are the
  encoder block's, not this mixer's.

State for causal generation (``state_size``): N complex states per layer = 2N real numbers (the
forward state only; independent of the length and of d_model).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.mixers import _scan
from attention_zoo.registry import MixerConfig, register_mixer


@dataclasses.dataclass(frozen=True)
class LRUConfig(MixerConfig):
  """LRU options (defaults: minimal-LRU ``lru/model.py`` ``LRU``, d_state excepted).

  Attributes:
    d_state: N, the number of complex states.
    r_min, r_max: the ring |λ| ∈ [r_min, r_max] of the initial eigenvalues (|λ|² uniform).
    max_phase: the initial phases arg λ are uniform on [0, max_phase].
    bidirectional: add a reverse scan with its own output matrix (ignored when ``causal``).
  """

  d_state: int = 256
  r_min: float = 0.0
  r_max: float = 1.0
  max_phase: float = 6.28
  bidirectional: bool = False

  paper_name: ClassVar[str | None] = "LRU"
  family: ClassVar[str] = "ssm"

  def __post_init__(self):
    # |λ|² = u (r_max² − r_min²) + r_min², u ~ U[0, 1): a ring inside the unit circle only for
    # 0 <= r_min <= r_max <= 1 and r_min < 1 (r_max > 1 gives |λ| > 1 and γ = √(1 − |λ|²) a NaN at step 1).
    if not (0.0 <= self.r_min <= self.r_max <= 1.0 and self.r_min < 1.0):
      raise ValueError(f"lru: need 0 <= r_min <= r_max <= 1 and r_min < 1 (the ring |λ| ∈ [r_min, r_max] of the "
                       f"initial eigenvalues), got r_min={self.r_min}, r_max={self.r_max}")
    if not self.max_phase > 0.0:
      raise ValueError(f"lru: max_phase must be > 0 (θ_log = log(max_phase · u)), got {self.max_phase}")
    if self.d_state < 1:
      raise ValueError(f"lru: d_state must be >= 1, got {self.d_state}")

  def state_size(self, length: int, d_model: int) -> int:
    """2·d_state: N complex states (real and imaginary parts) per example and layer."""
    del length, d_model
    return 2 * self.d_state


def nu_log_init(key, shape, r_min, r_max, dtype=jnp.float32):
  """ν_log = log(−½ log(u (r_max² − r_min²) + r_min²)), u ~ U[0, 1): |λ|² = exp(−2ν) ~ U[r_min², r_max²]."""
  u = jax.random.uniform(key, shape, dtype)
  return jnp.log(-0.5 * jnp.log(u * (r_max**2 - r_min**2) + r_min**2))


def theta_log_init(key, shape, max_phase, dtype=jnp.float32):
  """θ_log = log(max_phase · u), u ~ U[0, 1)."""
  return jnp.log(max_phase * jax.random.uniform(key, shape, dtype))


def gamma_log_init(nu_log, theta_log):
  """γ_log = log √(1 − |λ|²) for the eigenvalues of ``nu_log``, ``theta_log`` (the normalisation at
  initialisation; a trainable parameter afterwards)."""
  return jnp.log(jnp.sqrt(1.0 - jnp.abs(eigenvalues(nu_log, theta_log)) ** 2))


def eigenvalues(nu_log, theta_log):
  """λ = exp(−exp(ν_log) + i·exp(θ_log)) [N] (complex)."""
  return jnp.exp(-jnp.exp(nu_log) + 1j * jnp.exp(theta_log))


def linear_recurrence(lam, bu, reverse=False, method=None):
  """All states x_k = λ ⊙ x_{k∓1} + bu_k of one diagonal recurrence, x = 0 before the first step
  (``_scan.diagonal_recurrence``: the associative scan, or on a CPU the faster sequential one).

  Args:
    lam: [N] complex diagonal.
    bu: [B, L, N] complex inputs.
    reverse: scan from the last position to the first.
    method: "associative", "sequential" or None (by backend).
  Returns:
    [B, L, N] the states.
  """
  return _scan.diagonal_recurrence(lam, bu, reverse=reverse, method=method)


@register_mixer("lru", LRUConfig)
class LRU(nn.Module):
  """The LRU layer: LRU → GELU → dropout → GLU → dropout (module docstring)."""

  config: LRUConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    _, _, h = x.shape
    n = cfg.d_state
    real = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    if mask is None:
      mask = jnp.ones(x.shape[:2], bool)
    keep = mask[..., None]
    u = jnp.where(keep, x, 0).astype(real)  # padded positions feed nothing into the scans

    nu_log = self.param("ssm_nu_log", nu_log_init, (n,), cfg.r_min, cfg.r_max)
    theta_log = self.param("ssm_theta_log", theta_log_init, (n,), cfg.max_phase)
    gamma_log = self.param("ssm_gamma_log", lambda _key: gamma_log_init(nu_log, theta_log))
    b_re = self.param("ssm_B_re", nn.initializers.normal((2 * h) ** -0.5), (n, h))
    b_im = self.param("ssm_B_im", nn.initializers.normal((2 * h) ** -0.5), (n, h))
    c_re = self.param("C_re", nn.initializers.normal(n ** -0.5), (h, n))
    c_im = self.param("C_im", nn.initializers.normal(n ** -0.5), (h, n))
    d = self.param("D", nn.initializers.normal(1.0), (h,))

    lam = eigenvalues(nu_log.astype(real), theta_log.astype(real))
    gamma = jnp.exp(gamma_log.astype(real))[:, None]
    bu = (jnp.einsum("blh,nh->bln", u, gamma * b_re.astype(real))
          + 1j * jnp.einsum("blh,nh->bln", u, gamma * b_im.astype(real)))

    def read(states, cr, ci):  # Re(C x) = C_re Re x − C_im Im x
      return (jnp.einsum("bln,hn->blh", states.real, cr.astype(real))
              - jnp.einsum("bln,hn->blh", states.imag, ci.astype(real)))

    y = read(linear_recurrence(lam, bu), c_re, c_im) + d.astype(real) * u
    if cfg.bidirectional and not cfg.causal:
      cb_re = self.param("C_b_re", nn.initializers.normal(n ** -0.5), (h, n))
      cb_im = self.param("C_b_im", nn.initializers.normal(n ** -0.5), (h, n))
      y = y + read(linear_recurrence(lam, bu, reverse=True), cb_re, cb_im)

    y = nn.Dropout(cfg.dropout_rate, broadcast_dims=(1,))(nn.gelu(y), deterministic=deterministic)
    y = nn.Dense(h, dtype=real, name="out1")(y) * jax.nn.sigmoid(nn.Dense(h, dtype=real, name="out2")(y))
    y = nn.Dropout(cfg.dropout_rate, broadcast_dims=(1,))(y, deterministic=deterministic)
    return jnp.where(keep, y, 0).astype(x.dtype)
