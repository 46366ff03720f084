"""Mega: moving-average equipped gated attention (Ma et al., "Mega: Moving Average Equipped Gated
Attention", ICLR 2023), registered as ``mega`` (attention over the whole sequence) and ``mega_chunk``
(Mega-chunk: attention within chunks of ``chunk_size`` = 128 positions).

Axis legend: ``B`` batch, ``L`` length, ``D`` model dim, ``Z`` shared query/key dim (``z_dim``), ``V``
hidden (value) dim (``hidden_dim``), ``N`` EMA dim per channel (``ema_dim``), ``C`` chunk length, ``K``
EMA kernel channels (2·D bidirectional, D otherwise), ``T`` EMA kernel length (``min(truncation, L)``).

Equations (x: [B, L, D], padded positions zeroed; ``residual``: the block input before normalisation):

- Multi-dimensional damped EMA (``MultiHeadEMA``), per channel d and EMA dim n, with p = σ(δ),
  q = 1 − p·σ(α) (both [K, N])::

      h_t = p ⊙ β ⊙ x_t + q ⊙ h_{t−1},     y_t = Σ_n γ_n · √(1/N) · h_{t,n}

  i.e. the convolution y = K * x with K_l = Σ_n p_n β_n q_n^l γ_n √(1/N) (l < T), computed by FFT.
  Bidirectional (channels 0..D−1 forward, D..2D−1 backward): y_t = Σ_{s≤t} K¹_{t−s} x_s +
  Σ_{s≥t} K²_{s−t} x_s (both directions include lag 0, as the original's main branch). Then
  ``mx = SiLU(y + ω ⊙ x)`` (the SiLU is inside the EMA module, as in the original).
- Gated attention::

      v = SiLU(x W_v + b_v)                                         [B, L, V]
      u, zr, hx = split(dropout(mx) W_mx + b_mx, [D, Z + V, D])
      φ = σ(u);  z, r = split(SiLU(zr), [Z, V])
      q = z ⊙ γ_0 + β_0,  k = z ⊙ γ_1 + β_1                        [B, L, Z]
      softmax:        A = softmax(q kᵀ / √Z + b_rel)  (padded keys: weight 0)
      laplace/relu2:  A = f(q kᵀ / n + b_rel) ⊙ allowed,  n = number of allowed real keys of the row,
                      laplace f(s) = ½[1 + erf((s − μ)/(σ√2))], μ = 0.707107, σ = 0.282095
                      (√½ and √(1/(4π)) as the original writes them); relu2 f(s) = relu(s)²
      Ĥ = SiLU(hx + ((dropout_att(A) · dropout_hid(v)) ⊙ r) W_h + b_h)
      return φ ⊙ (dropout(Ĥ) − residual)     (the block output is residual + this: Mega's
                                               ``torch.addcmul(residual, u, h - residual)``)

  b_rel[i, j] = w[M − 1 + j − i] (``SimpleRelativePositionalBias``, w ∈ R^{2M−1}; M = ``max_positions``,
  or ``chunk_size`` for the chunked form). Chunked: q, k, v are cut into chunks of C = min(chunk_size, L)
  positions (the sequence padded internally to a multiple of C, the padding masked) and attention runs
  within each chunk only; the EMA runs over the whole sequence.
- ``attention`` = the name of a registered attention core: A·v is replaced by that core, called once per
  chunk as a single head, ``core(q [B', C, 1, Z], k [B', C, 1, Z], v [B', C, 1, V], mask)`` with
  ``causal`` = this config's ``causal`` and ``dropout_rate`` = ``attention_dropout_rate`` (unless
  ``attention_kwargs`` sets it). No relative position bias is added then (a core takes no logit bias),
  no ``rel_pos_bias`` parameter exists, and the core's own scaling applies (``vanilla``: 1/√Z, which is
  Mega's softmax scaling, so ``attention="vanilla"`` is the built-in softmax path with b_rel = 0).

``causal=True``: the EMA is unidirectional (``bidirectional`` is ignored; K = D kernel channels) and the
attention (within each chunk for ``mega_chunk``) is masked causally; the output at i depends on j ≤ i only.

Defaults reproduced from the original (facebookresearch/mega, main branch):

- ``fairseq/modules/exponential_moving_average.py`` (``MultiHeadEMA``): δ, α ~ N(0, 0.2²);
  β ~ N(0, 0.02²) + [1, −1, 1, −1, …]; γ ~ N(0, 1); ω ~ N(0, 1); p = σ(δ), q = 1 − p·σ(α); scale √(1/N);
  kernel length min(truncation, L) (None: L); ``silu(conv + ω x)``.
- ``fairseq/modules/moving_average_gated_attention.py`` (``MovingAverageGatedAttention``): W_v, W_mx, W_h
  ~ N(0, 0.02²) with zero biases; γ ~ N(0, 0.02²), β = 0 ([2, Z]); softmax scaling Z^{-1/2} on q;
  laplace/relu2 divide q kᵀ by the number of real keys (clamped at 1) without the Z scaling; dropout on
  the EMA output and on Ĥ, hidden dropout on v, attention dropout on A; SiLU activations;
  ``max_positions`` = 1024 (the original's LRA configs set it to the sequence length, 2002 / 4002: so
  does protocol ``mega``; elsewhere ``--set model.attention_kwargs.max_positions=L``).
- ``fairseq/modules/relative_positional_bias.py`` (``SimpleRelativePositionalBias``): 2M − 1 weights
  ~ N(0, 0.02²), M = chunk size when chunked.
- ``fairseq/models/lra/model.py`` (``mega_lra_listop``): Z = 64, V = 160, N = 16 (the defaults here);
  ``fairseq/modules/mega_sentence_encoder_layer.py``: the LRA encoder's EMA is bidirectional.

Differences from the original:

- Padding: the original's softmax path gives every key of a fully padded chunk weight (its
  ``padding_mask_all`` trick against NaN); here such rows (padded queries only) get zero attention. The
  original computes the EMA's ω·x on the unmasked input; here the input is masked first (the encoder
  zeroes padded positions anyway). The returned update is zeroed at padded positions (the original
  leaves values there; its LRA encoder masks them at the end). Outputs at real positions are unchanged.
- Chunking: the original requires L to be a multiple of the chunk size (its LRA encoder pads the tokens);
  here the attention inputs are padded internally (masked). L < chunk_size uses one chunk of L positions,
  as the original does.
- laplace/relu2 with ``causal``: the original divides by the causal mask's row sum (i + 1 within the
  chunk, padding included); here by the number of allowed real keys (the same at every real position).
- Normalisation and the feed-forward sub-layer belong to the encoder block (the original's
  ``MovingAverageGatedAttention`` owns its norm and ``prenorm`` flag); incremental decoding state is not
  implemented (``state_size`` declares its size); only the ``simple`` relative bias (no ``rotary``) and
  only SiLU activations; no feature dropout.
- δ, α, β are stored as [K, N] (the original [K, N, 1]). The FFT uses a circular two-sided kernel of
  length L + T instead of the original's zero-padded 2(L + T − 1): the same linear convolution.
  ``truncation`` ≤ 0 also means no truncation.
- The January 2023 variant of ``MultiHeadEMA`` on another branch of the original (p = σ(α), and a
  ``shift`` option starting the backward kernel at lag 1) is not reproduced; this follows the main branch.
- Mega trains every parameter alike (one learning rate and weight decay), so no parameter uses the
  ``ssm_`` prefix.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import MixerConfig, register_mixer

ATTENTION_FNS = ("softmax", "laplace", "relu2")
# The original's ``utils.laplace`` constants: μ ≈ √½, σ ≈ √(1/(4π)), as literals.
LAPLACE_MU = 0.707107
LAPLACE_SIGMA = 0.282095


@dataclasses.dataclass(frozen=True)
class MegaConfig(MixerConfig):
  """Mega (moving-average equipped gated attention) over the whole sequence.

  Attributes:
    z_dim: Z, the shared query/key dim (original ``zdim``; LRA ListOps 64).
    hidden_dim: V, the value / hidden dim (original ``hdim``; LRA ListOps 160 with D = 80, i.e. 2·D).
    ema_dim: N, the EMA dimension per channel (original ``ndim``; LRA 16).
    attention_fn: ``"softmax"``, ``"laplace"`` or ``"relu2"`` (original ``attention_activation``).
    bidirectional: two EMA directions (the LRA encoder's setting); ignored when ``causal``.
    truncation: EMA kernel length limit; None (or ≤ 0) = the whole sequence.
    chunk_size: attention within chunks of this many positions; None = the whole sequence.
    max_positions: M, the relative bias's range when not chunked (L must not exceed it).
    attention: name of a registered attention core replacing softmax/laplace (no relative bias then).
    attention_kwargs: (key, value) pairs for that core's config.
    attention_dropout_rate: dropout on the attention weights (original ``attention_dropout``).
    hidden_dropout_rate: dropout on v (original ``hidden_dropout``).
    dropout_rate (inherited): dropout on the EMA output and on Ĥ (original ``dropout``).
  """

  z_dim: int = 64
  hidden_dim: int = 160
  ema_dim: int = 16
  attention_fn: str = "softmax"
  bidirectional: bool = True
  truncation: int | None = None
  chunk_size: int | None = None
  max_positions: int = 1024
  attention: str | None = None
  attention_kwargs: tuple = ()
  attention_dropout_rate: float = 0.0
  hidden_dropout_rate: float = 0.0

  paper_name = "Mega"
  family = "gated-ema"
  gated_residual = True

  def __post_init__(self):
    # Checked when the config is made (``lra-bench`` validates a run's config before any data is read).
    if self.attention_fn not in ATTENTION_FNS:
      raise ValueError(f"Mega: attention_fn must be one of {ATTENTION_FNS}, got {self.attention_fn!r}")
    if self.chunk_size is not None and self.chunk_size < 1:
      raise ValueError(f"Mega: chunk_size must be None or >= 1, got {self.chunk_size}")
    if self.max_positions < 1:
      raise ValueError(f"Mega: max_positions must be >= 1, got {self.max_positions}")
    for name in ("z_dim", "hidden_dim", "ema_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"Mega: {name} must be >= 1, got {getattr(self, name)}")

  def state_size(self, length: int, d_model: int) -> int:
    """D·N + S·(Z + V), S = L (mega) or min(L, C) (mega_chunk): causal generation keeps the
    unidirectional EMA state (N per channel) and the keys and values of the positions the next query
    attends to (every past position; for the chunked form those of the current chunk, at most C)."""
    span = length if self.chunk_size is None else min(length, self.chunk_size)
    return d_model * self.ema_dim + span * (self.z_dim + self.hidden_dim)


@dataclasses.dataclass(frozen=True)
class MegaChunkConfig(MegaConfig):
  """Mega-chunk: :class:`MegaConfig` with attention within chunks of ``chunk_size`` = 128 positions."""

  chunk_size: int | None = 128

  paper_name = "Mega-chunk"


def _beta_init(key, shape, dtype=jnp.float32):
  """N(0, 0.02²) + [1, −1, 1, −1, …] along the EMA dim (the original's "more stable" init)."""
  sign = jnp.where(jnp.arange(shape[-1]) % 2 == 0, 1.0, -1.0).astype(dtype)
  return jax.random.normal(key, shape, dtype) * 0.02 + sign


def ema_kernel(delta, alpha, beta, gamma, length: int, dtype) -> jax.Array:
  """[K, T]: K_l = Σ_n p_n β_n q_n^l γ_n √(1/N), p = σ(δ), q = 1 − p·σ(α); parameters [K, N]."""
  delta, alpha, beta, gamma = (a.astype(dtype) for a in (delta, alpha, beta, gamma))
  p = jax.nn.sigmoid(delta)
  q = 1.0 - p * jax.nn.sigmoid(alpha)
  powers = jnp.exp(jnp.arange(length, dtype=dtype)[None, None, :] * jnp.log(q)[..., None])  # [K, N, T]
  scale = math.sqrt(1.0 / delta.shape[-1])
  return jnp.einsum("knt,kn->kt", powers, p * beta * gamma * scale)


class MultiHeadEMA(nn.Module):
  """Mega's multi-dimensional damped EMA: x [B, L, D] (padding zeroed here) -> SiLU(K * x + ω x)."""

  ndim: int
  bidirectional: bool
  truncation: int | None = None

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    batch, length, dim = x.shape
    channels = 2 * dim if self.bidirectional else dim
    shape = (channels, self.ndim)
    delta = self.param("delta", nn.initializers.normal(0.2), shape)
    alpha = self.param("alpha", nn.initializers.normal(0.2), shape)
    beta = self.param("beta", _beta_init, shape)
    gamma = self.param("gamma", nn.initializers.normal(1.0), shape)
    omega = self.param("omega", nn.initializers.normal(1.0), (dim,))

    acc = _common.accum_dtype(x)
    x = jnp.where(mask[..., None], x, 0).astype(acc)
    trunc = self.truncation
    size = length if trunc is None or trunc < 1 else min(trunc, length)
    kernel = ema_kernel(delta, alpha, beta, gamma, size, acc)                 # [K, T]
    n = length + size  # >= L + T - 1: the circular convolution below equals the linear one
    if self.bidirectional:
      forward, backward = kernel[:dim], kernel[dim:]
      # index l: forward lag l (and backward lag 0); index n − l: backward lag l (1 <= l < T).
      head = forward.at[:, 0].add(backward[:, 0])
      kernel = jnp.concatenate([head, jnp.zeros((dim, n - 2 * size + 1), acc),
                                jnp.flip(backward[:, 1:], axis=-1)], axis=-1)  # [D, n]
    conv = jnp.fft.irfft(jnp.fft.rfft(x, n=n, axis=1) * jnp.fft.rfft(kernel.T, n=n, axis=0)[None],
                         n=n, axis=1)[:, :length]
    return nn.silu(conv + x * omega.astype(acc))


def _laplace(s):
  return 0.5 * (1.0 + jax.lax.erf((s - LAPLACE_MU) / (LAPLACE_SIGMA * math.sqrt(2.0))))


def relative_bias(weights: jax.Array, size: int) -> jax.Array:
  """[size, size]: b[i, j] = w[M − 1 + j − i] (``SimpleRelativePositionalBias``, w of length 2M − 1)."""
  m = (weights.shape[0] + 1) // 2
  if size > m:
    raise ValueError(f"Mega: sequence length {size} goes beyond max_positions {m} (set max_positions >= "
                     "the length, as the original's LRA configs do with 2002 and 4002, or chunk_size)")
  pos = jnp.arange(size)
  return weights[m - 1 + pos[None, :] - pos[:, None]]


@register_mixer("mega", MegaConfig)
@register_mixer("mega_chunk", MegaChunkConfig)
class MovingAverageGatedAttention(nn.Module):
  """Mega's moving-average gated attention sub-layer (module docstring); returns φ ⊙ (Ĥ − residual)."""

  config: MegaConfig

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               residual: jax.Array | None = None) -> jax.Array:
    """x [B, L, D], mask bool [B, L] (True = real token), residual [B, L, D] (None: x) -> [B, L, D]."""
    c = self.config  # its options were checked when it was made (MegaConfig.__post_init__)
    batch, length, dim = x.shape
    dtype = x.dtype
    mask = _common.default_mask(mask, batch, length)
    residual = x if residual is None else residual
    x = jnp.where(mask[..., None], x, 0).astype(dtype)
    dense = functools.partial(nn.Dense, dtype=dtype, kernel_init=nn.initializers.normal(0.02),
                              bias_init=nn.initializers.zeros)

    v = nn.silu(dense(c.hidden_dim, name="v_proj")(x))                       # [B, L, V]
    mx = MultiHeadEMA(c.ema_dim, c.bidirectional and not c.causal, c.truncation, name="ema")(x, mask)
    mx = nn.Dropout(c.dropout_rate, name="dropout_ema")(mx.astype(dtype), deterministic)
    base = dense(c.z_dim + c.hidden_dim + 2 * dim, name="mx_proj")(mx)
    u, zr, hx = jnp.split(base, [dim, dim + c.z_dim + c.hidden_dim], axis=-1)
    u = jax.nn.sigmoid(u)
    z, r = jnp.split(nn.silu(zr), [c.z_dim], axis=-1)
    gamma = self.param("gamma", nn.initializers.normal(0.02), (2, c.z_dim))
    beta = self.param("beta", nn.initializers.zeros, (2, c.z_dim))
    q = (z * gamma[0] + beta[0]).astype(dtype)
    k = (z * gamma[1] + beta[1]).astype(dtype)
    v = nn.Dropout(c.hidden_dropout_rate, name="dropout_hidden")(v, deterministic)

    # Chunks: C = min(chunk_size, L); the attention inputs are padded to a multiple of C (masked).
    chunk = length if c.chunk_size is None else min(c.chunk_size, length)
    pad = lambda a: _common.pad_axis(a, chunk, axis=1)
    split = lambda a: a.reshape(batch, -1, chunk, a.shape[-1])
    qc, kc, vc = split(pad(q)), split(pad(k)), split(pad(v))                # [B, n, C, ·]
    keys = pad(mask).reshape(batch, -1, chunk)                                # [B, n, C]
    if c.attention is not None:
      out = self._core(qc, kc, vc, keys, deterministic)
    else:
      out = self._builtin(qc, kc, vc, keys, chunk, deterministic)
    out = out.reshape(batch, -1, c.hidden_dim)[:, :length]                   # [B, L, V]

    h = nn.silu(hx + dense(dim, name="h_proj")(out.astype(dtype) * r))
    h = nn.Dropout(c.dropout_rate, name="dropout_out")(h, deterministic)
    update = u * (h - residual.astype(dtype))
    return jnp.where(mask[..., None], update, 0).astype(dtype)

  def _builtin(self, q, k, v, keys, chunk, deterministic):
    """Mega's own attention within each chunk: q, k [B, n, C, Z], v [B, n, C, V] -> [B, n, C, V]."""
    c = self.config
    positions = c.max_positions if c.chunk_size is None else c.chunk_size
    weights = self.param("rel_pos_bias", nn.initializers.normal(0.02), (2 * positions - 1,))
    acc = _common.accum_dtype(q)
    bias = relative_bias(weights, chunk).astype(acc)                         # [C, C]
    allowed = keys[:, :, None, :]                                             # [B, n, 1, C]
    if c.causal:
      allowed = allowed & _common.causal_allowed(chunk, chunk)
    logits = jnp.einsum("bnqz,bnkz->bnqk", q, k, preferred_element_type=acc)
    if c.attention_fn == "softmax":
      attn = _common.masked_softmax(logits * c.z_dim ** -0.5 + bias, allowed)
    else:
      count = jnp.maximum(jnp.sum(allowed, axis=-1, keepdims=True), 1).astype(acc)
      scores = logits / count + bias
      act = _laplace(scores) if c.attention_fn == "laplace" else jnp.square(jax.nn.relu(scores))
      attn = act * allowed
    attn = nn.Dropout(c.attention_dropout_rate, name="dropout_attention")(attn, deterministic)
    return jnp.einsum("bnqk,bnkv->bnqv", attn.astype(v.dtype), v, preferred_element_type=acc)

  def _core(self, q, k, v, keys, deterministic):
    """A registered attention core as one head per chunk (no relative bias; the core's scaling)."""
    from attention_zoo import registry

    c = self.config
    overrides = {"dropout_rate": c.attention_dropout_rate, **dict(c.attention_kwargs), "causal": c.causal}
    core = registry.create_attention(c.attention, **overrides)
    core = type(core)(config=core.config, name="attention")
    batch, chunks, chunk = keys.shape
    flat = lambda a: a.reshape(batch * chunks, chunk, 1, a.shape[-1])
    keys = keys.reshape(batch * chunks, chunk)
    # A fully padded chunk (padded queries only) shows the core its first key: no core sees an empty row.
    keys = keys | (~jnp.any(keys, axis=-1, keepdims=True) & (jnp.arange(chunk) == 0))
    out = core(flat(q), flat(k), flat(v), mask=keys, deterministic=deterministic)
    return out.reshape(batch, chunks, chunk, -1)
