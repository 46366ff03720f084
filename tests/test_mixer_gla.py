"""GLA mixer (attention_zoo/mixers/gla.py), float64 and tiny: the whole layer against a numpy transcription of fla's
``naive_recurrent_gla`` (fla/ops/gla/naive.py) built from the module's own parameters (causal) and against the
full-matrix bidirectional form (forward + backward − diagonal); mode "chunk" against mode "recurrent" (outputs and
gradients, both directions); padding at the end and inside a row; causality; ``state_size``; the conformance kit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers.gla import GLAConfig

NAME = "gla"
D = 16
REL = 1e-9


def _np(tree):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def _inputs(seed, batch, length, d=D):
  return np.random.default_rng(seed).normal(size=(batch, length, d))


def _close(got, want, rel=REL):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  np.testing.assert_allclose(got, want, rtol=rel, atol=rel * max(1.0, float(np.abs(want).max())))


def _log_sigmoid(z):
  return -np.logaddexp(0.0, -z)


def _rms_norm(z, w, eps):
  return z / np.sqrt(np.mean(z * z, axis=-1, keepdims=True) + eps) * w


def naive_recurrent_gla(q, k, v, gk):
  """fla ``naive_recurrent_gla`` in numpy float64: q, k, gk [B, L, H, K], v [B, L, H, V]; scale K^-1/2;
  h = h ⊙ exp(gk_t) + k_t v_t^T, o_t = (q_t·scale)^T h."""
  batch, length, heads, k_dim = q.shape
  h = np.zeros((batch, heads, k_dim, v.shape[-1]))
  o = np.zeros(v.shape)
  scale = k_dim ** -0.5
  for t in range(length):
    h = h * np.exp(gk[:, t])[..., None] + k[:, t][..., None] * v[:, t][..., None, :]
    o[:, t] = np.sum((q[:, t] * scale)[..., None] * h, axis=-2)
  return o


def bidirectional_gla(q, k, v, gk):
  """The full-matrix bidirectional form: o_i = Σ_j (q_i·scale ⊙ exp(G_max(i,j) − G_min(i,j))) · k_j v_j with
  G_t = Σ_{m≤t} gk_m, i.e. the decays strictly after the earlier of i, j up to the later one (each token once)."""
  cum = np.cumsum(gk, axis=1)                                                   # [B, L, H, K]
  diff = cum[:, :, None] - cum[:, None, :]                                      # [B, i, j, H, K]
  weight = np.exp(-np.abs(diff))
  scores = np.einsum("bihk,bjhk,bijhk->bhij", q * q.shape[-1] ** -0.5, k, weight)
  return np.einsum("bhij,bjhv->bihv", scores, v)


def reference_layer(params, x, cfg: GLAConfig, causal=True):
  """The whole layer in numpy float64 from the module's parameters (no padding)."""
  p = _np(params)
  batch, length, d = x.shape
  heads, kd, vd = cfg.dims(d)
  split = lambda z, n: z.reshape(batch, length, heads, n)
  q = split(x @ p["q_proj"]["kernel"], kd)
  k = split(x @ p["k_proj"]["kernel"], kd)
  v = split(x @ p["v_proj"]["kernel"], vd)
  gk = (x @ p["gk_proj_0"]["kernel"]) @ p["gk_proj_1"]["kernel"] + p["gk_proj_1"]["bias"]
  gk = _log_sigmoid(split(gk, kd)) / cfg.gate_logit_normalizer
  o = naive_recurrent_gla(q, k, v, gk) if causal else bidirectional_gla(q, k, v, gk)
  g = split(x @ p["g_proj"]["kernel"], vd)
  o = _rms_norm(o, p["g_norm_weight"], cfg.norm_eps) * g / (1 + np.exp(-g))
  return o.reshape(batch, length, heads * vd) @ p["o_proj"]["kernel"]


_JITTED = {}


def _layer(**overrides):
  mixer = attention_zoo.create_mixer(NAME, **overrides)
  return mixer, mixer.config


def _jit(mixer, method):
  """jax.jit of mixer.apply / mixer.init, one per config (compiling once per shape is far cheaper than eager)."""
  key = (mixer.config, method)
  if key not in _JITTED:
    _JITTED[key] = jax.jit(getattr(mixer, method))
  return _JITTED[key]


def _apply(mixer, variables, x, mask):
  return _jit(mixer, "apply")(variables, jnp.asarray(x), jnp.asarray(mask))


def _init(mixer, x, seed=0):
  x = jnp.asarray(x)
  variables = _jit(mixer, "init")(jax.random.key(seed), x, jnp.ones(x.shape[:2], bool))
  # non-zero gate bias so that the gate's bias reaches the reference with a visible effect
  params = jax.tree_util.tree_map(lambda a: a, variables["params"])
  params["gk_proj_1"]["bias"] = jnp.asarray(np.random.default_rng(seed + 7).normal(size=params["gk_proj_1"]["bias"]
                                                                                    .shape), x.dtype)
  params["g_norm_weight"] = params["g_norm_weight"] + 0.3
  return {**variables, "params": params}


# The configs and shapes the tests share (one compilation each): the chunked form with chunks shorter than the rows.
CAUSAL = dict(causal=True, mode="chunk", chunk_size=4)
BIDIR = dict(causal=False, mode="chunk", chunk_size=4)
LENGTH = 14


def test_layer_matches_fla_naive_recurrent(x64):
  mixer, cfg = _layer(**CAUSAL)
  x = _inputs(0, 2, LENGTH) * 3.0
  variables = _init(mixer, x)
  out = _apply(mixer, variables, x, np.ones((2, LENGTH), bool))
  assert out.dtype == jnp.float64 and out.shape == x.shape
  _close(out, reference_layer(variables["params"], x, cfg, causal=True))


def test_bidirectional_matches_full_matrix_form(x64):
  mixer, cfg = _layer(**BIDIR)
  x = _inputs(1, 2, LENGTH) * 3.0
  variables = _init(mixer, x)
  out = _apply(mixer, variables, x, np.ones((2, LENGTH), bool))
  _close(out, reference_layer(variables["params"], x, cfg, causal=False))


@pytest.mark.parametrize("causal", [True, False])
def test_chunk_equals_recurrent_outputs_and_gradients(x64, causal):
  length = 21
  x = _inputs(2, 2, length)
  mask = np.ones((2, length), bool)
  mask[0, 5:8] = False
  mask[0, 17:] = False
  chunk, _ = _layer(causal=causal, mode="chunk", chunk_size=8)
  recurrent, _ = _layer(causal=causal, mode="recurrent")
  variables = _init(chunk, x)
  weights = jnp.asarray(np.random.default_rng(3).normal(size=x.shape))

  def value_and_grad(mixer):
    loss = lambda params, x: jnp.sum(mixer.apply({**variables, "params": params}, x, jnp.asarray(mask)) * weights)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(variables["params"], jnp.asarray(x))

  (out_c, g_c), (out_r, g_r) = value_and_grad(chunk), value_and_grad(recurrent)
  _close(out_c, out_r)
  for a, b in zip(jax.tree_util.tree_leaves(g_c), jax.tree_util.tree_leaves(g_r)):
    _close(a, b)


@pytest.mark.parametrize("overrides", [CAUSAL, BIDIR], ids=["causal", "bidirectional"])
def test_padding_end_and_middle_equals_row_without_padding(x64, overrides):
  mixer, _ = _layer(**overrides)
  x = _inputs(4, 2, LENGTH)
  variables = _init(mixer, x)
  for padded in ([10, 11, 12, 13], [3, 4, 9, 13], [0, 1, 6, 12]):              # end, middle, start + middle
    mask = np.ones((2, LENGTH), bool)
    mask[0, padded] = False
    noisy = x.copy()
    noisy[0, padded] = 50.0 * _inputs(5, 1, len(padded))[0]                    # padded content must not matter
    out = np.asarray(_apply(mixer, variables, noisy, mask))
    cut = np.asarray(_apply(mixer, variables, x[:1, mask[0]], np.ones((1, LENGTH - 4), bool)))
    _close(out[0, mask[0]], cut[0])
    assert np.all(out[0, ~mask[0]] == 0)
    _close(out[1], np.asarray(_apply(mixer, variables, x, np.ones((2, LENGTH), bool)))[1])


def test_causal_future_does_not_move_past(x64):
  i = 6
  mixer, _ = _layer(**CAUSAL)
  x = _inputs(6, 2, LENGTH)
  variables = _init(mixer, x)
  other = x.copy()
  other[:, i + 1:] += _inputs(7, 2, LENGTH - i - 1)
  mask = np.ones((2, LENGTH), bool)
  a, b = np.asarray(_apply(mixer, variables, x, mask)), np.asarray(_apply(mixer, variables, other, mask))
  np.testing.assert_allclose(a[:, :i + 1], b[:, :i + 1], rtol=0, atol=1e-14)
  assert not np.allclose(a[:, i + 1:], b[:, i + 1:])
  # the bidirectional layer does see the future
  bidir, _ = _layer(**BIDIR)
  assert not np.allclose(np.asarray(_apply(bidir, variables, x, mask))[:, :i + 1],
                         np.asarray(_apply(bidir, variables, other, mask))[:, :i + 1])


def test_state_size_and_head_derivation():
  cfg = attention_zoo.mixer_config(NAME)
  # d_model 64: key dim 32, value dim 64, 4 heads of K 8, V 16 -> 4·8·16
  assert cfg.dims(64) == (4, 8, 16)
  assert cfg.state_size(1000, 64) == 4 * 8 * 16 == 64 * 64 // (2 * 4)
  assert cfg.state_size(10, 16) == 4 * 2 * 4
  assert cfg.dims(24) == (4, 3, 6)                        # 12 and 24 split into 4 heads
  assert cfg.dims(20) == (2, 5, 10)                       # 10 and 20: 4 does not divide 10, 2 does
  assert GLAConfig(num_heads=3).dims(16) == (2, 4, 8)


def test_initialisation_follows_fla_models(x64):
  mixer, _ = _layer(**CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = _np(_jit(mixer, "init")(jax.random.key(0), x, jnp.ones((2, LENGTH), bool))["params"])
  kernels = np.concatenate([params[n]["kernel"].ravel() for n in ("q_proj", "k_proj", "v_proj", "g_proj",
                                                                    "gk_proj_0", "gk_proj_1", "o_proj")])
  assert kernels.size == 1408 and abs(kernels.std() / 0.02 - 1) < 0.1 and abs(kernels.mean()) < 2e-3
  assert np.all(params["gk_proj_1"]["bias"] == 0) and np.all(params["g_norm_weight"] == 1)
  assert params["gk_proj_0"]["kernel"].shape == (16, 16) and params["gk_proj_1"]["kernel"].shape == (16, 8)


def test_conformance_kit():
  try:
    from lra_bench.mixer_testing import assert_conformant
  except ImportError:  # the kit may move to lra_bench.testing
    from lra_bench.testing import assert_conformant
  assert_conformant(NAME)
