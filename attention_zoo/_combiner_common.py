"""Machinery shared by every Combiner core (Ren et al., NeurIPS 2021). Registers nothing.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``D`` query/key head dim, ``V`` value dim,
``N`` blocks (query block ``n``, other block ``z``), ``S`` block size (query offset ``s``, key offset
``t``), ``C`` Sparse-Fixed summary positions per block.

Every Combiner core computes, for each query ``i``, ONE softmax over

    [direct logits q_i.k_j / sqrt(D) for j in the direct set]  ++  [q_i.k^_O / sqrt(D) for each span O]

and returns ``sum_direct p_ij v_j + sum_O p_iO v^_O``. The span value ``v^_O = sum_{j in O}
softmax_j(q^_O.k_j / sqrt(D)) v_j`` is computed once per span and shared by every query using it. The
span summaries ``q^_O, k^_O`` pool the span's queries/keys; ``abstraction`` picks the pooling:

    "max"            element-wise max (the paper's default and the released code's)
    "mean"           mean
    "deepsets_max"   max of ReLU(W x)  (learned W: D x D, no bias, shared by heads; one W for queries,
    "deepsets_mean"  mean of ReLU(W x)  one for keys)

The math lives in pure functions jitted here (static shapes and options), so that even an un-jitted
``init``/``apply`` compiles one program instead of hundreds of eager ops. Flax only supplies the DeepSets
features and the ``"dropout"`` RNG key (:func:`dropout_rng`).

Padding is honoured everywhere: padded entries never win a max, are left out of means and of the
within-span softmax; an empty (or fully padded) span gets a zero summary and its logit is masked.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo import _common

ABSTRACTIONS = ("max", "mean", "deepsets_max", "deepsets_mean")


def pool_kind(abstraction: str) -> str:
  """"max" or "mean": the pooling an ``abstraction`` ends with (ValueError on an unknown name)."""
  if abstraction not in ABSTRACTIONS:
    raise ValueError(f"unknown span abstraction {abstraction!r}; choose one of {ABSTRACTIONS}")
  return abstraction.rsplit("_", 1)[-1]


class AbstractionFeatures(nn.Module):
  """The per-element map applied before pooling: identity, or DeepSets ``ReLU(W x)`` on the last axis."""

  abstraction: str

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """x: [..., D] -> [..., D] (same dtype)."""
    pool_kind(self.abstraction)
    if not self.abstraction.startswith("deepsets"):
      return x
    return nn.relu(nn.Dense(x.shape[-1], use_bias=False, name="phi")(x)).astype(x.dtype)


def pool(x: jax.Array, valid: jax.Array, axis: int, kind: str) -> tuple[jax.Array, jax.Array]:
  """Pools ``x`` [..., D] over ``axis`` using only ``valid`` entries.

  ``valid``: bool with the leading axes of ``x`` (``x.shape[:valid.ndim]``, covering ``axis``).
  Returns ``(summary, nonempty)``: the summary (``x`` without ``axis``; zeros where nothing is valid) and
  bool ``nonempty`` (``valid`` without ``axis``).
  """
  nonempty = jnp.any(valid, axis)
  valid, fill = _expand(valid, x), _expand(nonempty, x, axis)
  if kind == "max":
    out = jnp.max(jnp.where(valid, x, jnp.finfo(x.dtype).min), axis)
  else:
    acc = _common.accum_dtype(x)
    total = jnp.sum(jnp.where(valid, x, 0).astype(acc), axis)
    out = (total / jnp.maximum(jnp.sum(valid, axis, dtype=acc), 1)).astype(x.dtype)
  return jnp.where(fill, out, 0), nonempty


def _expand(flag: jax.Array, x: jax.Array, dropped_axis: int | None = None) -> jax.Array:
  """Appends unit axes so ``flag`` (leading axes of ``x``, minus ``dropped_axis``) broadcasts."""
  ndim = x.ndim - (dropped_axis is not None)
  return flag.reshape(flag.shape + (1,) * (ndim - flag.ndim))


def exclusive_line_pools(xs: Sequence[jax.Array], valid: jax.Array, kind: str, reverse: bool = False
                         ) -> tuple[list[jax.Array], jax.Array]:
  """Exclusive prefix (suffix when ``reverse``) summaries along the LEADING axis of every ``xs[i]``.

  xs: arrays [N, ...] (lines of length N leading: one sequential scan visits each line position once);
  valid: bool [N, ...] covering leading axes of each x (trailing unit axes broadcast). Entry ``t`` of a
  summary pools x over the valid positions strictly before ``t`` (strictly after when ``reverse``), with
  the conventions of :func:`pool`: returns (summaries shaped like xs, ``nonempty`` shaped like valid).
  """
  acc = _common.accum_dtype(*xs)
  count = _exclusive_scan(lambda r, v: r + v, (valid.astype(acc),), 0, reverse)[0]
  nonempty = count > 0
  masks = [_expand(valid, x) for x in xs]
  fill = [_expand(nonempty, x) for x in xs]
  if kind == "max":
    out = exclusive_cummax(tuple(jnp.where(m, x, jnp.finfo(x.dtype).min) for m, x in zip(masks, xs)),
                           reverse)
  else:
    sums = _exclusive_scan(lambda r, v: r + v, tuple(jnp.where(m, x, 0).astype(acc)
                                                      for m, x in zip(masks, xs)), 0, reverse)
    out = [(s / jnp.maximum(_expand(count, s), 1)).astype(x.dtype) for s, x in zip(sums, xs)]
  return [jnp.where(f, o, 0) for f, o in zip(fill, out)], nonempty


def _exclusive_scan(op, xs, init, reverse):
  """Exclusive running ``op`` over the leading axis of each of ``xs`` (entry t: op over entries < t,
  or > t when ``reverse``); ``init`` is the empty value. One ``lax.scan`` for all of them."""
  def step(run, x):
    return tuple(op(r, xi) for r, xi in zip(run, x)), run
  start = tuple(jnp.full_like(x[0], init) for x in xs)
  return jax.lax.scan(step, start, tuple(xs), reverse=reverse)[1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def exclusive_cummax(xs: tuple[jax.Array, ...], reverse: bool = False) -> tuple[jax.Array, ...]:
  """Exclusive running max over the leading axis of each of ``xs``: entry t = max of entries before t
  (after t when ``reverse``); the empty max is the dtype's lowest finite value.

  A sequential ``lax.scan`` with a hand-written VJP: ``lax.cummax`` lowers to an O(N^2) window reduction
  on CPU/GPU and differentiates through an associative scan that takes seconds to compile per call,
  while the Combiner's lines (a grid row or column) are short. The gradient of every output entry goes
  to the FIRST position attaining that maximum (a valid subgradient; ``lax.cummax`` may split ties).
  """
  return _exclusive_cummax_fwd(xs, reverse)[0]


def _exclusive_cummax_fwd(xs, reverse):
  out = _exclusive_scan(jnp.maximum, xs, jnp.finfo(xs[0].dtype).min, reverse)
  return out, (xs, out)


def _exclusive_cummax_bwd(reverse, residuals, grads):
  """Visits positions in reverse scan order. Output t's maximum was attained at the last "record"
  (x_u > running max before u) visited before t in scan order, so gradients accumulate until the scan
  reaches a record, which takes them all."""
  xs, outs = residuals

  def step(carry, inputs):
    acc, g_next = carry
    x, e, g = inputs
    acc = tuple(a + gn for a, gn in zip(acc, g_next))
    record = tuple(xi > ei for xi, ei in zip(x, e))
    dx = tuple(jnp.where(r, a, 0) for r, a in zip(record, acc))
    acc = tuple(jnp.where(r, 0, a) for r, a in zip(record, acc))
    return (acc, g), dx

  zeros = tuple(jnp.zeros_like(x[0]) for x in xs)
  _, dxs = jax.lax.scan(step, (zeros, zeros), (xs, outs, tuple(grads)), reverse=not reverse)
  return (dxs,)


exclusive_cummax.defvjp(_exclusive_cummax_fwd, _exclusive_cummax_bwd)


def span_values(q_hat: jax.Array, key: jax.Array, value: jax.Array, allowed: jax.Array,
                logits_spec: str, out_spec: str) -> jax.Array:
  """``v^ = softmax(q^.k / sqrt(D), restricted to allowed) @ v`` with the two einsum specs given.

  The softmax runs over the last axis of ``einsum(logits_spec, q_hat, key)``; ``allowed`` broadcasts
  to it.
  """
  return _common.masked_attention(_common.dot_logits(q_hat, key, logits_spec), allowed, value, out_spec)


def dropout_rng(module: nn.Module, rate: float, deterministic: bool) -> jax.Array | None:
  """The key for attention dropout from the flax ``"dropout"`` stream, or None when dropout is off."""
  if rate <= 0.0 or deterministic:
    return None
  return module.make_rng("dropout")


def dropout(probs: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
  """Inverted dropout (as ``flax.linen.Dropout``) on attention probabilities; no-op if ``rng`` is None."""
  if rng is None or rate <= 0.0:
    return probs
  if rate >= 1.0:
    return jnp.zeros_like(probs)
  keep = jax.random.bernoulli(rng, 1.0 - rate, probs.shape)
  return jnp.where(keep, probs / (1.0 - rate), 0.0)


def dropout_fn(rate: float, rng: jax.Array | None, num_parts: int):
  """The ``dropout(weights, part)`` callback of :func:`_common.joint_masked_attention`: inverted
  dropout with an independent key per part, or None when dropout is off."""
  if rng is None or rate <= 0.0:
    return None
  keys = jax.random.split(rng, num_parts)
  return lambda weights, part: dropout(weights, rate, keys[part])


@functools.partial(jax.jit, static_argnames=("causal", "num_summary", "kind", "dropout_rate"))
def block_combiner(qb: jax.Array, kb: jax.Array, vb: jax.Array, valid: jax.Array, fq: jax.Array,
                   fk: jax.Array, rng: jax.Array | None, *, causal: bool, num_summary: int, kind: str,
                   dropout_rate: float) -> jax.Array:
  """Combiner over contiguous blocks (Combiner-Fixed; Combiner-Learnable on the sorted sequence).

  qb, kb: [B, N, S, H, D]; vb: [B, N, S, H, V]; valid: bool [B, N, S] (real tokens); fq, fk: the
  abstraction features of qb, kb (:class:`AbstractionFeatures`); rng: dropout key or None. With
  ``C = num_summary`` (the last C offsets of every block are Sparse-Fixed "summary" positions):

    direct(n, s) = own block n (causal: offsets t <= s) + the summary positions of every other block
                   (causal: earlier blocks)
    spans(n, s)  = every other block z (causal: z < n) minus its summary positions

  an exact partition of all keys (causal: of keys j <= i). ``C = 0`` is the released code's form (own
  block direct, every other whole block one span). Returns [B, N, S, H, V].
  """
  num_blocks, size = qb.shape[1], qb.shape[2]
  c = min(num_summary, size)
  others = ((np.arange(num_blocks)[None, :] < np.arange(num_blocks)[:, None]) if causal
            else (np.arange(num_blocks)[None, :] != np.arange(num_blocks)[:, None]))   # [N(n), N(z)]
  others = jnp.asarray(others)[None, :, None, None, :]                                # [1, N, 1, 1, Z]

  dtype = vb.dtype

  # Direct: own block.
  local_allowed = valid[:, :, None, None, :]                                          # [B, N, 1, 1, T]
  if causal:
    local_allowed = local_allowed & _common.causal_allowed(size, size)[None, None, :, None, :]
  parts = [(_common.dot_logits(qb, kb, "bnshd,bnthd->bnsht"), local_allowed,
            _common.contraction("bnsht,bnthv->bnshv", vb))]

  # Direct: the summary positions (last C offsets) of the other blocks, flattened to Z*C keys.
  if c:
    ks, vs, ms = kb[:, :, size - c:], vb[:, :, size - c:], valid[:, :, size - c:]
    col_logits = _common.dot_logits(qb, ks, "bnshd,bzchd->bnshzc")
    col_allowed = ms[:, None, None, None, :, :] & others[..., None]     # [B, N, 1, 1, Z, C]
    parts.append((col_logits.reshape(*col_logits.shape[:4], -1),
                  col_allowed.reshape(*col_allowed.shape[:4], -1),
                  lambda w: _common.contraction("bnshzc,bzchv->bnshv", vs)(
                      w.reshape(*w.shape[:4], num_blocks, c))))

  # Spans: each block's non-summary positions, summarized once.
  member = valid & jnp.asarray(np.arange(size) < size - c)[None, None, :]             # [B, N, S]
  q_hat, _ = pool(fq, member, 2, kind)                        # [B, N, H, D]
  k_hat, nonempty = pool(fk, member, 2, kind)                 # [B, N, H, D]
  v_hat = span_values(q_hat, kb, vb, member[:, :, None, :],
                      "bzhd,bzthd->bzht", "bzht,bzthv->bzhv")                         # [B, Z, H, V]
  parts.append((_common.dot_logits(qb, k_hat, "bnshd,bzhd->bnshz"),
                nonempty[:, None, None, None, :] & others, _common.contraction("bnshz,bzhv->bnshv", v_hat)))
  return _common.joint_masked_attention(parts, dropout_fn(dropout_rate, rng, len(parts))).astype(dtype)
