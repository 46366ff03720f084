"""FNet: parameter-free Fourier token mixing (Lee-Thorp et al. 2022). O(L log L) per feature.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim.

FNet replaces self-attention by ``Y = Re(FFT_seq(FFT_hidden(X)))``, a 2-D discrete Fourier transform of
the [L, d_model] activations whose real part is kept. As an attention core it IGNORES ``query`` and
``key`` and mixes the ``value`` [B, L, H, V]::

    Y[b, :, :, v] = Re(DFT_L · X[b, :, :, v] · DFT_H)        (mix_heads=True, the default)
    Y[b, :, h, v] = Re(DFT_L · X[b, :, h, v])                  (mix_heads=False)

with X the values with padded positions set to zero, ``DFT_n[j, k] = exp(−2πi·jk/n)`` (unnormalised,
as ``jnp.fft``). The "hidden" axis of the 2-D transform is the head axis: every feature index v of every
head is mixed over positions and across heads, never across the V features of one head. Reason: the
contract of a core is a map ``out = P ⊗ values`` whose effective matrix P (the ``value = eye(L)`` probe,
one head) is read per feature; a DFT over V would mix the probe's columns and make padded "keys" of the
probe look used. The model's value and output projections (which FNet does not have) already mix the
features linearly; what the head-axis transform adds is the imaginary-part coupling
``Re(F_L X F_H) = Re(F_L) X Re(F_H) − Im(F_L) X Im(F_H)`` that a sequence-only transform lacks. With one
head (or ``mix_heads=False``) the effective matrix is ``cos(2π·ij/L)`` on real columns.

The effective matrix is neither non-negative nor row-stochastic (declared), zero on padded columns.

Differences from the reference code (google-research ``f_net/models.py`` + ``layers.FourierTransform``,
``fourier.two_dim_matmul``):

- **Hidden axis**: the heads (see above), not d_model; there is no per-head V transform.
- **Padding**: FNet mixes every position, pad tokens' embeddings included (the input mask is "only used
  by BERT"). Here padded values are zeroed before the transform, so real outputs do not depend on what
  padded positions contain and padded keys get exactly zero weight. They still depend on the padded
  LENGTH: the sequence DFT has the array length L (as in FNet, which transforms the full
  ``max_seq_length``), so the same sentence padded to 1K or 4K is mixed with different frequencies. In
  the LRA comparison every example of a task is padded to the task's fixed length, as in FNet, so this
  only matters when comparing runs at different maximum lengths.
- **Transform**: always ``jnp.fft.fftn`` (FNet's GPU/CPU path); FNet's TPU path for short sequences uses
  precomputed DFT matrices (``scipy.linalg.dft``) and two matmuls, which is the same map up to rounding.
  Computed in float32 (float64 for float64 inputs); bfloat16 inputs are cast up and the result back.
- **Dropout** (FNet's mixing layer has none): ``dropout_rate`` is inverted dropout on the value
  entries before the transform (each kept with prob ``1−p`` and scaled by ``1/(1−p)``): the map is
  linear, so the output is unbiased.
- **Causal**: no causal form (the DFT is global): ``causal=True`` raises NotImplementedError.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class FNetConfig(AttentionConfig):
  """Fourier mixing of the values (queries and keys unused).

  Attributes:
    mix_heads: 2-D DFT over (length, heads) (True, FNet's seq × hidden transform with heads as the
      hidden axis) or a DFT over the length only, per head and feature (False).
  """

  family = "mixing"
  no_causal_form = "the Fourier transform mixes every position, future ones included"
  mix_heads: bool = True
  nonnegative = False
  rows_sum_to_one = False
  ignores = ("query", "key")  # Fourier mixing of the values only


def fourier_mix(values: jax.Array, mix_heads: bool) -> jax.Array:
  """``Re(fftn(values))`` over the length axis (1) and, with ``mix_heads``, the head axis (2) of
  values [B, L, H, V], computed in float32 or wider. Returns the wide real part."""
  axes = (1, 2) if mix_heads else (1,)
  return jnp.fft.fftn(values.astype(_common.accum_dtype(values)), axes=axes).real


@register_attention("fnet", FNetConfig)
class FNetAttention(nn.Module):
  """Re(DFT) token mixing of the values; see the module docstring."""

  config: FNetConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D] (unused); value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    del key
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("fnet mixes every position with a global Fourier transform (no causal form)")
    batch, length = query.shape[:2]
    mask = _common.default_mask(mask, batch, length)
    values = jnp.where(mask[:, :, None, None], value, jnp.zeros((), value.dtype))
    values = _common.apply_dropout(values, cfg.dropout_rate, deterministic)
    return fourier_mix(values, cfg.mix_heads).astype(value.dtype)
