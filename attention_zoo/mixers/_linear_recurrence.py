"""The linear-recurrence engine of the linear-recurrent mixers (GLA, RetNet, HGRN2, Mamba-2, DeltaNet, Gated
DeltaNet, KDA, RWKV-6, RWKV-7, mLSTM): one function, :func:`linear_recurrence`, with a token-by-token
reference (``mode="recurrent"``) and a chunked-parallel form (``mode="chunk"``) that give the same outputs and
gradients (float64: <= 1e-9 relative, tests/test_linear_recurrence.py). A private helper: it registers nothing.

Axis legend: ``B`` batch, ``L`` length, ``H`` heads, ``K`` key dim, ``V`` value dim, ``N`` chunks, ``C`` chunk
size, ``c`` sub-chunk size. Inputs are [B, L, H, ...]; the state S is [K, V] per head (fla's convention),
o_t = S^T q_t. The scale of q (e.g. K^-1/2) is the layer's job.

Recurrences (per batch row and head; D_t = diag(exp(g_t)), g_t = ``log_decay`` at t broadcast over K, <= 0;
g = 0 when ``log_decay`` is None; [H] is one g per head at every position):

- additive (GLA, RetNet, HGRN2, Mamba-2, RWKV-6):   S_t = D_t S_{t-1} + k_t v_t^T
- delta rule, ``beta`` (DeltaNet, Gated DeltaNet, KDA):
      S_t = (I - beta_t k_t k_t^T) D_t S_{t-1} + beta_t k_t v_t^T            (decay first, then the delta write)
- DPLR, ``a``, ``b`` (RWKV-7):
      S_t = (D_t + a_t b_t^T) S_{t-1} + k_t v_t^T = D_t S_{t-1} + a_t (S_{t-1}^T b_t)^T + k_t v_t^T
  ``b`` reads the previous (undecayed) state, ``a`` is the direction written. fla names them the other way
  round: fla's dplr ``dplr_recurrence(q, k, v, alpha, beta, gk)`` (fla/ops/generalized_delta_rule/dplr/naive.py)
  is this recurrence with a = fla's beta, b = fla's alpha; and fla's rwkv7 ``a``/``b`` (fla/ops/rwkv7,
  recurrent_naive.py, state [V, K] there: S_t = S_{t-1} (diag(w_t) + a b^T) + v k^T) are here b/a: RWKV-7's
  a_fla = -kk, b_fla = kk * a_gate becomes ``a = kk * a_gate, b = -kk``.
- mLSTM, ``log_input_gate`` i~_t (xLSTM; scalar decay only, log f_t = ``log_decay`` [B, L, H] or [H]):
      m_t = max(log f_t + m_{t-1}, i~_t),  m_0 = 0, C_0 = 0, n_0 = 0
      C_t = exp(log f_t + m_{t-1} - m_t) C_{t-1} + exp(i~_t - m_t) k_t v_t^T
      n_t = exp(log f_t + m_{t-1} - m_t) n_{t-1} + exp(i~_t - m_t) k_t
      o_t = C_t^T q_t / (max(|n_t^T q_t|, exp(-m_t)) + ``normalizer_eps``)
  xLSTM's recurrent_step_stabilized_simple (xlstm/blocks/mlstm/backends.py), with its eps an argument (xLSTM:
  1e-6; default 0). In unstabilised units o_t = C^T q / (max(|n^T q|, 1) + eps exp(m_t)): the stabiliser
  cancels exactly except in the eps term, so both modes carry the same m_t (m_0 = 0 as xLSTM's step).

``read``: "after" o_t = S_t^T q_t; "before" o_t = S_{t-1}^T q_t (before the decay and the write at t; RWKV-6 adds
its bonus u itself). For mLSTM "before" reads (C_{t-1}, n_{t-1}, m_{t-1}).

Masking (``mask`` bool [B, L], False = padding), in both directions and anywhere in a row: a masked position
is an identity step: g = 0, no write (k = 0, beta = 0, a = 0; for mLSTM no write and m unchanged), and its
output is 0. Real outputs therefore equal those of the row with the padded positions removed.

Bidirectional (``causal=False``): o_t = forward_t + backward_t. The forward pass is the recurrence above read
with ``read``. The backward pass runs the same recurrence from the last position to the first; the real token
at t carries the decay of the next real token t' (g_{t'}; 0 for the last real token) and it reads after that
decay, before its own write: o^b_t = (D_{t'} S^b_{t'})^T q_t, then S^b_t = write_t(D_{t'} S^b_{t'}) (delta:
(I - beta_t k_t k_t^T) D_{t'} S^b_{t'} + beta_t k_t v_t^T; DPLR: D_{t'} S^b_{t'} + a_t (S^b_{t'}^T b_t)^T + k_t v_t^T).
So token t is counted once (by the forward pass; not at all with read="before"), and for the additive family
the weight of token j in o_i is the product of the decays strictly after min(i, j) up to and including
max(i, j) in both directions: o = (M ⊙ (Q K^T)) V with M_ij = prod_{s=min+1}^{max} exp(g_s), M_ii = 1, LION's
symmetric selective mask M^F + M^B - I (Afzal et al. 2025). mLSTM: both directions' stabilised numerators and
q.n are brought to the common stabiliser m = max(m^f_t, m^b_t) and summed before the division:
o_t = (e^{m^f-m} num^f + e^{m^b-m} num^b) / (max(|e^{m^f-m} den^f + e^{m^b-m} den^b|, e^{-m}) + eps), i.e.
(C^f + C^b)^T q / max(|(n^f + n^b)^T q|, 1) in unstabilised units (the backward state starts at m = 0 too).

``mode="recurrent"``: ``jax.lax.scan`` over L with the state [B, H, K, V] (mLSTM: C, n, m), the literal
recurrence; the reference. In both modes ``causal=False`` runs the two passes as one kernel call over a doubled
batch (the rows, then the reversed rows with their shifted decays), each row with its own read.

``mode="chunk"`` (training default): L is padded with masked positions to N chunks of C = ``chunk_size``
(shorter rows: one chunk, rounded up to the sub-chunk). Within a chunk, with G_t = g_0 + .. + g_t (chunk-local),
everything is matmuls; across chunks a ``lax.scan`` carries the chunk-start state through the affine chunk map
S_next = M S_0 + N_S (M diagonal for the additive family, [K, K] for the delta rule and DPLR), and the outputs
are o = O_1 + P S_0 with O_1, P computed for all chunks in parallel. Per update:

- additive (fla/ops/gla/naive.py, fla/ops/simple_gla): O_1 = A V with A_tj = sum_k q_tk k_jk e^{G_tk - G_jk}
  (j <= t), P = Q ⊙ e^G, M = e^{G_{C-1}}, N_S = (K ⊙ e^{G_{C-1} - G})^T V.
- delta rule, WY/UT form (fla/ops/delta_rule/wy_fast.py + naive.py, fla/ops/gated_delta_rule, fla/ops/kda):
  the write is S_t = D_t S_{t-1} + k_t u_t^T with u_t = beta_t (v_t - (D_t S_{t-1})^T k_t); within a chunk
  (I + tril(diag(beta) Gram(K, K), -1)) U = diag(beta) (V - (K ⊙ e^G) S_0), solved once per chunk for
  [beta V | beta K ⊙ e^G] (``_unit_lower_solve``: the exact product (I - A)(I + A^2)(I + A^4).. of the nilpotent
  strictly lower A, matmuls only), so U = W_1 - W_2 S_0; then the additive form with U for V.
- DPLR (fla/ops/generalized_delta_rule/dplr/naive.py ``dplr_chunkwise``, fla/ops/rwkv7): fully chunked. With
  w_t = S_{t-1}^T b_t the write is additive with two keys (a_t w_t^T + k_t v_t^T), and within a chunk
  (I - tril(Gram_excl(B, A), -1)) W = (B ⊙ e^{G_{t-1}}) S_0 + tril(Gram_excl(B, K), -1) V, one unit-triangular solve.
- mLSTM (xLSTM's parallel_stabilized_simple within a chunk): log weights D_tj = (G_t - G_j) + i~_j (j <= t),
  m_t = max(G_t + m_in, max_j D_tj) with the chunk's incoming stabiliser m_in; the scan carries (C~, n~, m)
  with the chunk's own end-state stabiliser (max_j (G_{C-1} - G_j + i~_j)); every exponent formed is <= 0.

Gram(X, Y)_tj = sum_k x_tk y_jk exp(G_tk - G_jk); Gram_excl uses G_{t-1} for the row. "before" reads use
G_{t-1} and j < t; the backward pass's read is j < t with G_t (q_t ⊙ e^{g_t}).

Numerics. Every exponential the chunk form evaluates has a non-positive argument, so float32 cannot overflow
at any decay strength (log decays down to -200 per step and mLSTM input gates of +-60 are tested; underflow to 0
only drops weights < 1e-38). Decay differences inside a sub-chunk (and the [C, C] scalar-decay weights) are
segment sums of the g_s themselves (``_segsum``, after mamba_ssm/modules/ssd_minimal.py), not differences of
two long cumulative sums; between sub-chunks they are differences of chunk-local cumulative sums (absolute error
~ C eps |G_chunk| in the exponent, on weights that are then already small). Per-key decays: the chunk is split
into sub-chunks of c = ``sub_chunk_size`` (8) as in fla's chunk_gla; between sub-chunks I > J the Gram block
factors as (x_t e^{Gx_t - R_I}) e^{R_I - R'_J} (y_j e^{R'_J - G_j}) (three exponents <= 0, matmuls), inside a
sub-chunk a [c, c, K] weight tensor: memory C c K per chunk per head, not C^2 K. The delta-rule / DPLR
triangular systems are unit lower triangular (I + strictly lower), as well conditioned as the recurrence
itself for beta in [0, 1] with unit-norm keys and RWKV-7's bounded a. Defaults C = 64, c = 8 (c = 8 was ~1.4x
faster than 16 for GLA fwd+bwd on CPU). In float32 (measured, L = 200, strong decays, padding in the middle)
chunk and recurrent agree to ~1e-5 relative in outputs and gradients for every update kind; for mLSTM with
input gates of +-60 both float32 forms are up to ~1e-3 off float64 where |n^T q| nearly cancels (the two are
equally close). Computation is float32 (float64 for float64 inputs); the output has q's dtype.

Speed. The scan contracts the state with q once per step (``_recurrent``: the "after" read is the "mid" read plus
the write's rank-one terms), 1.25-2x faster than three reads (fwd+bwd, one CPU thread, B=32, L=128, H=2, K=16,
V=32, bidirectional, idle: additive 1.7-1.8x, delta rule 2.1x, DPLR 1.4x, mLSTM 1.25x). On a CPU the ``lax.scan``
is then the faster form at small widths and batches of short rows (the ``cpu`` protocol's shape: configs/cpu.py),
the chunk form at wide heads (reports/cpu_modern_layers); the chunk form is the training default for
accelerators, where a long scan is latency-bound.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

READS = ("after", "before")
MODES = ("chunk", "recurrent")
_NEG = -1e30  # a finite "minus infinity" for the log-space maxima (exp of it minus anything finite is 0)
_NAMES = ("q", "k", "v", "g", "beta", "a", "b", "ig", "mask")


def _compute_dtype(dtype) -> jnp.dtype:
  return jnp.float64 if jnp.dtype(dtype) == jnp.float64 else jnp.float32


def _prepare(q, k, v, log_decay, beta, a, b, log_input_gate, mask):
  """Head-major float arrays ([B, H, L, ...]) with the masking rule applied; see the module docstring."""
  dt = _compute_dtype(q.dtype)
  bsz, length, heads, _ = q.shape
  hm = lambda x: jnp.swapaxes(jnp.asarray(x, dt), 1, 2)                # [B, L, H, ...] -> [B, H, L, ...]
  q, k, v = hm(q), hm(k), hm(v)
  if mask is None:
    m = jnp.ones((bsz, 1, length), bool)
  else:
    m = jnp.asarray(mask, bool)[:, None, :]                             # [B, 1, L]
  mf = m.astype(dt)
  if log_decay is None:
    g, vector = jnp.zeros((bsz, heads, length), dt), False
  else:
    log_decay = jnp.asarray(log_decay, dt)
    if log_decay.ndim == 1:                                             # [H]
      g, vector = jnp.broadcast_to(log_decay[None, :, None], (bsz, heads, length)), False
    elif log_decay.ndim == 3:                                           # [B, L, H]
      g, vector = hm(log_decay), False
    elif log_decay.ndim == 4:                                           # [B, L, H, K]
      g, vector = hm(log_decay), True
    else:
      raise ValueError(f"log_decay must be [H], [B, L, H] or [B, L, H, K]; got shape {log_decay.shape}")
  g = g * (mf[..., None] if vector else mf)
  out = {"q": q * mf[..., None], "k": k * mf[..., None], "v": v, "g": g, "mask": m}
  if beta is not None:
    out["beta"] = hm(beta) * mf
  if a is not None:
    out["a"] = hm(a) * mf[..., None]
    out["b"] = hm(b)
  if log_input_gate is not None:
    out["ig"] = hm(log_input_gate)
  return out, vector


def _row(flag, ndim: int):
  """A per-row read flag ([B'] bool, or a Python bool) shaped to broadcast against an array of ``ndim`` dims."""
  f = jnp.asarray(flag)
  return f if f.ndim == 0 else f.reshape(f.shape + (1,) * (ndim - 1))


def _pick(excl, strict, before, mid, after):
  """The read of each row: "before" (excl), "mid" (strict, not excl) or "after"."""
  e, s = _row(excl, after.ndim), _row(strict, after.ndim)
  return jnp.where(e, before, jnp.where(s, mid, after))


def _recurrent(x, vector, excl, strict, any_excl):
  """Token-by-token ``lax.scan`` over L (axis 2 of the head-major arrays). Each row reads "after" (S_t),
  "before" (S_{t-1}; ``excl`` and ``strict``) or "mid" (D_t S_{t-1}, after the decay and before the write; only
  ``strict``: the backward pass of ``causal=False``). Returns o [B', H, L, V], or for mLSTM the stabilised
  (numerator [B', H, L, V], q.n [B', H, L], m [B', H, L]).

  One [K, V] contraction with q per step: the "after" read is the "mid" read plus the write read through q
  (S_t^T q = (D_t S_{t-1})^T q + the write's rank-one terms, e.g. beta (k.q) (v - (D_t S_{t-1})^T k) for the
  delta rule), and the "before" read S_{t-1}^T q is formed only when a row reads it (``any_excl``, static)."""
  q, v = x["q"], x["v"]
  bsz, heads, length, dk = q.shape
  dt = q.dtype
  xs = {name: jnp.moveaxis(x[name], 2, 0) for name in ("q", "k", "v", "g", "beta", "a", "b", "ig") if name in x}
  s0 = jnp.zeros((bsz, heads, dk, v.shape[-1]), dt)
  read = lambda s, qt: jnp.einsum("bhkv,bhk->bhv", s, qt)
  dot = lambda x, y: jnp.sum(x * y, -1)

  if "ig" in x:
    xs["mask"] = jnp.moveaxis(jnp.broadcast_to(x["mask"], (bsz, heads, length)), 2, 0)

    def step(carry, inp):
      c, n, m = carry
      qt, kt = inp["q"], inp["k"]
      m_dec = m + inp["g"]
      m_new = jnp.where(inp["mask"], jnp.maximum(m_dec, inp["ig"]), m)
      f_act = jnp.exp(m_dec - m_new)
      i_act = jnp.where(inp["mask"], jnp.exp(jnp.minimum(inp["ig"] - m_new, 0.0)), 0.0)
      c_new = f_act[..., None, None] * c + i_act[..., None, None] * jnp.einsum("bhk,bhv->bhkv", kt, inp["v"])
      n_new = f_act[..., None] * n + i_act[..., None] * kt
      num_old, den_old = read(c, qt), dot(n, qt)                        # "before" and "mid" read C_{t-1}
      write = i_act * dot(kt, qt)                                       # the new token's weight at q
      num_new = f_act[..., None] * num_old + write[..., None] * inp["v"]
      den_new = f_act * den_old + write
      return (c_new, n_new, m_new), (_pick(excl, strict, num_old, num_old, num_new),
                                     _pick(excl, strict, den_old, den_old, den_new),
                                     _pick(excl, strict, m, m_dec, m_new))

    init = (s0, jnp.zeros((bsz, heads, dk), dt), jnp.zeros((bsz, heads), dt))
    _, outs = jax.lax.scan(step, init, xs)
    return tuple(jnp.moveaxis(z, 0, 2) for z in outs)

  def step(s, inp):
    qt, kt, vt, gt = inp["q"], inp["k"], inp["v"], inp["g"]
    s_dec = jnp.exp(gt)[..., :, None] * s if vector else jnp.exp(gt)[..., None, None] * s
    mid = read(s_dec, qt)
    if "beta" in inp:                                                   # delta rule: erase along k, then write
      u = inp["beta"][..., None] * (vt - jnp.einsum("bhkv,bhk->bhv", s_dec, kt))
      s_new = s_dec + jnp.einsum("bhk,bhv->bhkv", kt, u)
      after = mid + dot(kt, qt)[..., None] * u
    elif "a" in inp:                                                    # DPLR: + a (S_{t-1}^T b)^T + k v^T
      sb = jnp.einsum("bhkv,bhk->bhv", s, inp["b"])
      s_new = s_dec + jnp.einsum("bhk,bhv->bhkv", inp["a"], sb) + jnp.einsum("bhk,bhv->bhkv", kt, vt)
      after = mid + dot(inp["a"], qt)[..., None] * sb + dot(kt, qt)[..., None] * vt
    else:
      s_new = s_dec + jnp.einsum("bhk,bhv->bhkv", kt, vt)
      after = mid + dot(kt, qt)[..., None] * vt
    before = read(s, qt) if any_excl else mid
    return s_new, _pick(excl, strict, before, mid, after)

  _, o = jax.lax.scan(step, s0, xs)
  return jnp.moveaxis(o, 0, 2)


def _cumsum(x: jax.Array, axis: int, reverse: bool = False) -> jax.Array:
  """Inclusive cumulative sum along a chunk axis as one matmul with a triangular 0/1 matrix (XLA's CPU cumsum
  of a chunk axis is several times slower); ``reverse``: the suffix sums."""
  size = x.shape[axis]
  tri = jnp.tril(jnp.ones((size, size), x.dtype))                        # [t, s]: s <= t
  if reverse:
    tri = tri.T
  return jnp.moveaxis(jnp.tensordot(tri, jnp.moveaxis(x, axis, 0), axes=1), 0, axis)


def _segsum(g: jax.Array, axis: int) -> jax.Array:
  """Segment sums along ``axis`` (the within-chunk position, size C): out[..., t, j, ...] = sum_{s=j+1}^{t} g_s
  for j <= t (0 above the diagonal), summed from the g_s themselves (not as a difference of two cumulative
  sums, mamba_ssm/modules/ssd_minimal.py ``segsum``), so a long strongly-decayed chunk does not cost precision;
  one contraction with the constant 0/1 tensor [t, j, s] = (j < s <= t). The new j axis follows ``axis``."""
  size = g.shape[axis]
  r = jnp.arange(size)
  sel = ((r[None, :, None] < r[None, None, :]) & (r[None, None, :] <= r[:, None, None])).astype(g.dtype)
  out = jnp.tensordot(sel, jnp.moveaxis(g, axis, 0), axes=1)            # [C(t), C(j), ...rest]
  return jnp.moveaxis(out, (0, 1), (axis, axis + 1))


def _tri(size: int, strict, ndim: int, trailing: int = 0) -> jax.Array:
  """The lower-triangle mask [.., C, C(, 1..)] (j < t, and j == t where not ``strict``), broadcastable against
  an array of ``ndim`` dims whose (t, j) axes are followed by ``trailing`` axes."""
  lower = jnp.tril(jnp.ones((size, size), bool), -1)
  eye = jnp.eye(size, dtype=bool)
  lower, eye = (z.reshape(z.shape + (1,) * trailing) for z in (lower, eye))
  return lower | (eye & ~_row(strict, ndim))


def _gram(x, y, g, gi, excl, strict, sub):
  """The decayed Gram matrix of one chunk, [.., C, C]: A[t, j] = sum_k x_tk y_jk exp(Gx_tk - G_jk) on the lower
  triangle (j < t where ``strict``, else j <= t), 0 above; G_t = g_0 + .. + g_t (the chunk-local inclusive
  cumulative log decay ``gi``) and Gx_t = G_t, or G_{t-1} where ``excl`` (which implies ``strict``). ``excl``
  and ``strict`` are Python bools or per-row [B'] flags.

  Every exponent that is formed is <= 0. Scalar decay (g [.., C]): one [C, C] weight matrix exp(segsum).
  Per-key decay (g [.., C, K]): secondary chunks of ``sub`` positions (fla's chunk_gla sub-chunking). A block of
  rows I against the columns of an earlier sub-chunk J < I factors through R_I (G just before I) and R'_J (G at
  the end of J): exp(Gx_t - G_j) = exp(Gx_t - R_I) exp(R_I - R'_J) exp(R'_J - G_j), three exponents <= 0, so
  only [C, K] + [n, n, K] exponentials and matmuls; the diagonal blocks use [c, c, K] segment sums (memory
  C * c * K per chunk, not C^2 K)."""
  size = x.shape[-2]
  if g.ndim == x.ndim - 1:                                              # scalar decay per position
    seg = _segsum(g, g.ndim - 1) - _row(excl, g.ndim + 1) * g[..., :, None]  # [.., C, C]
    tri = _tri(size, strict, seg.ndim)
    w = jnp.where(tri, jnp.exp(jnp.where(tri, seg, 0.0)), 0.0)
    return jnp.einsum("...tk,...jk->...tj", x, y) * w
  n, c = size // sub, sub
  blk = lambda z: z.reshape(z.shape[:-2] + (n, c) + z.shape[-1:])       # [.., C, K] -> [.., n, c, K]
  xb, yb, gb = blk(x), blk(y), blk(g)
  seg = _segsum(gb, gb.ndim - 2) - _row(excl, gb.ndim + 1) * gb[..., :, None, :]  # [.., n, c(t), c(j), K]
  dtri = _tri(c, strict, seg.ndim, trailing=1)
  w = jnp.where(dtri, jnp.exp(jnp.where(dtri, seg, 0.0)), 0.0)
  diag = jnp.sum(xb[..., :, None, :] * yb[..., None, :, :] * w, axis=-1)  # [.., n, c, c]
  out = diag[..., :, :, None, :] * jnp.eye(n, dtype=diag.dtype)[:, None, :, None]  # [.., n, c, n, c]
  if n > 1:                                                             # blocks I > J, through R_I and R'_J
    ends = gi[..., c - 1 :: c, :]                                       # R'_J = G at the last position of J
    starts = jnp.concatenate([jnp.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], axis=-2)  # R_I = G before I
    xt = xb * jnp.exp(blk(gi - _row(excl, gi.ndim) * g) - starts[..., :, None, :])   # x_t e^{Gx_t - R_I}
    yt = yb * jnp.exp(ends[..., :, None, :] - blk(gi))                  # y_j e^{R'_J - G_j}
    later = jnp.arange(n)[:, None] > jnp.arange(n)[None, :]             # [I, J]: J < I
    e = starts[..., :, None, :] - ends[..., None, :, :]                 # R_I - R'_J <= 0 where J < I  [.., n, n, K]
    mid = jnp.where(later[..., None], jnp.exp(jnp.where(later[..., None], e, 0.0)), 0.0)
    ym = (mid[..., :, :, None, :] * yt[..., None, :, :, :]).reshape(mid.shape[:-2] + (size,) + mid.shape[-1:])
    out = out + jnp.einsum("...nik,...njk->...nij", xt, ym).reshape(out.shape)  # [.., n(I), c, C]
  return out.reshape(out.shape[:-4] + (size, size))


def _chunk_layout(x, chunk_size, sub_chunk_size):
  """Pads L to a multiple of the chunk C with masked positions and reshapes every array to [B', H, N, C, ...]."""
  length = x["q"].shape[2]
  sub = max(1, min(sub_chunk_size, chunk_size))
  if chunk_size % sub:
    sub = chunk_size
  size = chunk_size if length >= chunk_size else -(-length // sub) * sub
  sub = min(sub, size)
  n = -(-length // size)
  y = {}
  for name, z in x.items():
    widths = [(0, 0)] * z.ndim
    widths[2] = (0, n * size - length)
    z = jnp.pad(z, widths)
    y[name] = z.reshape(z.shape[:2] + (n, size) + z.shape[3:])
  return y, sub, length


def _unchunk(z, length):
  z = z.reshape(z.shape[:2] + (-1,) + z.shape[4:])
  return z[:, :, :length]


def _unit_lower_solve(lower: jax.Array, rhs: jax.Array) -> jax.Array:
  """(I + A)^-1 rhs for A [..., C, C] strictly lower triangular, by matmuls only: A is nilpotent (A^C = 0), so
  (I + A)^-1 = (I - A)(I + A^2)(I + A^4)... over ceil(log2 C) factors, exactly. Used instead of
  ``jax.scipy.linalg.solve_triangular``, whose CPU custom call hung inside the harness's compiled train and
  benchmark steps (an XLA CPU deadlock, all threads asleep; the token loop ran) and is a sequential
  substitution on accelerators; the products are the matmul-rich form fla's UT transform also uses."""
  power, out = -lower, rhs
  for _ in range(max(1, (lower.shape[-1] - 1).bit_length())):
    out = out + power @ out
    power = power @ power
  return out


def _chunk(x, vector, excl, strict, chunk_size, sub_chunk_size):
  """The chunked-parallel form of ``_recurrent`` (same arguments and results); module docstring, "chunk"."""
  y, sub, length = _chunk_layout(x, chunk_size, sub_chunk_size)
  if "ig" in y:
    return tuple(_unchunk(z, length) for z in _chunk_mlstm(y, excl, strict))
  q, k, v, g = y["q"], y["k"], y["v"], y["g"]
  dk = q.shape[-1]
  ax = 3                                                                # the within-chunk position axis
  gi = _cumsum(g, ax)                                                   # G_t
  tail = _cumsum(g, ax, reverse=True) - g                               # G_{C-1} - G_t = sum_{s>t} g_s
  e_end = jnp.exp(jnp.sum(g, axis=ax))                                  # [B', H, N(, K)]
  dec = lambda z, gg: z * jnp.exp(gg if vector else gg[..., None])
  gram = lambda xx, yy, ex, st: _gram(xx, yy, g, gi if vector else None, ex, st, sub)
  p = dec(q, gi - _row(excl, g.ndim) * g)                               # q_t exp(Gx_t)   [B', H, N, C, K]
  k_hat = dec(k, tail)                                                  # k_j exp(G_{C-1} - G_j)
  diag_m = lambda: (e_end[..., :, None] if vector else e_end[..., None, None]) * jnp.eye(dk, dtype=q.dtype)
  if "beta" in y:                                                       # delta rule, WY/UT form
    beta = y["beta"]
    lkk = beta[..., :, None] * gram(k, k, False, True)
    rhs = jnp.concatenate([beta[..., None] * v, beta[..., None] * dec(k, gi)], axis=-1)
    w = _unit_lower_solve(lkk, rhs)
    w1, w2 = w[..., : v.shape[-1]], w[..., v.shape[-1] :]               # U = W1 - W2 S_0
    att = gram(q, k, excl, strict)
    o1 = att @ w1
    p = p - att @ w2
    m_state = diag_m() - jnp.einsum("...jk,...jl->...kl", k_hat, w2)
    n_state = jnp.einsum("...jk,...jv->...kv", k_hat, w1)
  elif "a" in y:                                                        # DPLR
    a, b = y["a"], y["b"]
    lba = gram(b, a, True, True)
    lbk = gram(b, k, True, True)
    rhs = jnp.concatenate([lbk @ v, dec(b, gi - g)], axis=-1)
    w = _unit_lower_solve(-lba, rhs)
    wb, wa = w[..., : v.shape[-1]], w[..., v.shape[-1] :]               # S_{t-1}^T b_t = Wb + (Wa S_0)
    aqa = gram(q, a, excl, strict)
    o1 = aqa @ wb + gram(q, k, excl, strict) @ v
    p = p + aqa @ wa
    a_hat = dec(a, tail)
    m_state = diag_m() + jnp.einsum("...jk,...jl->...kl", a_hat, wa)
    n_state = jnp.einsum("...jk,...jv->...kv", a_hat, wb) + jnp.einsum("...jk,...jv->...kv", k_hat, v)
  else:                                                                 # additive
    o1 = gram(q, k, excl, strict) @ v
    m_state = e_end if vector else e_end[..., None]                     # diagonal transition [B', H, N, K|1]
    n_state = jnp.einsum("...jk,...jv->...kv", k_hat, v)
  full = m_state.ndim == n_state.ndim

  def step(s, inp):
    mm, nn = inp
    return (mm @ s if full else mm[..., None] * s) + nn, s

  s0 = jnp.zeros(n_state.shape[:2] + n_state.shape[3:], q.dtype)
  _, s_in = jax.lax.scan(step, s0, (jnp.moveaxis(m_state, 2, 0), jnp.moveaxis(n_state, 2, 0)))
  o = o1 + p @ jnp.moveaxis(s_in, 0, 2)
  return _unchunk(o, length)


def _chunk_mlstm(y, excl, strict):
  """Chunked stabilised mLSTM: xLSTM's parallel_stabilized_simple within a chunk (log weights, row maxima), a
  scan over the chunk states (C~, n~, m) across chunks; returns the stabilised (numerator, q.n, m) per position
  as ``_recurrent``."""
  q, k, v, g, ig = y["q"], y["k"], y["v"], y["g"], y["ig"]
  valid = jnp.broadcast_to(y["mask"], ig.shape)                         # [B', H, N, C]
  size = q.shape[3]
  ax = 3
  ex = _row(excl, g.ndim)
  gi = _cumsum(g, ax)
  gx = gi - ex * g
  tail = _cumsum(g, ax, reverse=True) - g
  seg = _segsum(g, ax) - ex[..., None] * g[..., :, None]                # [B', H, N, C, C]
  dmask = _tri(size, strict, seg.ndim) & valid[..., None, :]
  dlog = jnp.where(dmask, seg + ig[..., None, :], _NEG)                 # log weight of token j in the read at t
  mu = jnp.max(dlog, axis=-1)                                           # [B', H, N, C]
  elog = jnp.where(valid, tail + ig, _NEG)                              # log weight of token j in the end state
  has = jnp.any(valid, axis=-1)
  mu_e = jnp.where(has, jnp.max(elog, axis=-1), 0.0)                    # [B', H, N]
  we = jnp.where(valid, jnp.exp(jnp.where(valid, elog - mu_e[..., None], 0.0)), 0.0)
  c_hat = jnp.einsum("...j,...jk,...jv->...kv", we, k, v)
  n_hat = jnp.einsum("...j,...jk->...k", we, k)

  def step(carry, inp):
    c, n, m = carry
    ch, nh, me, ge, hs = inp
    m_dec = m + ge
    m_new = jnp.where(hs, jnp.maximum(m_dec, me), m_dec)
    f = jnp.exp(m_dec - m_new)
    i = jnp.where(hs, jnp.exp(jnp.minimum(me - m_new, 0.0)), 0.0)
    return (f[..., None, None] * c + i[..., None, None] * ch, f[..., None] * n + i[..., None] * nh, m_new), carry

  bsz, heads, _, _, dk = q.shape
  init = (jnp.zeros((bsz, heads, dk, v.shape[-1]), q.dtype), jnp.zeros((bsz, heads, dk), q.dtype),
          jnp.zeros((bsz, heads), q.dtype))
  mv = lambda z: jnp.moveaxis(z, 2, 0)
  _, (c_in, n_in, m_in) = jax.lax.scan(step, init, (mv(c_hat), mv(n_hat), mv(mu_e), mv(gi[..., -1]), mv(has)))
  c_in, n_in, m_in = (jnp.moveaxis(z, 0, 2) for z in (c_in, n_in, m_in))
  m_t = jnp.maximum(gx + m_in[..., None], mu)                           # [B', H, N, C]
  w_inter = jnp.exp(gx + m_in[..., None] - m_t)
  w_intra = jnp.where(dmask, jnp.exp(jnp.where(dmask, dlog - m_t[..., None], 0.0)), 0.0)
  att = jnp.einsum("...tk,...jk->...tj", q, k) * w_intra
  num = w_inter[..., None] * jnp.einsum("...tk,...kv->...tv", q, c_in) + att @ v
  den = w_inter * jnp.einsum("...tk,...k->...t", q, n_in) + jnp.sum(att, axis=-1)
  return num, den, m_t


def _reverse_for_backward(x):
  """The backward pass's inputs: every array reversed along L, the decay shifted first so that the real token
  at t carries the decay of the next real token (0 for the last one, and at masked positions): the decay between
  two real tokens is then the same both ways, and masked positions stay identity steps."""
  y = dict(x)
  g, m = x["g"], x["mask"]                                              # [B, H, L(, K)], [B, 1, L]
  length = g.shape[2]
  pos = jnp.where(m, jnp.arange(length), length)                        # [B, 1, L]
  after = jnp.concatenate([pos[..., 1:], jnp.full_like(pos[..., :1], length)], axis=-1)
  nxt = jax.lax.cummin(after, axis=2, reverse=True)                     # first real position > t (L: none)
  ok = m & (nxt < length)
  idx = jnp.broadcast_to(jnp.minimum(nxt, length - 1), g.shape[:3])
  if g.ndim == 4:
    y["g"] = jnp.where(ok[..., None], jnp.take_along_axis(g, idx[..., None], axis=2), 0.0)
  else:
    y["g"] = jnp.where(ok, jnp.take_along_axis(g, idx, axis=2), 0.0)
  return {name: jnp.flip(z, axis=2) for name, z in y.items()}


@functools.partial(jax.jit, static_argnames=("vector", "mode", "chunk_size", "sub_chunk_size", "any_excl"))
def _kernel(x, excl, strict, *, vector, mode, chunk_size, sub_chunk_size, any_excl):
  """The recurrence on prepared rows (one compiled program per structure and shape: the decay kinds None, [H]
  and [B, L, H] share it; inside a caller's jit it is inlined)."""
  if mode == "recurrent":
    return _recurrent(x, vector, excl, strict, any_excl)
  return _chunk(x, vector, excl, strict, chunk_size, sub_chunk_size)


def _mlstm_output(num, den, m, eps):
  return num / (jnp.maximum(jnp.abs(den), jnp.exp(-m)) + eps)[..., None]


def linear_recurrence(
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  *,
  log_decay: jax.Array | None = None,
  beta: jax.Array | None = None,
  a: jax.Array | None = None,
  b: jax.Array | None = None,
  log_input_gate: jax.Array | None = None,
  read: str = "after",
  mask: jax.Array | None = None,
  causal: bool = True,
  mode: str = "chunk",
  chunk_size: int = 64,
  normalizer_eps: float = 0.0,
  sub_chunk_size: int = 8,
) -> jax.Array:
  """o [B, L, H, V] (q's dtype) of the linear recurrence selected by the optional arguments (module docstring).

  Args:
    q, k: [B, L, H, K]; v: [B, L, H, V] (q already scaled by the layer).
    log_decay: None | [H] | [B, L, H] | [B, L, H, K], log of the decay (<= 0).
    beta: None | [B, L, H]: the delta rule.
    a, b: None | [B, L, H, K] each: the DPLR transition D_t + a_t b_t^T (b reads the state; fla's names swapped).
    log_input_gate: None | [B, L, H]: mLSTM's input-gate pre-activation (stabilised exponential gating).
    read: "after" (S_t) or "before" (S_{t-1}).
    mask: None | bool [B, L]; False positions are identity steps with output 0.
    causal: False adds the backward pass (module docstring, "Bidirectional"); both passes run as one kernel
      call over a doubled batch [forward rows; reversed rows].
    mode: "chunk" (chunked-parallel) or "recurrent" (lax.scan reference).
    chunk_size: C of the chunk form.
    normalizer_eps: mLSTM only: added to the denominator max(|n^T q|, exp(-m)) (xLSTM uses 1e-6).
    sub_chunk_size: c, the secondary chunk of the per-key-decay Gram matrices (chunk form).
  """
  if read not in READS:
    raise ValueError(f"read must be one of {READS}; got {read!r}")
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}; got {mode!r}")
  if (a is None) != (b is None):
    raise ValueError("a and b come together (the DPLR transition D + a b^T)")
  if beta is not None and a is not None:
    raise ValueError("beta (delta rule) and a, b (DPLR) are exclusive")
  if log_input_gate is not None:
    if beta is not None or a is not None:
      raise ValueError("log_input_gate (mLSTM) goes with the additive update only")
    if log_decay is not None and jnp.ndim(log_decay) == 4:
      raise ValueError("log_input_gate (mLSTM) needs a scalar decay per head: log_decay [H] or [B, L, H]")
  x, vector = _prepare(q, k, v, log_decay, beta, a, b, log_input_gate, mask)
  bsz = q.shape[0]
  fwd_excl, fwd_strict = read == "before", read != "after"
  if causal:
    excl, strict = jnp.array([fwd_excl] * bsz), jnp.array([fwd_strict] * bsz)
  else:                                                                 # rows [forward; backward ("mid" read)]
    rev = _reverse_for_backward(x)
    x = {name: jnp.concatenate([x[name], rev[name]], axis=0) for name in x}
    excl = jnp.array([fwd_excl] * bsz + [False] * bsz)
    strict = jnp.array([fwd_strict] * bsz + [True] * bsz)
  out = _kernel(x, excl, strict, vector=vector, mode=mode, chunk_size=chunk_size, sub_chunk_size=sub_chunk_size,
                any_excl=fwd_excl)
  mlstm = log_input_gate is not None
  if causal:
    o = _mlstm_output(*out, normalizer_eps) if mlstm else out
  elif mlstm:
    (num_f, num_b), (den_f, den_b), (m_f, m_b) = ((z[:bsz], jnp.flip(z[bsz:], axis=2)) for z in out)
    mx = jnp.maximum(m_f, m_b)                                          # the common stabiliser
    wf, wb = jnp.exp(m_f - mx), jnp.exp(m_b - mx)
    o = _mlstm_output(wf[..., None] * num_f + wb[..., None] * num_b, wf * den_f + wb * den_b, mx, normalizer_eps)
  else:
    o = out[:bsz] + jnp.flip(out[bsz:], axis=2)
  o = jnp.where(x["mask"][:bsz, :, :, None], o, 0.0)
  return jnp.swapaxes(o, 1, 2).astype(q.dtype)
