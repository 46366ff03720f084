"""Reformer LSH attention (Kitaev et al. 2020). O(R·L·(C·(D + V) + log L)) time and memory.

Axis legend: ``B`` batch, ``L`` length (``P`` padded length), ``H`` heads, ``D`` query/key head dim,
``V`` value dim, ``R`` hash rounds, ``U`` rotations per round (n_buckets / 2), ``M`` chunks of the
sorted sequence of all rounds, ``C`` chunk length (``Q`` query / ``K`` window key inside a chunk).

Shared QK: the core attends with the *query* as both query and key; the ``key`` argument is ignored
(the model's key projection is unused by this core). Algorithm, per batch element and head:

1. Hash: random rotations ``W [D, R, U]`` (U = n_buckets / 2); in round r the bucket of position i is
   ``argmax([q_i W_r ; −q_i W_r])`` (angular LSH). Padded positions get the sentinel bucket n_buckets.
2. Sort every round by (bucket, position) and concatenate the R sorted rounds into one sequence of
   R·P slots, cut into M = R·P / C equal chunks.
3. Every chunk attends to itself and to the previous chunk (circularly: chunk 0 looks at the last one,
   as trax and LRA do; with a single chunk there is no look-back). Keys are the length-normalised
   queries ``k = q / rms(q)`` and logits ``q·k / √D`` (= ``q·q̂`` with ``q̂`` the unit vector, as trax).
   A position does not attend to itself (logit −1e5, as trax) unless nothing else is in its window.
   Padded keys get exactly zero weight; ``causal`` masks keys at a later original position.
4. Rounds are combined with weights ``softmax_r(logsumexp_r)``. This is exactly ONE softmax over the
   concatenation of the query's R windows, which is how it is computed here
   (``_joint_softmax_in_sorted_order``: the weights stay in sorted order, only per-slot statistics and
   outputs go back to query order).

Sizes: the chunk length ``C = chunk_len`` (64) is fixed, and ``n_buckets`` defaults to the even number
≈ P / C, so a bucket holds about one chunk and the cost grows like L log L.

Differences from the reference code (LRA ``reformer/reformer_attention.py``; original google/trax
``trax/layers/research/efficient_attention.py``):

- **Padding is honoured**: padded positions sort to the end of every round and are never attended
  (LRA padded the input to a multiple of ``chunk_len`` and attended to the padding and to every pad
  token of the batch). Real outputs do not depend on padded contents.
- **Scale**: logits ``q·k/√D`` with length-normalised keys (trax). LRA used raw keys and
  *multiplied* by √D (``dots = q·k·√D``) and did not mask self-attention: ``lra_sqrt_d_quirk=True``,
  ``normalize_keys=False``, ``mask_self=False`` reproduce that.
- **Chunk length**: LRA cut the sorted sequence into ``n_hashes·n_buckets`` chunks (chunk length
  L / n_buckets, quadratic in L; its ``chunk_len`` argument only set the padding). Here the chunk
  length is fixed (``chunk_len``, default 64) and ``n_buckets`` follows the length; ``chunk_len=None``
  with ``n_buckets=10`` gives LRA's chunking (C = ceil(L / n_buckets)).
- **Random rotations**: one draw per head (shared by the batch) from the flax ``"attention"`` stream
  on every call (``redraw="every_call"``; falls back to the fixed draw when the stream is absent), or
  ``"fixed"``: once from ``key(seed)`` folded with the module path. LRA always used ``PRNGKey(0)``
  (the same rotations in every layer, head and step); trax draws per call.
- **Causal** only on request (``causal=True, trax_causal=True``; plain ``causal=True`` raises
  ``NotImplementedError``): keys at a later original position are masked (trax's causal form; LRA's was
  a TODO no-op). As in trax this never attends to a later position, but WHICH earlier positions share a chunk depends
  on the hashes of later tokens (they shift the sorted order), so past outputs are not independent of
  the future once the sorted sequence has more than one chunk. With L <= chunk_len (one chunk) it is
  exact causal attention without self.
- **Dropout** on the attention weights (joint softmax, so it drops (query, window key) pairs of all
  rounds); LRA had none in this core.
- The ``lra`` protocol preset (``configs/lra.py``) runs LRA's form: ``chunk_len=None, n_buckets=10,
  n_hashes=1, lra_sqrt_d_quirk=True, normalize_keys=False, mask_self=False, redraw="fixed"`` and no
  attention dropout; the ``xiong`` preset ``n_hashes=2`` and transformers' bucket count (Xiong et al.
  ran transformers' ``LSHSelfAttention``, whose other defaults are this core's: chunks of 64 looking one
  chunk back, shared QK with keys normalised by their rms and logits divided by √D, a position's own key
  at −1e5, rotations drawn per head on every call, rounds combined by logsumexp, no dropout; it chose
  the largest power of 2 ≤ 2·L/64 buckets, 64 at its padded ListOps length 2048, where this core's
  default is 32: ``configs/xiong.py`` ``lsh_buckets``). transformers hashed padded positions like real
  ones (masking them as keys); here they sort to the end.
- Duplicate keys are not removed: with R > 1 a key can be in the windows of several rounds (and,
  across a round boundary, twice in one window) and then counts once per occurrence, as in trax/LRA.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from attention_zoo import _common
from attention_zoo.registry import AttentionConfig, register_attention

# Logit of a position attending to itself (trax's ``self_mask_value``): it only gets weight when no
# other key is in the window.
SELF_LOGIT = -1e5


@dataclasses.dataclass(frozen=True)
class ReformerConfig(AttentionConfig):
  """Reformer LSH options (defaults: 1 round, chunks of 64, buckets ≈ L/64, trax scaling).

  Attributes:
    n_hashes: R, hash rounds (LRA 1; the Nystromformer LRA protocol used 2).
    n_buckets: even number of buckets; ``None`` = the even number ≈ P / C (at least 2).
    chunk_len: C, chunk length of the sorted sequence; ``None`` = ceil(L / n_buckets) (LRA chunking,
      needs ``n_buckets``).
    mask_self: a position attends to itself only when nothing else is in its window (trax; LRA False).
    normalize_keys: keys = queries / rms(queries) (trax); False = raw queries (LRA).
    lra_sqrt_d_quirk: multiply logits by √D instead of dividing (LRA's bug).
    redraw: ``"every_call"`` (``"attention"`` stream, fixed fallback) or ``"fixed"``.
    seed: seed of the fixed draw (folded with the module path).
    trax_causal: allow ``causal=True`` in trax's form, which is NOT strictly causal (see the module
      docstring); without it ``causal=True`` raises ``NotImplementedError``.
  """

  family = "learned-pattern"
  n_hashes: int = 1
  n_buckets: int | None = None
  chunk_len: int | None = 64
  mask_self: bool = True
  normalize_keys: bool = True
  lra_sqrt_d_quirk: bool = False
  redraw: str = "every_call"
  seed: int = 0
  trax_causal: bool = False

  paper_name = "Reformer"
  ignores = ("key",)  # shared QK: the keys are the (normalised) queries

  def __post_init__(self):
    if self.n_hashes < 1:
      raise ValueError("reformer n_hashes must be >= 1")
    if self.n_buckets is not None and (self.n_buckets < 2 or self.n_buckets % 2):
      raise ValueError(f"reformer n_buckets must be an even number >= 2, got {self.n_buckets}")
    if self.chunk_len is None and self.n_buckets is None:
      raise ValueError("reformer needs chunk_len or n_buckets (chunk_len=None derives it from n_buckets)")
    if self.chunk_len is not None and self.chunk_len < 1:
      raise ValueError("reformer chunk_len must be >= 1")
    if self.redraw not in ("every_call", "fixed"):
      raise ValueError(f"reformer redraw must be 'every_call' or 'fixed', got {self.redraw!r}")

  @property
  def no_causal_form(self) -> str | None:  # type: ignore[override]
    if self.trax_causal:
      return None
    return ("later tokens' hashes move earlier tokens between chunks, so past outputs depend on the "
            "future (trax_causal=True runs trax's not strictly causal form)")

  def state_size(self, length: int, num_heads: int, head_dim: int) -> int | None:
    """2·H·D·L with ``trax_causal``: any past position may hash into a later token's bucket, so every
    past shared query-key and value is kept; None otherwise (no strictly causal form)."""
    if self.no_causal_form:
      return None
    return 2 * num_heads * head_dim * length


def lsh_sizes(length: int, n_buckets: int | None, chunk_len: int | None) -> tuple[int, int, int]:
  """(n_buckets, chunk length C, padded length P) used at this length."""
  chunk = chunk_len or -(-length // n_buckets)
  padded = -(-length // chunk) * chunk
  buckets = n_buckets or 2 * max(1, round(padded / (2 * chunk)))
  return buckets, chunk, padded


def draw_rotations(key: jax.Array, heads: int, dim: int, n_hashes: int, n_buckets: int) -> jax.Array:
  """Gaussian rotations W [H, D, R, U] (U = n_buckets / 2), float32."""
  return jax.random.normal(key, (heads, dim, n_hashes, n_buckets // 2), jnp.float32)


def hash_buckets(vecs: jax.Array, rotations: jax.Array, mask: jax.Array) -> jax.Array:
  """Bucket ids int [B, H, R, L] of ``vecs`` [B, L, H, D]: argmax([xW; −xW]); padding -> 2U."""
  rotated = jnp.einsum("blhd,hdru->bhrlu", vecs.astype(jnp.float32), rotations)
  buckets = jnp.argmax(jnp.concatenate([rotated, -rotated], axis=-1), axis=-1)
  return jnp.where(mask[:, None, None, :], buckets, 2 * rotations.shape[-1])


def sort_order(buckets: jax.Array) -> jax.Array:
  """Per round, positions sorted by (bucket, position): int [B, H, R, P] (stable sort)."""
  return jnp.argsort(buckets, axis=-1, stable=True)


def look_one_back(x: jax.Array) -> jax.Array:
  """[B, H, M, C, ...] -> [B, H, M, 2C, ...]: each chunk followed by the previous one (circular)."""
  if x.shape[2] == 1:
    return x
  return jnp.concatenate([x, jnp.roll(x, 1, axis=2)], axis=3)


@register_attention("reformer", ReformerConfig)
class ReformerAttention(nn.Module):
  """LSH attention with shared QK (the ``key`` argument is ignored)."""

  config: ReformerConfig

  def rotations(self, heads: int, dim: int, n_buckets: int) -> jax.Array:
    cfg = self.config
    key = _common.draw_key(self, cfg.redraw, cfg.seed)
    return draw_rotations(key, heads, dim, cfg.n_hashes, n_buckets)

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query: [B, L, H, D] (also the keys); key: ignored; value: [B, L, H, V]; mask: bool [B, L]
    -> [B, L, H, V]."""
    del key  # shared QK
    cfg = self.config
    if cfg.causal and not cfg.trax_causal:
      raise NotImplementedError(
          "reformer has no strictly causal form: later tokens' hashes move earlier tokens between "
          "chunks, so past outputs depend on the future (set trax_causal=True for trax's form anyway)")
    batch, length, heads, dim = query.shape
    mask = _common.default_mask(mask, batch, length)
    n_buckets, chunk, padded = lsh_sizes(length, cfg.n_buckets, cfg.chunk_len)
    rotations = self.rotations(heads, dim, n_buckets)
    self.sow("intermediates", "rotations", rotations)
    query, value = _common.pad_axis(query, chunk), _common.pad_axis(value, chunk)
    mask = _common.pad_axis(mask, chunk, value=False)
    order = sort_order(hash_buckets(jax.lax.stop_gradient(query), rotations, mask))  # [B, H, R, P]
    out = _lsh_attend(query, value, mask, order, chunk, cfg,
                      _common.dropout_callback(cfg.dropout_rate, deterministic))
    return out[:, :length].astype(value.dtype)


def _keys(query: jax.Array, normalize: bool) -> jax.Array:
  """Shared-QK keys: ``q / rms(q)`` (trax ``length_normalized``, eps 1e-6) or ``q`` itself."""
  if not normalize:
    return query
  acc = query.astype(_common.accum_dtype(query))
  return (acc * jax.lax.rsqrt(jnp.mean(acc * acc, -1, keepdims=True) + 1e-6)).astype(query.dtype)


def _joint_softmax_in_sorted_order(logits, allowed, values, order, undo, dropout):
  """ONE masked softmax per query over the windows of all its rounds, contracted with the window
  values, without moving the [.., C, K] logits or weights out of sorted order.

  logits, allowed [B, H, M, C, K] and values [B, H, M, K, V] are in sorted (chunked) order, M·C = R·P
  slots, slot s of round r holding position ``order[.., r, s]`` (``undo`` is its inverse). Only
  per-slot statistics ([B, H, R, P]: the row maxima, the row sums) and the per-slot outputs
  ([B, H, R, P, V]) are put back in query order (gathers by ``undo``); the per-query maximum over all
  rounds goes back to the slots by ``order``. The unnormalized weights ``exp(logit - max) * allowed``
  are contracted in sorted order, the rounds' outputs and sums added per query, and the sum divided by
  the sum (:func:`_common.normalize`): the same values as a softmax over the concatenation of the
  query's R windows (up to float rounding: sums taken per round first), and the same as
  :func:`_common.joint_masked_attention` on the windows gathered into query order (what this core did
  before 2026-11-29), which moved the R·K logits, mask entries and weights of every query between the
  orders, forward and back (R·K = 256 at the ``xiong`` preset, where this moves R·(V + 2) = 68 values).
  ``dropout(weights, 0)`` (optional) drops unnormalized weights (in sorted order); the normalizer uses
  the undropped ones. Returns [B, H, P, V], float32 or wider.
  """
  batch, heads, rounds, padded = order.shape

  def to_queries(x):
    """Per-slot [B, H, M, C, ...] -> query order [B, H, R, P, ...]."""
    x = x.reshape(batch, heads, rounds, padded, *x.shape[4:])
    return jnp.take_along_axis(x, undo.reshape(undo.shape + (1,) * (x.ndim - 4)), axis=3)

  def to_slots(x):
    """Per-query [B, H, P] -> per-slot [B, H, M, C] (each round's copy in its sorted order)."""
    x = jnp.take_along_axis(jnp.broadcast_to(x[:, :, None], order.shape), order, axis=3)
    return x.reshape(logits.shape[:4])

  masked = jnp.where(allowed, logits.astype(_common.accum_dtype(logits)), _common.NEG_INF)
  peak = jax.lax.stop_gradient(jnp.max(to_queries(jnp.max(masked, -1)), axis=2))         # [B, H, P]
  weights = jnp.exp(masked - to_slots(peak)[..., None]) * allowed
  total = jnp.sum(to_queries(jnp.sum(weights, -1)), axis=2)                            # [B, H, P]
  if dropout is not None:
    weights = dropout(weights, 0)
  out = jnp.sum(to_queries(_common.contraction("bhmck,bhmkv->bhmcv", values)(weights)), axis=2)
  return _common.normalize(out, total)


def _lsh_attend(query, value, mask, order, chunk, cfg, dropout):
  """query [B, P, H, D], value [B, P, H, V], mask [B, P], order [B, H, R, P] -> [B, P, H, V]."""
  batch, padded, heads = query.shape[:3]
  rounds = order.shape[2]
  slots = order.reshape(batch, heads, rounds * padded)                      # original position per slot
  # slot (in round) per position: the inverse permutation, written by a scatter (a second argsort
  # would sort again: 30 ms alone at the xiong shapes)
  undo = jnp.put_along_axis(jnp.zeros_like(order), order, jnp.broadcast_to(
      jnp.arange(padded, dtype=order.dtype), order.shape), axis=-1, inplace=False)

  def gather(x):
    """[B, P, H, X] -> sorted chunks [B, H, M, C, X]."""
    x = jnp.take_along_axis(jnp.moveaxis(x, 1, 2), slots[..., None], axis=2)
    return x.reshape(batch, heads, -1, chunk, x.shape[-1])

  sq = gather(query)
  sk = look_one_back(gather(_keys(query, cfg.normalize_keys)))              # [B, H, M, K, D]
  sv = look_one_back(gather(value))                                          # [B, H, M, K, V]
  qpos = slots.reshape(batch, heads, -1, chunk)                              # [B, H, M, C]
  kpos = look_one_back(qpos)                                                 # [B, H, M, K]
  kvalid = jnp.take_along_axis(jnp.broadcast_to(mask[:, None], (batch, heads, padded)),
                               kpos.reshape(batch, heads, -1), axis=2).reshape(kpos.shape)

  logits = _common.dot_logits(sq, sk, "bhmcd,bhmkd->bhmck")                  # [B, H, M, C, K]
  if cfg.lra_sqrt_d_quirk:
    logits = logits * query.shape[-1]                                        # q·k·√D
  same = qpos[..., :, None] == kpos[..., None, :]
  if cfg.mask_self:
    logits = jnp.where(same, SELF_LOGIT, logits)
  allowed = kvalid[..., None, :]
  if cfg.causal:
    allowed = allowed & (kpos[..., None, :] <= qpos[..., :, None])

  allowed = jnp.broadcast_to(allowed, logits.shape)
  out = _joint_softmax_in_sorted_order(logits, allowed, sv, order, undo, dropout)   # [B, H, P, V]
  return jnp.moveaxis(out, 1, 2)                                             # [B, P, H, V]


