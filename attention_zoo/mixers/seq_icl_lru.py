"""seq_icl's "LRU": the gated linear recurrent layer of berlino/seq_icl's associative-recall and
induction-head table (``src/models/sequence/rnn/lru.py`` ``LRULayer`` at commit ec42595, the commit that
wrote the table's LRU numbers, AR 11.6 / IH 4.8; run by ``complex_scan`` of
``rnn/scan_triton/complex_rnn.py``).

It is not the LRU paper's layer (the ``lru`` mixer, minimal-LRU): it has no B and C matrices and no D
skip; the recurrence runs on one complex channel per feature, fed by an input projection, and is read
through a SiLU gate, a LayerNorm and an output projection. The seq_icl table calls it "LRU"; the report
puts that row beside this mixer, never beside ``lru``.

Axis legend: ``B`` batch, ``L`` length, ``H`` features (d_model); the state has H complex entries.

Equations (input ``x [B, L, H]``)::

    [v, o]      = in_proj(x)                     in_proj: H -> 4H;  v, o: [B, L, 2H]
    [v_re, v_im] = v                              each [B, L, H]
    λ           = exp(−exp(ν_log)) · exp(i·exp(θ_log))    [H]
    γ           = exp(γ_log)                               [H]
    h_k         = λ ⊙ h_{k−1} + γ ⊙ (v_re,k + i·v_im,k),   h_0 = 0   (complex, [B, L, H])
    out         = out_proj(LayerNorm(dropout([Re h, Im h] ⊙ SiLU(o))))    out_proj: 2H -> H

The recurrence is ``_scan.diagonal_recurrence`` (the associative scan, or on a CPU the sequential one)
in float32 / complex64 (float64 / complex128 for float64 input); the output is cast back to ``x``'s dtype.

Initialisation and defaults reproduced from the original (``LRULayer.initializer`` and ``__init__``; the
model's ``_init_weights`` in ``simple_lm.py``):

- u1, u2 ~ U[0, 1) per feature; ν_log = log(−½·log(u1 (r_max² − r_min²) + r_min²)) with r_min = 0.9,
  r_max = 0.999 (|λ|² uniform on [0.81, 0.998]); θ_log = log(2π · u2); γ_log = log √(1 − |λ|²).
- in_proj and out_proj: N(0, 0.02) weights and zero biases (``_init_weights`` re-initialises every
  ``nn.Linear`` of the model so).
- LayerNorm over the 2H features, ε = 1e-5 (torch's default), with scale and bias.
- dropout 0.2 (the layer's default; the experiment configs do not set it): ``dropout_rate`` here, which
  the harness sets from the model's ``dropout_rate`` unless ``attention_kwargs`` gives it; the ``seq_icl``
  protocol gives 0.2.
- ν_log, θ_log and γ_log are ordinary parameters (the original gives them no optimizer group of their
  own: the global learning rate and weight decay), so they carry no ``ssm_`` prefix.

Differences from the original:

- Padding is masked: the input of the recurrence is zeroed at padded positions and the outputs there
  are zeroed (the original has no padding: its synthetic sequences all have the same length). The layer
  is causal as it stands (a forward scan); ``causal`` changes nothing.
- ``_init_weights`` also rescales every ``out_proj.weight`` to N(0, 0.02 / sqrt(2 · n_layers)) (GPT-2's
  residual scaling), the LRU layer's included; this mixer does not know the model's depth: its
  ``out_init_std`` (default 0.02) is that standard deviation, which the ``seq_icl`` protocol sets to
  0.02 / sqrt(2 · 2) = 0.01.
- The initial u1, u2 come from the ``params`` key, not from numpy's unseeded global generator.
- The original's Triton scan needs H to be a multiple of its block (32) and runs only on a GPU; this one
  takes any H.

State for causal generation (``state_size``): H complex states per layer = 2H real numbers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo.registry import MixerConfig, register_mixer
from attention_zoo.mixers.lru import (eigenvalues, gamma_log_init, linear_recurrence, nu_log_init,
                                      theta_log_init)

# Linear layers of the model: N(0, initializer_range) weights, zero biases (simple_lm._init_weights).
INITIALIZER_RANGE = 0.02


@dataclasses.dataclass(frozen=True)
class SeqIclLRUConfig(MixerConfig):
  """seq_icl ``LRULayer`` options (defaults: the original's ``initializer``).

  Attributes:
    r_min, r_max: the ring |λ| ∈ [r_min, r_max] of the initial eigenvalues (|λ|² uniform).
    max_phase: the initial phases arg λ are uniform on [0, max_phase].
    out_init_std: the standard deviation of out_proj's N(0, std²) kernel (GPT-2's rescaled residual
      output is 0.02 / sqrt(2 · n_layers)).
  """

  r_min: float = 0.9
  r_max: float = 0.999
  max_phase: float = 2 * math.pi
  out_init_std: float = INITIALIZER_RANGE

  paper_name: ClassVar[str | None] = "LRU (seq_icl's gated layer)"
  family: ClassVar[str] = "ssm"

  def __post_init__(self):
    if not 0.0 <= self.r_min <= self.r_max <= 1.0:
      raise ValueError(f"seq_icl_lru: need 0 <= r_min <= r_max <= 1, got {self.r_min}, {self.r_max}")
    if not self.max_phase > 0.0:
      raise ValueError(f"seq_icl_lru: max_phase must be > 0, got {self.max_phase}")
    if not self.out_init_std > 0.0:
      raise ValueError(f"seq_icl_lru: out_init_std must be > 0, got {self.out_init_std}")

  def state_size(self, length: int, d_model: int) -> int:
    """2·d_model: one complex state (real and imaginary parts) per feature, whatever the length."""
    del length
    return 2 * d_model


def _dense(features: int, name: str, dtype, std: float = INITIALIZER_RANGE) -> nn.Dense:
  return nn.Dense(features, dtype=dtype, name=name, kernel_init=nn.initializers.normal(std),
                  bias_init=nn.initializers.zeros)


@register_mixer("seq_icl_lru", SeqIclLRUConfig)
class SeqIclLRU(nn.Module):
  """in_proj → gated complex diagonal recurrence → SiLU gate → dropout → LayerNorm → out_proj."""

  config: SeqIclLRUConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    h = x.shape[-1]
    real = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    if mask is None:
      mask = jnp.ones(x.shape[:2], bool)
    keep = mask[..., None]

    nu_log = self.param("nu_log", nu_log_init, (h,), cfg.r_min, cfg.r_max)
    theta_log = self.param("theta_log", theta_log_init, (h,), cfg.max_phase)
    gamma_log = self.param("gamma_log", lambda _key: gamma_log_init(nu_log, theta_log))

    u = _dense(4 * h, "in_proj", real)(x.astype(real))
    v, o = jnp.split(u, 2, axis=-1)
    v_re, v_im = jnp.split(jnp.where(keep, v, 0), 2, axis=-1)   # padded positions feed nothing
    gamma = jnp.exp(gamma_log.astype(real))
    states = linear_recurrence(eigenvalues(nu_log.astype(real), theta_log.astype(real)),
                               gamma * v_re + 1j * (gamma * v_im))
    y = jnp.concatenate([states.real, states.imag], axis=-1) * jax.nn.silu(o)
    y = nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
    y = nn.LayerNorm(epsilon=1e-5, dtype=real, name="layer_norm")(y)
    y = _dense(h, "out_proj", real, cfg.out_init_std)(y)
    return jnp.where(keep, y, 0).astype(x.dtype)
