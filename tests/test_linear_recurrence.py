"""attention_zoo/mixers/_linear_recurrence.py: the recurrent mode against a literal numpy float64 loop, the
chunk mode against the recurrent one (outputs and gradients), the bidirectional form against LION's dense mask,
padding (end and middle, both directions), read="before" against read="after", and mLSTM against a numpy
transcription of xLSTM's recurrent_step_stabilized_simple."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo.mixers import _linear_recurrence as lr

# XLA's compile time is what this file spends. The engine compiles its kernel once per structure and shape
# (shared by the decay kinds None, [H], [B, L, H]), so the checks call it eagerly, with shared shapes;
# bidirectional checks cover the forward pass and the backward pass at once.
linear_recurrence = lr.linear_recurrence

B, L, H, K, V = 2, 11, 2, 3, 4
DECAYS = ("none", "H", "BLH", "BLHK")
UPDATES = ("additive", "delta", "dplr")
CASES = [(d, u) for d in DECAYS for u in UPDATES] + [("BLH", "mlstm")]         # mLSTM: a data-dependent forget gate
MLSTM_DEGENERATE = [("none", "mlstm"), ("H", "mlstm")]                           # accepted; checked against numpy


def _inputs(rng, decay, update, b=B, length=L):
  """Engine keyword arguments (numpy float64) for one decay kind and update kind."""
  kw = {"q": rng.normal(size=(b, length, H, K)), "k": 0.5 * rng.normal(size=(b, length, H, K)),
        "v": rng.normal(size=(b, length, H, V))}
  shape = {"H": (H,), "BLH": (b, length, H), "BLHK": (b, length, H, K)}.get(decay)
  if shape is not None:
    kw["log_decay"] = -rng.uniform(0.05, 1.0, shape)
  if update == "delta":
    kw["beta"] = rng.uniform(0.0, 1.0, (b, length, H))
  elif update == "dplr":
    kw["a"] = 0.4 * rng.normal(size=(b, length, H, K))
    kw["b"] = 0.4 * rng.normal(size=(b, length, H, K))
  elif update == "mlstm":
    kw["log_input_gate"] = 2.0 * rng.normal(size=(b, length, H))
  return kw


def _mask(b=B, length=L):
  mask = np.ones((b, length), bool)
  mask[0, 3:6] = False                                                  # padding in the middle
  mask[-1, length - 4 :] = False                                        # padding at the end
  return mask


def _log_decay_bLHK(kw, b, length):
  ld = kw.get("log_decay")
  if ld is None:
    return np.zeros((b, length, H, K))
  if ld.ndim == 1:
    return np.broadcast_to(ld[None, None, :, None], (b, length, H, K))
  if ld.ndim == 3:
    return np.broadcast_to(ld[..., None], (b, length, H, K))
  return ld


# ---------------------------------------------------------------- the literal definition, one row at a time


def _np_pass(q, k, v, g, beta, a, b, ig, read, backward, eps):
  """One (row, head) with the padded positions removed: q, k [n, K], v [n, V], g [n, K] (log decays), beta [n],
  a, b [n, K], ig [n]. Materialises S_t at every step. Backward: from the end, token t carries g_{t+1} and reads
  after that decay, before its write. Returns o [n, V], or mLSTM's stabilised (num, q.n, m)."""
  n = q.shape[0]
  s = np.zeros((K, V))
  nrm, m = np.zeros(K), 0.0
  out, den, ms = np.zeros((n, V)), np.zeros(n), np.zeros(n)
  for t in range(n - 1, -1, -1) if backward else range(n):
    gt = (g[t + 1] if t + 1 < n else np.zeros(K)) if backward else g[t]
    if ig is not None:                                                  # mLSTM, scalar decay gt[0]
      reads = {"before": (s, nrm, m)}
      m_dec = m + gt[0]
      reads["mid"] = (s, nrm, m_dec)
      m_new = max(m_dec, ig[t])
      s = np.exp(m_dec - m_new) * s + np.exp(ig[t] - m_new) * np.outer(k[t], v[t])
      nrm = np.exp(m_dec - m_new) * nrm + np.exp(ig[t] - m_new) * k[t]
      m = m_new
      reads["after"] = (s, nrm, m)
      rs, rn, rm = reads[read]
      out[t], den[t], ms[t] = rs.T @ q[t], rn @ q[t], rm
      continue
    s_dec = np.exp(gt)[:, None] * s
    if beta is not None:
      s_new = s_dec + beta[t] * np.outer(k[t], v[t] - s_dec.T @ k[t])
    elif a is not None:
      s_new = s_dec + np.outer(a[t], s.T @ b[t]) + np.outer(k[t], v[t])
    else:
      s_new = s_dec + np.outer(k[t], v[t])
    out[t] = {"before": s, "mid": s_dec, "after": s_new}[read].T @ q[t]
    s = s_new
  return out if ig is None else (out, den, ms)


def _np_reference(kw, mask, read, causal, eps):
  b, length = mask.shape
  g = _log_decay_bLHK(kw, b, length)
  o = np.zeros((b, length, H, V))
  for bi in range(b):
    idx = np.nonzero(mask[bi])[0]
    for h in range(H):
      row = lambda name: None if name not in kw else kw[name][bi, idx, h]
      args = (row("q"), row("k"), row("v"), g[bi, idx, h], row("beta"), row("a"), row("b"), row("log_input_gate"))
      fwd = _np_pass(*args, read, False, eps)
      if row("log_input_gate") is None:
        res = fwd if causal else fwd + _np_pass(*args, "mid", True, eps)
      else:
        num, den, m = fwd
        if not causal:
          nb, db, mb = _np_pass(*args, "mid", True, eps)
          mx = np.maximum(m, mb)
          num = np.exp(m - mx)[:, None] * num + np.exp(mb - mx)[:, None] * nb
          den, m = np.exp(m - mx) * den + np.exp(mb - mx) * db, mx
        res = num / (np.maximum(np.abs(den), np.exp(-m)) + eps)[:, None]
      o[bi, idx, h] = res
  return o


def _rel(x, y):
  x, y = np.asarray(x), np.asarray(y)
  return float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-300))


@pytest.mark.parametrize("decay,update", CASES + MLSTM_DEGENERATE)
def test_recurrent_matches_numpy_loop(x64, decay, update):
  rng = np.random.default_rng(0)
  kw, mask = _inputs(rng, decay, update), _mask()
  eps = 1e-3 if update == "mlstm" else 0.0
  combos = [(False, "after")]                                           # forward (reads t) + backward pass
  if decay == "BLHK" or (decay, update) == ("BLH", "mlstm"):
    combos.append((True, "before"))
  for causal, read in combos:
    o = linear_recurrence(**kw, mask=mask, causal=causal, read=read, mode="recurrent", normalizer_eps=eps)
    ref = _np_reference(kw, mask, read, causal, eps)
    assert _rel(o, ref) < 1e-10, (causal, read)
    assert np.all(np.asarray(o)[~mask] == 0.0)


# ---------------------------------------------------------------- chunk == recurrent, outputs and gradients


@pytest.mark.parametrize("decay,update", CASES)
def test_chunk_matches_recurrent_with_gradients(x64, decay, update):
  """Bidirectional (the forward pass reading t and the backward pass), L = 37 with chunks of 8 (sub-chunks of 4),
  padding in the middle across a chunk border and at the end; read="before" for the per-key additive case and
  mLSTM."""
  rng = np.random.default_rng(1)
  length = 37                                                           # not a multiple of the chunk (8)
  kw, mask = _inputs(rng, decay, update, length=length), _mask(length=length)
  mask[0, 12:21] = False                                                # a padded stretch across a chunk border
  eps = 1e-3 if update == "mlstm" else 0.0
  read = "before" if (decay, update) in (("BLHK", "additive"), ("BLH", "mlstm")) else "after"
  w = jnp.asarray(rng.normal(size=(B, length, H, V)))

  def outputs_and_grads(args):
    res = {}
    for mode in ("chunk", "recurrent"):
      run = lambda a: linear_recurrence(**a, mask=mask, causal=False, read=read, mode=mode, chunk_size=8,
                                           sub_chunk_size=4, normalizer_eps=eps)
      o, pullback = jax.vjp(run, args)
      res[mode] = (o, pullback(w)[0])                                   # gradients of sum(w * o)
    return res

  res = outputs_and_grads(kw)
  (o_c, g_c), (o_r, g_r) = res["chunk"], res["recurrent"]
  assert _rel(o_c, o_r) < 1e-9
  for name in kw:
    assert np.max(np.abs(np.asarray(g_r[name]))) > 0.0, name            # every input reaches the output
    assert _rel(g_c[name], g_r[name]) < 1e-9, name


# ---------------------------------------------------------------- bidirectional = LION's dense form


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("mode", ("chunk", "recurrent"))
def test_bidirectional_additive_is_lion_dense_form(x64, decay, mode):
  rng = np.random.default_rng(2)
  kw = _inputs(rng, decay, "additive", b=1)
  g = _log_decay_bLHK(kw, 1, L)[0]                                      # [L, H, K]
  cum = np.cumsum(g, axis=0)
  ref = np.zeros((L, H, V))
  for i in range(L):
    for j in range(L):
      lo, hi = min(i, j), max(i, j)
      m_ij = np.exp(cum[hi] - cum[lo])                                  # prod_{s=lo+1}^{hi} exp(g_s)  [H, K]
      ref[i] += np.einsum("hk,hk,hk,hv->hv", kw["q"][0, i], kw["k"][0, j], m_ij, kw["v"][0, j])
  o = linear_recurrence(**kw, causal=False, mode=mode, chunk_size=4, sub_chunk_size=2)
  assert _rel(o[0], ref) < 1e-10


# ---------------------------------------------------------------- padding


@pytest.mark.parametrize("decay,update", [("BLHK", "additive"), ("BLHK", "delta"), ("BLHK", "dplr"), ("BLH", "mlstm")])
def test_padding_end_and_middle(x64, decay, update):
  """Chunk mode (the recurrent mode's padding is checked against the numpy loop, which removes the padding):
  row 0 padded in two places in the middle, row 1 at the end; bidirectional, so the forward and the backward
  pass are both checked (they are the same kernel call)."""
  rng = np.random.default_rng(3)
  length, real = 19, 11
  kw = _inputs(rng, decay, update, length=length)
  mask = np.ones((B, length), bool)
  mask[0, 3:7] = mask[0, 12:16] = False
  mask[1, real:] = False
  idx = [np.nonzero(row)[0] for row in mask]
  compact = {n: np.stack([x[bi, idx[bi]] for bi in range(B)]) if x.ndim > 1 else x for n, x in kw.items()}
  junk = {n: np.where(np.reshape(mask, mask.shape + (1,) * (x.ndim - 2)), x, 5.0 * rng.normal(size=x.shape))
          if x.ndim > 1 else x for n, x in kw.items()}
  if "log_decay" in junk:
    junk["log_decay"] = -np.abs(junk["log_decay"])
  run = lambda args, m: np.asarray(linear_recurrence(**args, mask=m, causal=False, chunk_size=4, sub_chunk_size=2,
                                                     normalizer_eps=1e-3))
  o, alone, o_junk = run(kw, mask), run(compact, None), run(junk, mask)
  for bi in range(B):
    assert _rel(o[bi, idx[bi]], alone[bi]) < 1e-12, bi
  assert np.all(o[~mask] == 0.0)
  assert _rel(o_junk, o) < 1e-12                                        # the padded content does not matter


# ---------------------------------------------------------------- read="before" vs read="after"


@pytest.mark.parametrize("decay,update", [("none", "additive"), ("BLHK", "additive"), ("BLHK", "delta"),
                                          ("BLHK", "dplr")])
@pytest.mark.parametrize("mode", ("chunk", "recurrent"))
def test_read_before_is_read_after_minus_own_token(x64, decay, update, mode):
  """after_t = before_t(q_t e^{g_t}) + (own-token term at t), with before(x)_t = S_{t-1}^T x_t linear in x:
  additive (q.k) v; delta beta (q.k) (v - before(k e^g)); DPLR (q.a) before(b) + (q.k) v. Without decay
  before = after - (q.k) v."""
  rng = np.random.default_rng(4)
  kw, mask = _inputs(rng, decay, update), _mask()
  e = np.exp(_log_decay_bLHK(kw, B, L))
  q, k, v = kw["q"], kw["k"], kw["v"]
  queries = {"after": q, "before_q": q * e, "before_k": k * e, "before_b": kw.get("b", q)}

  def reads(args, qs):
    run = lambda query, read: linear_recurrence(**{**args, "q": query}, mask=mask, read=read, mode=mode,
                                                   chunk_size=4, sub_chunk_size=2)
    return {n: run(x, "after" if n == "after" else "before") for n, x in qs.items()}

  r = {n: np.asarray(x) for n, x in reads(kw, queries).items()}
  dot = lambda x, y: np.sum(x * y, axis=-1, keepdims=True)
  own = dot(q, k) * v
  if update == "delta":
    own = kw["beta"][..., None] * dot(q, k) * (v - r["before_k"])
  elif update == "dplr":
    own = dot(q, kw["a"]) * r["before_b"] + own
  expected = np.where(mask[..., None, None], r["before_q"] + own, 0.0)
  assert _rel(r["after"], expected) < 1e-11


# ---------------------------------------------------------------- mLSTM against xLSTM's recurrent step


def _xlstm_recurrent_step_stabilized_simple(c, n, m, q, k, v, igate_preact, fgate_preact, eps=1e-6):
  """numpy transcription of xlstm/blocks/mlstm/backends.py recurrent_step_stabilized_simple (one head, column
  vectors; C is [DH, DH] with C += i k v^T... as there: k_scaled @ v^T, h = q^T C)."""
  dh = q.shape[0]
  log_fg = -np.logaddexp(0.0, -fgate_preact)                           # logsigmoid
  m_new = max(log_fg + m, igate_preact)
  fg = np.exp(log_fg + m - m_new)
  ig = np.exp(igate_preact - m_new)
  k_scaled = k / np.sqrt(dh)
  c_new = fg * c + ig * np.outer(k_scaled, v)
  n_new = fg * n + ig * k_scaled
  h_num = q @ c_new
  h_denom = max(abs(q @ n_new), np.exp(-m_new)) + eps
  return h_num / h_denom, (c_new, n_new, m_new)


@pytest.mark.parametrize("mode", ("chunk", "recurrent"))
def test_mlstm_matches_xlstm_recurrent_step(x64, mode):
  rng = np.random.default_rng(5)
  dh, length = 4, 23
  q, k, v = (rng.normal(size=(B, length, H, dh)) for _ in range(3))
  ipre = 3.0 * rng.normal(size=(B, length, H))
  fpre = 2.0 * rng.normal(size=(B, length, H)) + 1.0
  ref = np.zeros((B, length, H, dh))
  for bi in range(B):
    for h in range(H):
      state = (np.zeros((dh, dh)), np.zeros(dh), 0.0)
      for t in range(length):
        ref[bi, t, h], state = _xlstm_recurrent_step_stabilized_simple(*state, q[bi, t, h], k[bi, t, h], v[bi, t, h],
                                                                       ipre[bi, t, h], fpre[bi, t, h])
  o = linear_recurrence(q, k / np.sqrt(dh), v, log_decay=jax.nn.log_sigmoid(fpre), log_input_gate=ipre, mode=mode,
                        chunk_size=8, normalizer_eps=1e-6)
  assert _rel(o, ref) < 1e-10


def test_float32_strong_decay_is_finite(x64):
  """float32 chunk form, log decays down to -200 per step and mLSTM input gates of +-60: no overflow, and it
  agrees with the float64 recurrence (the reference's program is test_recurrent_matches_numpy_loop's)."""
  rng = np.random.default_rng(6)
  for decay, update, tol in (("BLHK", "additive", 1e-5), ("BLH", "mlstm", 1e-3)):
    kw = _inputs(rng, decay, update)
    kw["log_decay"] = -np.exp(rng.uniform(-6.0, 5.3, kw["log_decay"].shape))
    if update == "mlstm":
      kw["log_input_gate"] = 30.0 * kw["log_input_gate"]
    kw32 = {n: x.astype(np.float32) for n, x in kw.items()}
    o32 = linear_recurrence(**kw32, mask=_mask(), causal=False, chunk_size=8, sub_chunk_size=4)
    o64 = linear_recurrence(**{n: x.astype(np.float64) for n, x in kw32.items()}, mask=_mask(), causal=False,
                            mode="recurrent")
    assert o32.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(o32)))
    assert _rel(o32, o64) < tol, update
