"""Nyströmformer: Nyström approximation of softmax attention (Xiong et al. 2021). O(L·m·(D + V)).

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``N`` / ``M`` landmarks (key-side / query-side index of an m×m matrix), ``S`` segment length,
``T`` convolution taps.

With ``q̃ = q·D^{-1/4}``, ``k̃ = k·D^{-1/4}`` and landmarks ``Q̃, K̃`` [m, D] = the means of q̃, k̃
over m contiguous segments of the sequence::

    out = softmax(q̃ K̃ᵀ) · pinv(softmax(Q̃ K̃ᵀ)) · (softmax(Q̃ k̃ᵀ) v)  +  conv(v)

where ``pinv`` is the iterative Moore-Penrose approximation :func:`iterative_pinv` (6 iterations of
``Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))``) and ``conv`` is a depthwise convolution of the values along
the length (``conv_kernel`` = 35 taps, one filter per head, no bias; the original's ``Conv2d`` with
``groups = heads``; parameter ``conv`` [T, H]; ``conv_kernel=0`` turns it off). No L×L matrix is
formed.

Segments: S = ceil(L / m) tokens each, ceil(L / S) ≤ m of them (the last one may be short; the original
required L divisible by m). A landmark is the mean over the *real* tokens of its segment; a segment
without real tokens gives no landmark: it is masked out of the two softmaxes over landmarks and its row
and column of ``softmax(Q̃ K̃ᵀ)`` are zero (the pseudo-inverse then keeps them zero). When L ≤ m the core
computes exact softmax attention (plus the convolution), as the original does when ``seq_len ==
num_landmarks``.

The effective matrix is neither non-negative nor row-stochastic (the pseudo-inverse has negative
entries, and the convolution adds a band of learned weights), so the config declares neither.

Differences from the original (mlpen/Nystromformer ``LRA/code/attention_nystrom.py``):

- **Pseudo-inverse initialisation**: the original (``init_option="original"``, the only one reachable:
  its config lookup of the other option has a misspelt key) uses ``Z₀ = Aᵀ / max(column sums)`` with
  ONE maximum over the whole batch and all heads, so one example's landmarks change another example's
  output. The default here is the per-matrix maximum (the original's other branch);
  ``pinv_init="batch"`` reproduces the batch-wide maximum.
- **Any length**: the original needed ``seq_len % num_landmarks == 0`` and counted padded tokens (as
  zero vectors) in the landmark means. Here segments have ceil(L/m) tokens, landmarks average real
  tokens only, and empty segments are masked as described above.
- **L ≤ m** takes the exact path (the original: only L == m; L < m was an error).
- **Dropout** (the original had none): the landmark-to-key softmax ``softmax(Q̃ k̃ᵀ)`` is dropped
  (unnormalized weights, normaliser undropped, as everywhere in the zoo). The output is linear in that
  matrix, so this is unbiased. The exact path drops its softmax weights.
- **Convolution init**: PyTorch's Conv2d default, U(±1/√conv_kernel); weights cast to the values' dtype.
- ``causal=True`` raises ``NotImplementedError``: segment means mix future positions into every landmark.
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class NystromformerConfig(AttentionConfig):
  """Nyströmformer options (defaults: 64 landmarks, 6 pinv iterations, 35-tap convolution).

  Attributes:
    num_landmarks: m, the (maximum) number of landmarks.
    conv_kernel: taps of the depthwise value convolution (odd), or 0 for none.
    pinv_iterations: iterations of :func:`iterative_pinv`.
    pinv_init: ``"per_matrix"`` (Z₀ scaled by each matrix's max column sum) or ``"batch"`` (the
      original: one maximum over batch and heads).
  """

  family = "low-rank"
  no_causal_form = "every landmark (a segment mean) mixes in future positions"
  nonnegative = False
  rows_sum_to_one = False

  num_landmarks: int = 64
  conv_kernel: int = 35
  pinv_iterations: int = 6
  pinv_init: str = "per_matrix"

  def __post_init__(self):
    if self.num_landmarks < 1:
      raise ValueError(f"nystromformer num_landmarks must be >= 1, got {self.num_landmarks}")
    if self.conv_kernel < 0 or (self.conv_kernel and self.conv_kernel % 2 == 0):
      raise ValueError(f"nystromformer conv_kernel must be 0 or odd, got {self.conv_kernel}")
    if self.pinv_iterations < 0:
      raise ValueError("nystromformer pinv_iterations must be >= 0")
    if self.pinv_init not in ("per_matrix", "batch"):
      raise ValueError(f"pinv_init must be 'per_matrix' or 'batch', got {self.pinv_init!r}")


@dataclasses.dataclass(frozen=True)
class Nystromformer32Config(NystromformerConfig):
  """Nyströmformer with 32 landmarks."""

  num_landmarks: int = 32


@dataclasses.dataclass(frozen=True)
class Nystromformer128Config(NystromformerConfig):
  """Nyströmformer with 128 landmarks."""

  num_landmarks: int = 128


@dataclasses.dataclass(frozen=True)
class Nystromformer256Config(NystromformerConfig):
  """Nyströmformer with 256 landmarks."""

  num_landmarks: int = 256


def iterative_pinv(matrix: jax.Array, iterations: int = 6, init: str = "per_matrix") -> jax.Array:
  """Approximate Moore-Penrose inverse of ``matrix`` [..., N, N] (Razavi et al. 2014, as Nyströmformer).

  ``Z₀ = Aᵀ / c`` with c the largest column sum of A (per matrix, or over every matrix when ``init ==
  "batch"``), then ``Z ← ¼ Z (13I − AZ (15I − AZ (7I − AZ)))``. Rows/columns of A that are zero stay zero
  in Z. Shared by Nyströmformer and Skyformer.
  """
  column_sums = jnp.sum(matrix, axis=-2)                                    # [..., N]
  scale = jnp.max(column_sums) if init == "batch" else jnp.max(column_sums, axis=-1)[..., None, None]
  z = jnp.swapaxes(matrix, -1, -2) / jnp.where(scale > 0, scale, 1.0)
  eye = jnp.eye(matrix.shape[-1], dtype=matrix.dtype)
  for _ in range(iterations):
    az = matrix @ z
    z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
  return z


def segment_means(x: jax.Array, mask: jax.Array, segment: int) -> tuple[jax.Array, jax.Array]:
  """Means over real tokens of consecutive segments: x [B, L, H, D] (L a multiple of ``segment``),
  mask [B, L] -> (means [B, N, H, D], non-empty bool [B, N]). Empty segments give zero vectors."""
  batch, length = mask.shape
  real = mask.reshape(batch, length // segment, segment).astype(x.dtype)
  sums = jnp.einsum("bnshd,bns->bnhd", x.reshape(batch, length // segment, segment, *x.shape[2:]), real)
  counts = jnp.sum(real, axis=-1)                                           # [B, N]
  return sums / jnp.where(counts > 0, counts, 1.0)[:, :, None, None], counts > 0


def nystrom_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array,
                      num_landmarks: int, *, pinv_iterations: int = 6, pinv_init: str = "per_matrix",
                      dropout=None) -> jax.Array:
  """The Nyström path (no convolution) for any L: q, k [B, L, H, D], v [B, L, H, V], mask bool [B, L]
  -> [B, L, H, V] in float32 or wider. ``dropout`` is a ``joint_masked_attention`` callback."""
  dtype = _common.accum_dtype(query, key)
  length = query.shape[1]
  segment = -(-length // num_landmarks)
  q, k = (x.astype(dtype) * x.shape[-1] ** -0.25 for x in (query, key))
  pq, pk, pmask = (_common.pad_axis(x, segment, axis=1, value=pad) for x, pad in
                   ((q, 0), (k, 0), (mask, False)))
  q_land, valid = segment_means(pq, pmask, segment)                         # [B, N, H, D], [B, N]
  k_land, _ = segment_means(pk, pmask, segment)
  land = valid[:, None, None, :]                                            # [B, 1, 1, N]
  core = _common.masked_softmax(jnp.einsum("bmhd,bnhd->bhmn", q_land, k_land), land)
  core = core * valid[:, None, :, None]                                     # empty rows -> 0
  inverse = iterative_pinv(core, pinv_iterations, pinv_init)                # [B, H, N, M]
  landmark_values = _common.masked_attention(                                # [B, H, M, V]
      jnp.einsum("bmhd,blhd->bhml", q_land, k), mask[:, None, None, :], value.astype(dtype),
      "bhml,blhv->bhmv", dropout)
  mixed = jnp.einsum("bhnm,bhmv->bhnv", inverse, landmark_values)
  out = _common.masked_attention(jnp.einsum("blhd,bnhd->bhln", q, k_land), land, mixed,
                                "bhln,bhnv->bhlv")
  return jnp.swapaxes(out, 1, 2)                                            # [B, L, H, V]


# Block length of ``depthwise_conv``'s banded matmul (at least taps - 1). Measured at the xiong ListOps
# shapes (B 32, L 2000, H 2, V 32, 35 taps; one XLA:CPU thread, fwd + bwd): 48 -> 214 ms, 64 -> 150 ms,
# 128 -> 180 ms; lax.conv_general_dilated with feature_group_count=H took 1396 ms.
CONV_BLOCK = 64


def depthwise_conv(value: jax.Array, weights: jax.Array) -> jax.Array:
  """Per-head convolution along L, zero-padded 'same': value [B, L, H, V], weights [T, H] (T odd) ->
  out[b, l, h, v] = Σ_t weights[t, h] · value[b, l + t − T//2, h, v].

  Computed as a banded matmul, not a grouped ``lax.conv``: the sequence is cut into N blocks of
  S = max(``CONV_BLOCK``, T − 1) outputs; block n reads the window of W = S + T − 1 (zero-padded)
  inputs it depends on, and ``out[n] = K[h] · window[n]`` with the band ``K[h][s, w] = weights[w − s, h]``
  (0 ≤ w − s < T, else 0) [H, S, W]. The same sums, ~W/T times the multiply-adds, but as dense matmuls:
  XLA:CPU ran the grouped convolution's gradients ~10x slower (measured numbers at ``CONV_BLOCK``).
  """
  batch, length, heads, dim = value.shape
  taps = weights.shape[0]
  half, block = taps // 2, max(CONV_BLOCK, taps - 1)
  blocks = -(-length // block)
  padded = jnp.pad(value, ((0, 0), (half, (blocks + 1) * block - length - half), (0, 0), (0, 0)))
  padded = padded.reshape(batch, blocks + 1, block, heads, dim)                 # [B, N+1, S, H, V]
  window = jnp.concatenate([padded[:, :blocks], padded[:, 1:, :taps - 1]], axis=2)  # [B, N, W, H, V]
  offset = np.arange(block + taps - 1)[None, :] - np.arange(block)[:, None]    # w - s, [S, W]
  band = jnp.where(jnp.asarray((offset >= 0) & (offset < taps))[None],
                   jnp.transpose(weights.astype(value.dtype))[:, np.clip(offset, 0, taps - 1)], 0)
  out = jnp.einsum("hsw,bnwhv->bnshv", band, window)                           # [B, N, S, H, V]
  return out.reshape(batch, blocks * block, heads, dim)[:, :length]


@register_attention("nystromformer", NystromformerConfig)
@register_attention("nystromformer_32", Nystromformer32Config)
@register_attention("nystromformer_128", Nystromformer128Config)
@register_attention("nystromformer_256", Nystromformer256Config)
class NystromformerAttention(nn.Module):
  """Nyström-approximated softmax attention plus a depthwise value convolution (module docstring)."""

  config: NystromformerConfig

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] -> [B, L, H, V]."""
    cfg = self.config
    if cfg.causal:
      raise NotImplementedError("nystromformer has no causal form: every landmark (a segment mean) "
                                "mixes in future positions")
    batch, length, heads, _ = query.shape
    mask = _common.default_mask(mask, batch, length)
    drop = _common.dropout_callback(cfg.dropout_rate, deterministic)
    if length <= cfg.num_landmarks:
      logits = _common.dot_logits(query, key, "bqhd,bkhd->bhqk")             # exact path, [B, H, L, L]
      out = jnp.swapaxes(_common.masked_attention(
          logits, mask[:, None, None, :], jnp.swapaxes(value, 1, 2), "bhqk,bhkv->bhqv", drop), 1, 2)
    else:
      out = nystrom_attention(query, key, value, mask, cfg.num_landmarks,
                              pinv_iterations=cfg.pinv_iterations, pinv_init=cfg.pinv_init, dropout=drop)
    if cfg.conv_kernel:
      bound = 1.0 / math.sqrt(cfg.conv_kernel)
      weights = self.param("conv", lambda rng, shape: jax.random.uniform(rng, shape, jnp.float32,
                                                                        -bound, bound),
                           (cfg.conv_kernel, heads))
      out = out + depthwise_conv(value * mask[:, :, None, None].astype(value.dtype), weights)
    return out.astype(value.dtype)
