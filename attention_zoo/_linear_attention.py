"""Feature-map ("linear") attention shared by Performer, the Linear Transformer, cosFormer, RFA and
Efficient Attention. O(L·M·V) time, O(L·M + L/C·M·V) memory. Registers nothing.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``M`` features, ``V`` value dim, ``N`` causal
chunks, ``C`` chunk length, ``Q`` / ``K`` query / key positions inside a chunk, ``P`` position blocks.

Given query features φ(q_i) and key features φ(k_j) [B, L, H, M] and optional per-key log scales r_j
[B, L, H], the attention computed is::

    out_i = Σ_j w_ij v_j / den_i,   w_ij = φ(q_i)·φ(k_j) · exp(r_j − s_i),   den_i = Σ_j w_ij

over the real keys j (all of them, or j ≤ i when causal). ``s_i`` is a stabilizer that cancels in the
ratio: the max of r over the keys query i sees (bidirectional: all real keys; causal: the running max
over real keys j ≤ i, so no future key can influence a past output, not even numerically). Without
log scales r = 0. Log scales serve two purposes: FAVOR+ keys normalised by their own maximum (r_j =
that maximum, so ``φ(k_j)·exp(r_j − s_i)`` never overflows or underflows wholesale), and RFA's gated
decay (r_j = log(1 − g_j) − Σ_{t≤j} log g_t).

- Bidirectional: ``φ(Q)(φ(K)ᵀV)`` and ``φ(Q)(φ(K)ᵀ1)``.
- Causal: chunked prefix sums. Inside a chunk of C positions the masked C×C products; across chunks the
  per-chunk states ``Σ_j φ(k_j) exp(r_j − s) v_jᵀ`` [B, N, H, M, V] and ``Σ_j φ(k_j) exp(r_j − s)``
  [B, N, H, M] are combined by an exclusive associative scan that rescales the running state whenever
  the running max s grows (a linear recurrence x_n = a_n x_{n−1} + u_n with a_n = exp(s_{n−1} − s_n)
  ≤ 1). Memory is linear in L (L/C states), never L×L.
- Padded keys get zero features (and never enter s), so they get exactly zero weight. ``mask=None``
  (every key real) skips the masking work.
- Dropout (``keep`` [B, L, H], e.g. ``Bernoulli(1−p)/(1−p)``) scales keys in the numerator only: in
  the effective matrix this is attention dropout with one mask per key shared by all queries,
  ``P_drop[i, j] = P[i, j]·keep_j``, unbiased.
- Denominator: ``den + eps``, then ``max(·, clamp)`` when ``clamp`` is given; a denominator that is
  exactly 0 (no real key visible) is replaced by 1, so such rows are 0. With log scales, eps and clamp
  apply to the stabilized denominator ``Σ_j φ(q_i)·φ(k_j)·exp(r_j − s_i)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from attention_zoo import _common


def key_dropout(rate: float, deterministic: bool, shape: tuple[int, ...], dtype) -> jax.Array | None:
  """``keep`` [B, L, H] for :func:`feature_attention` (flax ``"dropout"`` stream), or None when off.
  Call from a module's ``__call__``."""
  if rate <= 0.0 or deterministic:
    return None
  return _common.apply_dropout(jnp.ones(shape, dtype), rate, False)


def positional_blocks(features: jax.Array, weights: jax.Array) -> jax.Array:
  """Per-position re-weighting as extra feature blocks: ``[φ·w_1, …, φ·w_P]`` [B, L, H, P·M] from
  features [B, L, H, M] and weights [L, P] (e.g. cosFormer's sin/cos of the position)."""
  blocks = jnp.einsum("blhm,lp->blhpm", features, weights.astype(features.dtype))
  return blocks.reshape(*features.shape[:3], -1)


def _divide(numerator: jax.Array, denominator: jax.Array, eps: float, clamp: float | None) -> jax.Array:
  """numerator [..., V] / denominator [...] with the eps/clamp/empty-row rules of the module docstring
  (an einsum with the reciprocal, as ``_common.normalize``, but keeping negative denominators)."""
  denominator = denominator + eps
  if clamp is not None:
    denominator = jnp.maximum(denominator, clamp)
  denominator = jnp.where(denominator == 0, 1.0, denominator)
  return jnp.einsum("...v,...->...v", numerator, 1.0 / denominator)


def feature_attention(q_features: jax.Array, k_features: jax.Array, value: jax.Array,
                      mask: jax.Array | None, *, causal: bool = False, chunk: int = 64,
                      keep: jax.Array | None = None, k_log_scale: jax.Array | None = None,
                      eps: float = 0.0, clamp: float | None = None, heads_first: bool = False) -> jax.Array:
  """Feature-map attention (module docstring).

  q_features, k_features: [B, L, H, M]; value: [B, L, H, V]; mask: bool [B, L] (True = real key) or
  None (every key is real: no masking work at all); keep: [B, L, H] numerator-only key scaling
  (dropout); k_log_scale: r [B, L, H] (may carry gradients; the stabilizer s does not). Returns
  [B, L, H, V] in the features' dtype (or wider). ``heads_first``: every [B, L, H, ...] array above
  is [B, H, L, ...] instead, the layout in which the products over L need no transposes of the M-wide
  features (see ``attention_zoo/performer.py``); causal attention always runs in it internally.
  """
  dtype = jnp.result_type(q_features, k_features)
  q_features, k_features, value = (x.astype(dtype) for x in (q_features, k_features, value))
  if causal:  # laid out [B, H, L, ...] inside (see _causal)
    mask = _common.default_mask(mask, k_features.shape[0], k_features.shape[2 if heads_first else 1])
    to_heads = (lambda x: x) if heads_first else (lambda x: jnp.swapaxes(x, 1, 2))
    q_features, k_features, value = (to_heads(x) for x in (q_features, k_features, value))
    real = mask[:, None, :]                                                  # [B, 1, L]
    log_scale = jnp.zeros(k_features.shape[:3], dtype) if k_log_scale is None else to_heads(k_log_scale)
    keep = jnp.ones(k_features.shape[:3], dtype) if keep is None else to_heads(keep)
    out = _causal(q_features, k_features * real[..., None], value, keep,
                  jnp.where(real, log_scale.astype(dtype), _common.NEG_INF), chunk, eps, clamp)
    return to_heads(out)
  seq, length_axis = ("bhl", 2) if heads_first else ("blh", 1)
  real = None if mask is None else (mask[:, None, :] if heads_first else mask[:, :, None])  # like r
  if real is not None:
    k_features = k_features * real[..., None]
  if k_log_scale is not None:
    log_scale = k_log_scale.astype(dtype)
    if real is not None:
      log_scale = jnp.where(real, log_scale, _common.NEG_INF)
    peak = jax.lax.stop_gradient(jnp.max(log_scale, axis=length_axis, keepdims=True))
    k_features = k_features * jnp.exp(log_scale - peak)[..., None]
  if keep is not None:
    value = value * keep[..., None].astype(dtype)
  kv = jnp.einsum(f"{seq}m,{seq}v->bhmv", k_features, value)               # [B, H, M, V]
  numerator = jnp.einsum(f"{seq}m,bhmv->{seq}v", q_features, kv)
  denominator = jnp.einsum(f"{seq}m,bhm->{seq}", q_features, jnp.sum(k_features, axis=length_axis))
  return _divide(numerator, denominator, eps, clamp)


def _exclusive_rescaled_prefix(decay: jax.Array, states: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
  """x_n = decay_n·x_{n−1} + u_n along axis 2, returned shifted by one (x_{n−1}, x_{−1} = 0).
  decay [B, H, N]; states [B, H, N, ...]."""
  def combine(a, b):
    (da, *xa), (db, *xb) = a, b
    return (da * db, *(x2 + x1 * db.reshape(db.shape + (1,) * (x1.ndim - db.ndim))
                       for x1, x2 in zip(xa, xb)))

  _, *prefix = jax.lax.associative_scan(combine, (decay, *states), axis=2)
  return tuple(jnp.concatenate([jnp.zeros_like(p[:, :, :1]), p[:, :, :-1]], axis=2) for p in prefix)


def _causal(qf, kf, v, keep, log_scale, chunk, eps, clamp):
  """Causal :func:`feature_attention` by chunked, rescaled prefix sums, on [B, H, L, ...] arrays
  (heads first, so the per-chunk products need no transposes of the M-wide features)."""
  length = qf.shape[2]
  chunk = min(chunk, length)
  # Padding to a chunk multiple: zero features, log scale NEG_INF, so nothing is added.
  qf, kf, v, keep = (_common.pad_axis(x, chunk, axis=2) for x in (qf, kf, v, keep))
  log_scale = _common.pad_axis(log_scale, chunk, axis=2, value=_common.NEG_INF)
  running = jax.lax.stop_gradient(jax.lax.cummax(log_scale, axis=2))        # s_i [B, H, L']
  qf, kf, v, keep, log_scale, running = (x.reshape(*x.shape[:2], -1, chunk, *x.shape[3:])
                                         for x in (qf, kf, v, keep, log_scale, running))
  chunk_end = running[..., -1]                                               # [B, H, N]
  # Within each chunk: w_qk = φ(q)·φ(k)·exp(r_k − s_q) for k ≤ q.
  allowed = _common.causal_allowed(chunk, chunk)                              # [Q, K]
  exponent = log_scale[..., None, :] - running[..., :, None]                 # [B, H, N, Q, K]
  factor = jnp.exp(jnp.where(allowed, exponent, _common.NEG_INF))
  scores = jnp.einsum("bhnqm,bhnkm->bhnqk", qf, kf) * factor
  numerator = jnp.einsum("bhnqk,bhnkv->bhnqv", scores * keep[..., None, :], v)
  denominator = jnp.sum(scores, axis=-1)                                     # [B, H, N, Q]
  # Across chunks: chunk states relative to the running max at the chunk end, rescaled prefix.
  to_end = kf * jnp.exp(log_scale - chunk_end[..., None])[..., None]         # [B, H, N, K, M]
  kv = jnp.einsum("bhnkm,bhnkv->bhnmv", to_end, v * keep[..., None])         # [B, H, N, M, V]
  ksum = jnp.sum(to_end, axis=3)                                             # [B, H, N, M]
  previous_end = jnp.concatenate([jnp.full_like(chunk_end[..., :1], _common.NEG_INF), chunk_end[..., :-1]],
                                 axis=2)
  prefix_kv, prefix_k = _exclusive_rescaled_prefix(jnp.exp(previous_end - chunk_end), (kv, ksum))
  # prefix_* of chunk n is relative to the running max at the end of chunk n − 1.
  q_scaled = qf * jnp.exp(previous_end[..., None] - running)[..., None]     # [B, H, N, Q, M]
  numerator = numerator + jnp.einsum("bhnqm,bhnmv->bhnqv", q_scaled, prefix_kv)
  denominator = denominator + jnp.einsum("bhnqm,bhnm->bhnq", q_scaled, prefix_k)
  out = _divide(numerator, denominator, eps, clamp)
  return out.reshape(*out.shape[:2], -1, out.shape[-1])[:, :, :length]
