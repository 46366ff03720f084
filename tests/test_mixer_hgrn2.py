"""HGRN2 mixer (attention_zoo/mixers/hgrn2.py), float64 and tiny: the whole layer against a numpy transcription of
fla's ``HGRN2Attention`` gates (fla/layers/hgrn2.py) and of ``naive_recurrent_gla`` (fla/ops/gla/naive.py, the kernel
HGRN2 runs on) built from the module's own parameters (causal; with and without a lower bound), and against the
full-matrix bidirectional form (forward + backward − diagonal); mode "chunk" against mode "recurrent" (outputs and
gradients, both directions); padding at the end and inside a row; causality; ``state_size``; the conformance kit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers.hgrn2 import HGRN2Config

NAME = "hgrn2"
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


def reference_layer(params, x, cfg: HGRN2Config, causal=True):
  """The whole layer in numpy float64 from the module's parameters (no padding), as fla's layer computes it:
  q = swish(q_proj x), g = logsigmoid(f_proj x) (with a bound β: logaddexp(log β, log1p(−β) + g)), k = 1 − exp(g),
  the GLA recurrence, RMSNorm over all of D, o_proj."""
  p = _np(params)
  batch, length, d = x.shape
  heads, kd, vd = cfg.dims(d)
  split = lambda z, n: z.reshape(batch, length, heads, n)
  q = x @ p["q_proj"]["kernel"]
  q = q / (1 + np.exp(-q))
  g = _log_sigmoid(x @ p["f_proj"]["kernel"])
  if cfg.lower_bound > 0:
    g = np.logaddexp(np.log(cfg.lower_bound), np.log1p(-cfg.lower_bound) + g)
  k = 1 - np.exp(g)
  i = x @ p["i_proj"]["kernel"]
  q, k, g, i = split(q, kd), split(k, kd), split(g, kd), split(i, vd)
  o = naive_recurrent_gla(q, k, i, g) if causal else bidirectional_gla(q, k, i, g)
  o = _rms_norm(o.reshape(batch, length, heads * vd), p["g_norm_weight"], cfg.norm_eps)
  return o @ p["o_proj"]["kernel"]


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
  # larger projections than fla's N(0, 0.02²) so that the gates leave their linear range, a norm weight not 1
  params = jax.tree_util.tree_map(lambda a: 10.0 * a, variables["params"])
  params["g_norm_weight"] = variables["params"]["g_norm_weight"] + 0.3
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


def test_lower_bound_matches_fla_logaddexp_form(x64):
  mixer, cfg = _layer(causal=True, mode="recurrent", lower_bound=0.4)
  x = _inputs(9, 2, LENGTH) * 3.0
  variables = _init(mixer, x)
  out = _apply(mixer, variables, x, np.ones((2, LENGTH), bool))
  _close(out, reference_layer(variables["params"], x, cfg, causal=True))
  unbounded, _ = _layer(causal=True, mode="recurrent")
  assert not np.allclose(out, _apply(unbounded, variables, x, np.ones((2, LENGTH), bool)))


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
  # E = the largest divisor of D that is <= 128, H = D / E: one head up to D = 128, then D / 128 heads
  assert cfg.dims(16) == (1, 16, 16) and cfg.dims(64) == (1, 64, 64) and cfg.dims(128) == (1, 128, 128)
  assert cfg.dims(512) == (4, 128, 128) and cfg.dims(384) == (3, 128, 128)
  assert cfg.dims(200) == (2, 100, 100)                   # 128 does not divide 200: E = 100
  assert cfg.state_size(1000, 16) == 16 * 16              # H·K·V = D·E
  assert cfg.state_size(7, 512) == 4 * 128 * 128 == 512 * 128
  assert HGRN2Config(expand_ratio=4).state_size(7, 16) == 4 * 4 * 4
  with pytest.raises(ValueError):
    HGRN2Config(lower_bound=1.0)


def test_initialisation_follows_fla_models(x64):
  mixer, _ = _layer(**CAUSAL)
  x = jnp.zeros((2, LENGTH, D))
  params = _np(_jit(mixer, "init")(jax.random.key(0), x, jnp.ones((2, LENGTH), bool))["params"])
  kernels = np.concatenate([params[n]["kernel"].ravel() for n in ("q_proj", "f_proj", "i_proj", "o_proj")])
  assert kernels.size == 1024 and abs(kernels.std() / 0.02 - 1) < 0.1 and abs(kernels.mean()) < 2e-3
  assert np.all(params["g_norm_weight"] == 1) and params["g_norm_weight"].shape == (D,)
  assert set(params) == {"q_proj", "f_proj", "i_proj", "o_proj", "g_norm_weight"}


def test_conformance_kit():
  try:
    from lra_bench.mixer_testing import assert_conformant
  except ImportError:  # the kit may move to lra_bench.testing
    from lra_bench.testing import assert_conformant
  assert_conformant(NAME)
