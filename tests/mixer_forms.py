"""The forms the sequence-mixer tests share (tests/test_mixer_*.py; not collected: no ``test_`` prefix).

Each test file keeps its layer's reference transcription and its assertions with their tolerances (mamba and
rg_lru share theirs: :func:`block_agree`, :func:`block_same`); what is the same from file to file is here:

- building a layer's variables and running it (compiled once per config and shape);
- the tests a family of layers shares, one class per family that each of its files subclasses as
  ``TestContract`` (:class:`EngineContract`: gla, retnet, hgrn2, mamba2; :class:`DeltaContract`: deltanet,
  gated_deltanet, kda; :class:`RWKVContract`: rwkv6, rwkv7), the family's runs of a layer for the files' own
  reference tests (:func:`engine_outputs`, :func:`delta_outputs`), and the scenarios of mamba and rg_lru
  (``block_*``);
- the contract checks, each with the file's own comparison ``agree(got, want)`` (its tolerance):
  :func:`check_chunk_equals_recurrent` (outputs and gradients of mode "chunk" and mode "recurrent"),
  :func:`check_padding_removed` (the padded rows against the rows with their padding removed, padding at the
  end or inside a row), :func:`check_causal` (the outputs before a changed future stay), and the computations
  under them (:func:`chunk_and_recurrent`, :func:`padding_removed`, :func:`future_changed`) for a file that
  compares more;
- the comparisons (:func:`close`, :func:`assert_within`, :func:`rel_err`) and the float64
  numpy pieces several references use (activations, norms, fla's short convolution, fla's GLA recurrence and
  gated output, RWKV's token shift and ``ln_x``, the backward half of the bidirectional delta rule).

Float64: the ``x64`` fixture of tests/conftest.py. The conformance kit (``lra_bench.testing``) is not run here:
tests/test_attention_registry.py runs each of its checks on every registered layer, these included.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo

# ---------------------------------------------------------------- inputs, comparisons


def rows(seed, batch, length, d):
  """float64 numpy [B, L, D] ~ N(0, 1)."""
  return np.random.default_rng(seed).normal(size=(batch, length, d))


def as64(tree):
  """A parameter tree as float64 numpy arrays."""
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def close(got, want, rel):
  """Elementwise |got − want| ≤ rel·|want| + rel·max(1, max |want|)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  np.testing.assert_allclose(got, want, rtol=rel, atol=rel * max(1.0, float(np.abs(want).max())))


def assert_within(got, want, rtol):
  """max |got − want| ≤ rtol · max |want| (shapes equal)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  assert got.shape == want.shape
  scale = max(np.abs(want).max(), 1e-300)
  err = np.abs(got - want).max()
  assert err <= rtol * scale, f"max |got − want| = {err:.3e} > {rtol:g} · {scale:.3e}"


def rel_err(a, b):
  """max |a − b| / max |b|."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


# ---------------------------------------------------------------- building and running a layer

_COMPILED = {}


def compiled(module, method="apply"):
  """jax.jit of ``module.apply`` / ``module.init``, one per config (compiling once per shape is far cheaper
  than running op by op)."""
  key = (module.config, method)
  if key not in _COMPILED:
    _COMPILED[key] = jax.jit(getattr(module, method))
  return _COMPILED[key]


def ones_mask(x):
  return jnp.ones(np.shape(x)[:2], bool)


def init(module, x, mask=None, seed=0):
  """The layer's variables for input x (compiled init; mask all True when None)."""
  x = jnp.asarray(x)
  return compiled(module, "init")(jax.random.key(seed), x, ones_mask(x) if mask is None else jnp.asarray(mask))


def apply(module, variables, x, mask=None):
  """The layer's outputs (compiled apply; mask all True when None)."""
  x = jnp.asarray(x)
  return compiled(module)(variables, x, ones_mask(x) if mask is None else jnp.asarray(mask))


_PERTURBED = {}


def perturbed_layer(name, seed=0, batch=2, length=10, d=16, **overrides):
  """(mixer, x float64 [B, L, D], variables) with every parameter moved off its init by 0.1·N(0, 1) (so that
  zero biases, unit norm scales and tiny LoRA matrices all matter in the comparisons). The parameters depend
  only on (name, seed, d, the config's head_dim): made once per test session."""
  mixer = attention_zoo.create_mixer(name, **overrides)
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(size=(batch, length, d)), jnp.float64)
  key = (name, seed, d, mixer.config.head_dim)
  if key not in _PERTURBED:
    init_fn = attention_zoo.create_mixer(name, head_dim=mixer.config.head_dim, mode="recurrent").init
    params = jax.jit(init_fn)(jax.random.key(seed), x[:1, :2], jnp.ones((1, 2), bool))["params"]
    _PERTURBED[key] = jax.tree.map(lambda p: p + 0.1 * jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
  return mixer, x, {"params": _PERTURBED[key]}


# ---------------------------------------------------------------- the contract checks' computations


def outputs_and_grads(module, params, x, mask, weights=None, sin=False, jit=True):
  """(loss, outputs, (∂loss/∂params, ∂loss/∂x)) of loss = Σ f(outputs) ⊙ weights, f = sin (``sin``) or the
  identity, weights 1 when None; compiled as one program unless ``jit`` is False (op by op)."""
  mask = jnp.asarray(mask)

  def loss(params, x):
    out = module.apply({"params": params}, x, mask)
    f = jnp.sin(out) if sin else out
    return jnp.sum(f if weights is None else f * weights), out

  fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
  (value, out), grads = (jax.jit(fn) if jit else fn)(params, jnp.asarray(x))
  return value, out, grads


def chunk_and_recurrent(chunk, recurrent, params, x, mask, **kwargs):
  """:func:`outputs_and_grads` of the layer in mode "chunk" and in mode "recurrent" (the same parameters): two
  tuples (loss, outputs, (∂/∂params, ∂/∂x)) to compare."""
  return tuple(outputs_and_grads(module, params, x, mask, **kwargs) for module in (chunk, recurrent))


def paired_leaves(a, b):
  """[(key path, leaf of a, leaf of b)] of two trees of one structure (a gradient pair), leaves float64 numpy."""
  flat_a, flat_b = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)
  assert len(flat_a) == len(flat_b)
  return [(jax.tree_util.keystr(path), np.asarray(u, np.float64), np.asarray(v, np.float64))
          for (path, u), v in zip(flat_a, flat_b)]


def padding_removed(run, x, mask, rows_to_check=None):
  """(out, want), numpy float64: ``out = run(x, mask)`` on the padded rows, and ``want`` the outputs of each row
  with its padded positions removed, placed back at its real positions (0 at padded ones). The cut rows are
  run alone (rows keeping the same number of real tokens share one call); a row without padding is taken
  from one call of the whole batch with every position real. ``rows_to_check``: the rows ``want`` is computed
  for (default all; the others stay 0). ``run(x, mask)`` takes and returns [B, L, ...] arrays."""
  x, mask = np.asarray(x), np.asarray(mask, bool)
  out = np.asarray(run(jnp.asarray(x), jnp.asarray(mask)), np.float64)
  want = np.zeros_like(out)
  checked = range(len(x)) if rows_to_check is None else rows_to_check
  whole = [r for r in checked if mask[r].all()]
  if whole:
    want[whole] = np.asarray(run(jnp.asarray(x), jnp.ones(mask.shape, bool)), np.float64)[whole]
  groups = collections.defaultdict(list)
  for r in checked:
    if not mask[r].all():
      groups[int(mask[r].sum())].append(r)
  for group in groups.values():
    cut = np.stack([x[r, mask[r]] for r in group])
    got = np.asarray(run(jnp.asarray(cut), jnp.ones(cut.shape[:2], bool)), np.float64)
    for i, r in enumerate(group):
      want[r, mask[r]] = got[i]
  return out, want


def future_changed(run, x, start, seed, replace=False):
  """(a, b), numpy float64: ``run(x)`` and ``run(x')``, x' = x with its positions from ``start`` on moved by
  (``replace``: replaced with) N(0, 1) draws from ``seed``. A causal layer keeps a[:, :start] = b[:, :start]."""
  x = np.asarray(x)
  noise = np.random.default_rng(seed).normal(size=x[:, start:].shape)
  changed = x.copy()
  changed[:, start:] = noise if replace else changed[:, start:] + noise
  return tuple(np.asarray(run(jnp.asarray(z)), np.float64) for z in (x, changed))


# ---------------------------------------------------------------- the contract checks
# ``agree(got, want)`` is the test file's own comparison (it asserts, with the file's tolerance).


def _agree_at(agree, what, got, want):
  try:
    agree(got, want)
  except AssertionError as error:
    raise AssertionError(f"{what}: {error}") from None


def check_chunk_equals_recurrent(chunk, recurrent, params, x, mask, agree, nonzero=False, **kwargs):
  """Mode "chunk" and mode "recurrent" give the same outputs and the same gradients (every parameter and the
  input) of :func:`outputs_and_grads`'s loss (``kwargs``: its weights, sin, jit); ``nonzero``: every gradient is
  non-zero somewhere."""
  (_, out_c, grads_c), (_, out_r, grads_r) = chunk_and_recurrent(chunk, recurrent, params, x, mask, **kwargs)
  _agree_at(agree, "outputs", out_c, out_r)
  for path, a, b in paired_leaves(grads_c, grads_r):
    assert not nonzero or np.abs(b).max() > 0, f"zero gradient for {path}"
    _agree_at(agree, f"gradient {path}", a, b)


def check_padding_removed(run, x, mask, agree, rows_to_check=None):
  """The padding contract (:func:`padding_removed`): each checked row's real outputs equal those of the row with
  its padded positions removed, whatever the padded positions hold; every padded output is 0."""
  out, want = padding_removed(run, x, mask, rows_to_check)
  mask = np.asarray(mask, bool)
  for r in range(len(mask)) if rows_to_check is None else rows_to_check:
    _agree_at(agree, f"row {r}", out[r, mask[r]], want[r, mask[r]])
  assert np.all(out[~mask] == 0)


def check_causal(run, x, start, seed, past_atol=0.0, bidirectional=None, replace=False):
  """Causality (:func:`future_changed`): changing the tokens from ``start`` on leaves the outputs before it
  unchanged (within ``past_atol``) and moves the later ones; ``bidirectional`` (a run of the same layer with
  ``causal=False``) does move the earlier ones. Returns the causal pair (a, b)."""
  a, b = future_changed(run, x, start, seed, replace)
  np.testing.assert_allclose(a[:, :start], b[:, :start], rtol=0, atol=past_atol)
  assert not np.allclose(a[:, start:], b[:, start:])
  if bidirectional is not None:
    c, d = future_changed(bidirectional, x, start, seed, replace)
    assert not np.allclose(c[:, :start], d[:, :start])
  return a, b


# ---------------------------------------------------------------- float64 numpy pieces of the references


def silu(z):
  return z / (1 + np.exp(-z))


def sigmoid(z):
  return 1 / (1 + np.exp(-z))


def softplus(z):
  return np.logaddexp(0.0, z)


def log_sigmoid(z):
  return -np.logaddexp(0.0, -z)


def rms_norm(z, weight, eps):
  """fla RMSNorm: z / sqrt(mean z² + eps) · weight over the last axis."""
  return z / np.sqrt(np.mean(z * z, axis=-1, keepdims=True) + eps) * weight


def l2norm(z, eps=1e-6):
  """fla/modules/l2norm.py: z / sqrt(Σz² + eps) over the last axis."""
  return z / np.sqrt((z * z).sum(-1, keepdims=True) + eps)


def fla_short_conv(x, weight, activation=True):
  """fla ShortConvolution (Conv1d, groups = C, padding W − 1, first L outputs) then SiLU (``activation=False``:
  fla's ``activation=None``, as HGRN2's): x [B, L, C], weight [W, C] (flax layout; torch's [C, 1, W] is its
  transpose): y_t = Σ_i w_i x_{t−W+1+i}."""
  width, length = weight.shape[0], x.shape[1]
  padded = np.concatenate([np.zeros((x.shape[0], width - 1, x.shape[2])), x], axis=1)
  y = sum(weight[i] * padded[:, i:i + length] for i in range(width))
  return silu(y) if activation else y


def naive_recurrent_gla(q, k, v, gk):
  """fla ``naive_recurrent_gla`` (fla/ops/gla/naive.py) in numpy float64: q, k, gk [B, L, H, K], v [B, L, H, V];
  scale K^-1/2; h = h ⊙ exp(gk_t) + k_t v_t^T, o_t = (q_t·scale)^T h."""
  batch, length, heads, k_dim = q.shape
  h = np.zeros((batch, heads, k_dim, v.shape[-1]))
  o = np.zeros(v.shape)
  scale = k_dim ** -0.5
  for t in range(length):
    h = h * np.exp(gk[:, t])[..., None] + k[:, t][..., None] * v[:, t][..., None, :]
    o[:, t] = np.sum((q[:, t] * scale)[..., None] * h, axis=-2)
  return o


def bidirectional_gla(q, k, v, gk):
  """The full-matrix bidirectional GLA form: o_i = Σ_j (q_i·scale ⊙ exp(G_max(i,j) − G_min(i,j))) · k_j v_j with
  G_t = Σ_{m≤t} gk_m, i.e. the decays strictly after the earlier of i, j up to the later one (each token once)."""
  cum = np.cumsum(gk, axis=1)                                                   # [B, L, H, K]
  diff = cum[:, :, None] - cum[:, None, :]                                      # [B, i, j, H, K]
  weight = np.exp(-np.abs(diff))
  scores = np.einsum("bihk,bjhk,bijhk->bhij", q * q.shape[-1] ** -0.5, k, weight)
  return np.einsum("bhij,bjhv->bihv", scores, v)


def fla_gated_output(p, o, x, eps):
  """The output of fla's GLA and RetNet layers (fla/layers/gla.py, fla/layers/multiscale_retention.py:
  ``FusedRMSNormGated`` with swish, then ``o_proj``) from parameters p: RMSNorm over each head's V (weight
  ``g_norm_weight`` [V]) ⊙ swish(x W_g), o [B, L, H, V], x [B, L, D] -> [B, L, D]."""
  g = (x @ p["g_proj"]["kernel"]).reshape(o.shape)
  o = rms_norm(o, p["g_norm_weight"], eps) * g / (1 + np.exp(-g))
  return o.reshape(*o.shape[:2], -1) @ p["o_proj"]["kernel"]


def rwkv_shift(x, kd, causal):
  """RWKV-LM's token shift minus the token, ``time_shift(x) − x`` (``RWKV-v5/src/model.py`` ``RWKV_Tmix_x060``
  and ``RWKV-v7/train_temp/src/model.py`` ``RWKV_Tmix_x070``: x_{t−1} − x_t, zero before the first token), x
  [B, T, D]; ``causal`` False: Vision-RWKV's q-shift (``vrwkv6.py`` ``q_shift_multihead``) on one axis, the
  channels from ⌈K/2⌉ on of every block of ``kd`` taking the next token instead (zero after the last)."""
  prev = np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
  if not causal:
    nxt = np.concatenate([x[:, 1:], np.zeros_like(x[:, :1])], axis=1)
    prev = np.where(np.arange(x.shape[-1]) % kd >= (kd + 1) // 2, nxt, prev)
  return prev - x


def rwkv_ln_x(o, scale, bias, eps):
  """RWKV-LM's ``ln_x`` (``nn.GroupNorm(H, D)``, the same two files): o [B, T, H, V] normalised over each head's
  V (mean, biased variance), flattened to [B, T, H·V], ⊙ scale + bias."""
  mean = o.mean(-1, keepdims=True)
  var = ((o - mean) ** 2).mean(-1, keepdims=True)
  return ((o - mean) / np.sqrt(var + eps)).reshape(*o.shape[:2], -1) * scale + bias


def delta_rule_backward(q, k, v, beta, log_decay=None):
  """The backward half of a bidirectional delta-rule layer (``linear_recurrence(..., causal=False)``): the same
  delta rule over the reversed sequence, reading before writing, the decay between positions t < j being
  Π_{t<i≤j} α_i as in the forward pass. q (scaled), k [B, L, H, K], v [B, L, H, V], beta [B, L, H], log_decay
  None, [B, L, H] or [B, L, H, K]. Returns [B, L, H, V]:

      R_L = 0;  for t = L−1 … 0:  R' = Diag(α_{t+1}) R_{t+1} (α_L = 1),  o_t = R'ᵀ q_t,
                                   R_t = R' + β_t k_t (v_t − R'ᵀ k_t)ᵀ
  """
  bsz, length, heads, dk = q.shape
  if log_decay is None:
    log_decay = np.zeros((bsz, length, heads, dk))
  elif log_decay.ndim == 3:
    log_decay = np.broadcast_to(log_decay[..., None], (bsz, length, heads, dk))
  state = np.zeros((bsz, heads, dk, v.shape[-1]))
  out = np.zeros(v.shape)
  for t in range(length - 1, -1, -1):
    if t + 1 < length:
      state = np.exp(log_decay[:, t + 1])[..., None] * state
    out[:, t] = np.einsum("bhk,bhkv->bhv", q[:, t], state)
    err = v[:, t] - np.einsum("bhkv,bhk->bhv", state, k[:, t])
    state = state + beta[:, t, :, None, None] * np.einsum("bhk,bhv->bhkv", k[:, t], err)
  return out


# ---------------------------------------------------------------- the tests of a family of test files
# A family's files share their scenarios (inputs, masks, seeds, the checks run on them): one class each, which a
# file subclasses as ``TestContract`` (pytest collects the subclass, never the class here: this module is not a
# test file), setting the layer's ``name`` and its own comparison ``agree(got, want)`` (with its tolerance), and
# what the family asks for (its initialisation, its reference). Each class's docstring says what it tests.

ENGINE_CAUSAL = dict(causal=True, mode="chunk", chunk_size=4)   # gla, retnet, hgrn2, mamba2: chunks shorter than
ENGINE_BIDIR = dict(causal=False, mode="chunk", chunk_size=4)   # the rows, one compilation per config and shape
ENGINE_LENGTH = 14


def engine_outputs(name, overrides, make_variables, seed, length=ENGINE_LENGTH, d=16):
  """gla, retnet, hgrn2, mamba2: (out, params, x, config) of the layer (``overrides``) on rows [2, length, d] of
  3·N(0, 1) from ``seed``, without padding, its variables ``make_variables(mixer, x)`` (the file's); out float64 of
  x's shape, for the file's reference."""
  mixer = attention_zoo.create_mixer(name, **overrides)
  x = rows(seed, 2, length, d) * 3.0
  variables = make_variables(mixer, x)
  out = apply(mixer, variables, x, np.ones((2, length), bool))
  assert out.dtype == jnp.float64 and out.shape == x.shape
  return out, variables["params"], x, mixer.config


def check_short_conv_option(name, make_variables, agree, reference_layer, causal, conv_names, **overrides):
  """fla's ``use_short_conv=True`` option of gla, retnet, hgrn2: the layer (causal or bidirectional, plus
  ``overrides``) has the convolutions ``conv_names`` and equals ``reference_layer(params, x, config, causal=...)``
  (the file's transcription with fla's ShortConvolution); row 0 padded inside and at its end (its padded positions
  50·N(0, 1)) equals the row without them."""
  overrides = {**(ENGINE_CAUSAL if causal else ENGINE_BIDIR), "use_short_conv": True, **overrides}
  out, params, x, cfg = engine_outputs(name, overrides, make_variables, seed=2)
  assert set(conv_names) <= set(params)
  agree(out, reference_layer(params, x, cfg, causal=causal))
  mixer = attention_zoo.create_mixer(name, **overrides)
  variables = make_variables(mixer, x)
  mask = np.ones((2, ENGINE_LENGTH), bool)
  mask[0, [3, 4, 12, 13]] = False
  noisy = np.array(x)
  noisy[0, [3, 4, 12, 13]] = 50.0 * rows(5, 1, 4, x.shape[-1])[0]
  check_padding_removed(lambda z, m: apply(mixer, variables, z, m), noisy, mask, agree)


class EngineContract:
  """gla, retnet, hgrn2, mamba2 on the engine (float64, d_model 16, the chunked form with chunks of 4): the
  bidirectional layer against the file's full-matrix form; mode "chunk" against mode "recurrent" (outputs and
  gradients, both directions); padding at the end and inside a row; causality.

  A file sets ``name``, ``agree``, ``make_variables(mixer, x)`` (its initialisation, e.g. perturbed parameters)
  and ``bidirectional_reference(params, x, config)`` (its float64 transcription, no padding).
  """

  name: str

  def test_bidirectional_matches_full_matrix_form(self, x64):
    out, params, x, cfg = engine_outputs(self.name, ENGINE_BIDIR, self.make_variables, seed=1)
    self.agree(out, self.bidirectional_reference(params, x, cfg))

  @pytest.mark.parametrize("causal", [True, False])
  def test_chunk_equals_recurrent_outputs_and_gradients(self, x64, causal):
    """Rows of 21 (row 0 padded inside and at its end), chunks of 8, the loss Σ outputs ⊙ N(0, 1) weights."""
    x = rows(2, 2, 21, 16)
    mask = np.ones((2, 21), bool)
    mask[0, [5, 6, 7, 17, 18, 19, 20]] = False
    chunk = attention_zoo.create_mixer(self.name, causal=causal, mode="chunk", chunk_size=8)
    recurrent = attention_zoo.create_mixer(self.name, causal=causal, mode="recurrent")
    weights = jnp.asarray(np.random.default_rng(3).normal(size=x.shape))
    params = self.make_variables(chunk, x)["params"]
    check_chunk_equals_recurrent(chunk, recurrent, params, x, mask, self.agree, weights=weights)

  @pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
  def test_padding_end_and_middle_equals_row_without_padding(self, x64, causal):
    """Row 0 padded at its end, inside, at its start and inside, its padded positions holding 50·N(0, 1); row 1
    without padding."""
    mixer = attention_zoo.create_mixer(self.name, **(ENGINE_CAUSAL if causal else ENGINE_BIDIR))
    x = rows(4, 2, ENGINE_LENGTH, 16)
    variables = self.make_variables(mixer, x)
    for padded in ([10, 11, 12, 13], [3, 4, 9, 13], [0, 1, 6, 12]):              # end, middle, start + middle
      mask = np.ones((2, ENGINE_LENGTH), bool)
      mask[0, padded] = False
      noisy = x.copy()
      noisy[0, padded] = 50.0 * rows(5, 1, len(padded), 16)[0]                 # padded content must not matter
      check_padding_removed(lambda z, m: apply(mixer, variables, z, m), noisy, mask, self.agree)

  def test_causal_future_does_not_move_past(self, x64):
    """The tokens after position 6 moved by N(0, 1): the causal outputs before them stay (to 1e-14)."""
    mixer = attention_zoo.create_mixer(self.name, **ENGINE_CAUSAL)
    bidirectional = attention_zoo.create_mixer(self.name, **ENGINE_BIDIR)
    x = rows(6, 2, ENGINE_LENGTH, 16)
    variables = self.make_variables(mixer, x)
    check_causal(lambda z: apply(mixer, variables, z), x, 7, seed=7, past_atol=1e-14,
                 bidirectional=lambda z: apply(bidirectional, variables, z))


DELTA_LENGTH = 13  # one shape [2, 13, D] for most calls: op-by-op execution compiles each op once per shape


def delta_outputs(name, mode, d=16, **overrides):
  """deltanet, gated_deltanet, kda (op by op): (causal, x, params, out) for causal True, then False: the layer
  (``mode``, chunks of 4, ``overrides``, its own initialisation) on N(0, 1) rows [2, DELTA_LENGTH, d] of seed 1
  without padding; params float64 numpy, out float64 of x's shape, for the file's reference."""
  x = rows(1, 2, DELTA_LENGTH, d)
  mask = jnp.ones((2, DELTA_LENGTH), bool)
  for causal in (True, False):
    module = attention_zoo.create_mixer(name, causal=causal, mode=mode, chunk_size=4, **overrides)
    variables = module.init(jax.random.key(0), jnp.asarray(x), mask)
    out = module.apply(variables, jnp.asarray(x), mask)
    assert out.dtype == jnp.float64 and out.shape == x.shape
    yield causal, x, as64(variables["params"]), out


class DeltaContract:
  """deltanet, gated_deltanet, kda (float64, d_model 16, op by op, the layer's own initialisation): mode "chunk"
  against mode "recurrent" (outputs and gradients), padding at the end and in the middle, causality. A file sets
  ``name``, ``agree`` and ``overrides`` (its config for every check)."""

  name: str
  overrides: dict

  @pytest.mark.parametrize("causal", [True, False])
  def test_chunk_equals_recurrent(self, x64, causal):
    """Row 0 padded from position 9, chunks of 4 (several and a partial last one), the loss Σ outputs ⊙ N(0, 1)
    weights; every gradient non-zero."""
    x = rows(2, 2, DELTA_LENGTH, 16)
    mask = np.ones((2, DELTA_LENGTH), bool)
    mask[0, 9:] = False
    chunk = attention_zoo.create_mixer(self.name, causal=causal, mode="chunk", chunk_size=4, **self.overrides)
    recurrent = attention_zoo.create_mixer(self.name, causal=causal, mode="recurrent", **self.overrides)
    params = chunk.init(jax.random.key(0), jnp.asarray(x), jnp.asarray(mask))["params"]
    weights = jnp.asarray(np.random.default_rng(9).normal(size=x.shape))
    check_chunk_equals_recurrent(chunk, recurrent, params, x, mask, self.agree, nonzero=True, weights=weights,
                                 jit=False)

  @pytest.mark.parametrize("causal", [True, False])
  def test_padding_end_and_middle(self, x64, causal):
    """Row 0 padded at its end, row 1 inside and at its end (both keep 10 tokens), the padded positions holding
    non-zero content (a worst case: the encoder zeroes them)."""
    module = attention_zoo.create_mixer(self.name, causal=causal, **self.overrides)
    mask = np.ones((2, DELTA_LENGTH), bool)
    mask[0, 10:] = False
    mask[1, [2, 3, 12]] = False
    x = rows(3, 2, DELTA_LENGTH, 16)
    variables = module.init(jax.random.key(0), jnp.asarray(x), jnp.asarray(mask))
    check_padding_removed(lambda z, m: module.apply(variables, z, m), x, mask, self.agree)

  def test_causal(self, x64):
    """The tokens after position 6 moved by N(0, 1); the causal outputs before them exactly unchanged."""
    x = rows(5, 2, DELTA_LENGTH, 16)
    causal, bidirectional = (attention_zoo.create_mixer(self.name, causal=c, **self.overrides) for c in (True, False))
    variables = causal.init(jax.random.key(0), jnp.asarray(x), ones_mask(x))
    check_causal(lambda z: causal.apply(variables, z, ones_mask(z)), x, 7, seed=6,
                 bidirectional=lambda z: bidirectional.apply(variables, z, ones_mask(z)))


class RWKVContract:
  """rwkv6, rwkv7 (float64, d_model 16, parameters perturbed off their init: :func:`perturbed_layer`): the layer
  against the file's reference, causal and bidirectional; mode "chunk" against mode "recurrent" (outputs and
  gradients); padding at the end and in the middle; causality; the state size. A file sets
  ``name``, ``agree`` and ``reference(params, x, head_dim, causal)`` (its float64 transcription, no padding)."""

  name: str

  @pytest.mark.parametrize("mode, head_dim", [("recurrent", 64), ("chunk", 8)])  # 1 head of 16, 2 of 8
  def test_matches_numpy_reference_causal(self, x64, mode, head_dim):
    mixer, x, variables = perturbed_layer(self.name, causal=True, mode=mode, head_dim=head_dim, chunk_size=4)
    self.agree(apply(mixer, variables, x), self.reference(as64(variables["params"]), x, head_dim, causal=True))

  def test_matches_numpy_reference_bidirectional(self, x64):
    mixer, x, variables = perturbed_layer(self.name, causal=False, mode="recurrent", head_dim=8)
    self.agree(apply(mixer, variables, x), self.reference(as64(variables["params"]), x, 8, causal=False))

  @pytest.mark.parametrize("causal", [True, False])
  def test_chunk_equals_recurrent(self, x64, causal):
    """Chunk 32 (two of the engine's sub-chunks) over 40 tokens (a ragged last chunk), a padded tail (row 0) and a
    padded middle (row 1), the loss Σ sin(outputs)."""
    mixer, x, variables = perturbed_layer(self.name, causal=causal, mode="chunk", head_dim=8, chunk_size=32,
                                          length=40)
    recurrent = attention_zoo.create_mixer(self.name, causal=causal, mode="recurrent", head_dim=8)
    mask = np.ones(x.shape[:2], bool)
    mask[0, 29:] = False
    mask[1, [3, 4, 30, 31, 32, 33]] = False
    check_chunk_equals_recurrent(mixer, recurrent, variables["params"], x, mask, self.agree, sin=True)

  @pytest.mark.parametrize("causal", [True, False])
  def test_padding_end_and_middle(self, x64, causal):
    """Row 0 padded first, inside and at its end, row 1 at its end (both keep 6 real tokens), the padded positions
    holding x + 3."""
    mixer, x, variables = perturbed_layer(self.name, causal=causal, head_dim=8, chunk_size=4, length=12)
    mask = np.ones(x.shape[:2], bool)
    mask[0, [0, 4, 5, 9, 10, 11]] = False
    mask[1, 6:] = False
    garbage = np.asarray(x) + 3.0 * (~mask)[..., None]
    check_padding_removed(lambda z, m: apply(mixer, variables, z, m), garbage, mask, self.agree)

  def test_causal_future_does_not_move_past(self, x64):
    """The tokens from position 7 on replaced by N(0, 1) draws; the outputs before them exactly unchanged, the
    later ones moved by more than 1e-3."""
    mixer, x, variables = perturbed_layer(self.name, causal=True, head_dim=8, chunk_size=4, length=12)
    a, b = check_causal(lambda z: apply(mixer, variables, z), x, 7, seed=9, replace=True)
    assert np.max(np.abs(a[:, 7:] - b[:, 7:])) > 1e-3

  def test_state_size(self):
    config = attention_zoo.mixer_config(self.name)
    assert config.state_size(1000, 128) == 2 * 64 * 64 + 128  # H = 2, K = V = 64, plus the shift buffer
    assert config.state_size(10, 16) == 1 * 16 * 16 + 16  # one head of 16
    assert config.state_size(10, 100) == 100 * 100 + 100  # 64 does not divide 100: one head of 100
    assert attention_zoo.mixer_config(self.name, head_dim=8).state_size(5, 64) == 8 * 8 * 8 + 64


def block_inputs(seed, batch, length, d=16):
  """mamba, rg_lru: jnp float64 (under x64) [B, L, D] ~ N(0, 1)."""
  return jnp.asarray(rows(seed, batch, length, d))


def block_agree(got, want):
  """mamba, rg_lru, chunk == recurrent: max |a − b| ≤ 1e-9 · max |b|."""
  assert_within(got, want, 1e-9)


def block_same(got, want):
  """mamba, rg_lru, padding removed: the same numbers up to rounding."""
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)


def init_apply(module, x, mask, variables=None):
  """(outputs numpy, variables) of ``module`` on x (its own init with key 0 when ``variables`` is None)."""
  if variables is None:
    variables = module.init(jax.random.PRNGKey(0), x, mask)
  return np.asarray(module.apply(variables, x, mask)), variables


def block_chunk_equals_recurrent(name, causal, agree, d=16, **overrides):
  """mamba, rg_lru: rows of 11 (row 1 padded inside, zeroed there), the loss Σ sin(outputs), the layer's own
  initialisation; every gradient non-zero."""
  mask = jnp.asarray(np.array([[True] * 11, [True] * 4 + [False] * 3 + [True] * 4]))
  x = jnp.asarray(rows(1, 2, 11, d)) * mask[..., None]
  chunk = attention_zoo.create_mixer(name, causal=causal, **overrides)
  recurrent = attention_zoo.create_mixer(name, causal=causal, mode="recurrent")
  params = chunk.lazy_init(jax.random.PRNGKey(0), x, mask)["params"]
  check_chunk_equals_recurrent(chunk, recurrent, params, x, mask, agree, nonzero=True, sin=True)


def block_padding_removed(module, make_variables, agree, d=16):
  """mamba, rg_lru: row 0 padded inside and at its end, row 1 at its start, inside and at its end, both holding
  the same 7 real tokens and 7·N(0, 1) at their padded positions; ``make_variables(module, x, mask)``."""
  places = [[0, 1, 2, 5, 6, 7, 8], [2, 3, 4, 7, 9, 10, 11]]
  real = rows(3, 1, len(places[0]), d)[0]
  x = rows(4, 2, 12, d) * 7
  mask = np.zeros((2, 12), bool)
  for row, where in enumerate(places):
    mask[row, where] = True
    x[row, where] = real
  variables = make_variables(module, jnp.asarray(x), jnp.asarray(mask))
  check_padding_removed(lambda z, m: module.apply(variables, z, m), x, mask, agree)


def block_causal(name, backward_param, d=16, **overrides):
  """mamba, rg_lru: with ``causal`` (and ``bidirectional`` asked for, ignored: no ``backward_param``) the outputs
  before the changed tokens (from position 5 on, moved by N(0, 1)) stay, in both modes; the default
  (bidirectional) layer's do not."""
  x = rows(5, 1, 10, d)
  for mode in ("chunk", "recurrent"):
    module = attention_zoo.create_mixer(name, causal=True, bidirectional=True, mode=mode, **overrides)
    variables = module.init(jax.random.PRNGKey(0), jnp.asarray(x), ones_mask(x))
    assert backward_param not in variables["params"]
    check_causal(lambda z: module.apply(variables, z, ones_mask(z)), x, 5, seed=6, past_atol=1e-14)
  module = attention_zoo.create_mixer(name, **overrides)
  variables = module.init(jax.random.PRNGKey(0), jnp.asarray(x), ones_mask(x))
  a, b = future_changed(lambda z: module.apply(variables, z, ones_mask(z)), x, 5, seed=6)
  assert not np.allclose(a[:, :5], b[:, :5])
