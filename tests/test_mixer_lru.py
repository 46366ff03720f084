"""LRU mixer (attention_zoo/mixers/lru.py): the associative scan against a sequential float64 loop, the
whole layer (forward and bidirectional) against a numpy reimplementation built from the module's own
parameters, the initial ring of eigenvalues and γ, padding independence, causality, gradients, jit,
dtypes, the registry entry and the ``ssm_`` parameter names."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import create_mixer, mixer_config
from attention_zoo import layer_family as mixer_family
from attention_zoo.mixers import lru

SSM_NAMES = {"ssm_nu_log", "ssm_theta_log", "ssm_gamma_log", "ssm_B_re", "ssm_B_im"}


def init_apply(module, x, mask, seed=0, variables=None, **kwargs):
  if variables is None:
    variables = module.init(jax.random.PRNGKey(seed), x, mask)
  return module.apply(variables, x, mask, **kwargs), variables


def random_input(seed, batch, length, h, dtype=jnp.float64):
  return jnp.asarray(np.random.default_rng(seed).normal(size=(batch, length, h)), dtype)


def loop_states(lam, bu, reverse=False):
  """Sequential float64 recurrence x_k = λ x_{k∓1} + bu_k over axis 1 of bu [B, L, N]."""
  lam = np.asarray(lam, np.complex128)
  bu = np.asarray(bu, np.complex128)
  out = np.zeros_like(bu)
  state = np.zeros((bu.shape[0], bu.shape[2]), np.complex128)
  steps = range(bu.shape[1] - 1, -1, -1) if reverse else range(bu.shape[1])
  for k in steps:
    state = lam * state + bu[:, k]
    out[:, k] = state
  return out


def gelu_tanh(z):
  return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z**3)))


def reference_layer(params, x, mask, bidirectional=False):
  """float64 numpy LRU layer from the definition: λ, γ, B, C, D from the parameters, a sequential loop,
  GELU (tanh form), GLU; padded positions' inputs zeroed, their outputs zeroed."""
  p = {k: (np.asarray(v, np.float64) if not isinstance(v, dict) else
           {kk: np.asarray(vv, np.float64) for kk, vv in v.items()}) for k, v in params.items()}
  u = np.asarray(x, np.float64) * np.asarray(mask, np.float64)[..., None]
  lam = np.exp(-np.exp(p["ssm_nu_log"]) + 1j * np.exp(p["ssm_theta_log"]))
  b = (p["ssm_B_re"] + 1j * p["ssm_B_im"]) * np.exp(p["ssm_gamma_log"])[:, None]
  bu = np.einsum("blh,nh->bln", u, b)
  c = p["C_re"] + 1j * p["C_im"]
  y = np.einsum("hn,bln->blh", c, loop_states(lam, bu)).real + p["D"] * u
  if bidirectional:
    cb = p["C_b_re"] + 1j * p["C_b_im"]
    y = y + np.einsum("hn,bln->blh", cb, loop_states(lam, bu, reverse=True)).real
  z = gelu_tanh(y)
  out1 = z @ p["out1"]["kernel"] + p["out1"]["bias"]
  out2 = z @ p["out2"]["kernel"] + p["out2"]["bias"]
  return out1 / (1 + np.exp(-out2)) * np.asarray(mask, np.float64)[..., None]


@pytest.mark.parametrize("method", ["associative", "sequential"])
def test_associative_scan_matches_sequential_loop(x64, method):
  rng = np.random.default_rng(0)
  n = 7
  lam = np.exp(-rng.uniform(0.01, 0.5, n) + 1j * rng.uniform(0, 6.28, n))
  bu = rng.normal(size=(2, 19, n)) + 1j * rng.normal(size=(2, 19, n))
  for reverse in (False, True):
    got = np.asarray(lru.linear_recurrence(jnp.asarray(lam), jnp.asarray(bu), reverse=reverse, method=method))
    np.testing.assert_allclose(got, loop_states(lam, bu, reverse), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_layer_matches_numpy_reference_with_padding(x64, bidirectional):
  """Forward (and forward + backward) loops from the module's own parameters; row 0 is padded at the
  end with non-zero content there (the mixer must ignore it)."""
  x = random_input(1, 2, 13, 3)
  mask = np.ones((2, 13), bool)
  mask[0, 9:] = False
  module = create_mixer("lru", d_state=5, r_min=0.5, r_max=0.95, bidirectional=bidirectional)
  out, variables = init_apply(module, x, jnp.asarray(mask))
  params = variables["params"]
  assert ("C_b_re" in params) == bidirectional
  assert out.dtype == jnp.float64 and out.shape == x.shape
  np.testing.assert_allclose(np.asarray(out), reference_layer(params, x, mask, bidirectional),
                             rtol=1e-10, atol=1e-12)


def test_init_ring_phase_and_gamma(x64):
  n, h = 4000, 2
  x = jnp.zeros((1, 3, h), jnp.float32)
  mask = jnp.ones((1, 3), bool)
  for r_min, r_max, max_phase in [(0.0, 1.0, 6.28), (0.9, 0.999, np.pi / 10), (0.5, 0.9, 6.28)]:
    module = create_mixer("lru", d_state=n, r_min=r_min, r_max=r_max, max_phase=max_phase)
    params = module.init(jax.random.PRNGKey(3), x, mask)["params"]
    p = {k: np.asarray(v, np.float64) for k, v in params.items() if not isinstance(v, dict)}
    radius = np.exp(-np.exp(p["ssm_nu_log"]))
    phase = np.exp(p["ssm_theta_log"])
    tol = 1e-6  # the parameters are float32
    assert np.all(radius >= r_min - tol) and np.all(radius <= r_max + tol)
    assert np.all(phase >= 0) and np.all(phase <= max_phase * (1 + tol))
    # γ = √(1 − |λ|²), compared squared (γ² + |λ|² = 1): near |λ| = 1 float32 cancels in 1 − |λ|²
    np.testing.assert_allclose(np.exp(2 * p["ssm_gamma_log"]), 1 - radius**2, rtol=1e-5, atol=1e-6)
    # |λ|² ~ U[r_min², r_max²]: mean and variance of the uniform within ~4 standard errors
    lo, hi = r_min**2, r_max**2
    r2 = radius**2
    assert abs(r2.mean() - (lo + hi) / 2) < 4 * (hi - lo) / np.sqrt(12 * n)
    assert abs(r2.var() / ((hi - lo) ** 2 / 12) - 1) < 0.1
    assert abs(phase.mean() / (max_phase / 2) - 1) < 0.05
    # B parts ~ N(0, 1/(2H)), C parts ~ N(0, 1/N), D ~ N(0, 1) [H] (only the B/C scales are testable)
    for name in ("ssm_B_re", "ssm_B_im"):
      assert p[name].shape == (n, h) and abs(p[name].std() * np.sqrt(2 * h) - 1) < 0.05
    for name in ("C_re", "C_im"):
      assert p[name].shape == (h, n) and abs(p[name].std() * np.sqrt(n) - 1) < 0.05
    assert p["D"].shape == (h,)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_padding_equals_truncated_row(x64, bidirectional):
  length, real = 16, 10
  x = random_input(4, 1, length, 3)
  mask = jnp.asarray(np.arange(length)[None] < real)
  module = create_mixer("lru", d_state=6, bidirectional=bidirectional)
  out, variables = init_apply(module, x, mask)
  short, _ = init_apply(module, x[:, :real], jnp.ones((1, real), bool), variables=variables)
  np.testing.assert_allclose(np.asarray(out)[0, :real], np.asarray(short)[0], rtol=1e-10, atol=1e-12)
  assert np.all(np.asarray(out)[0, real:] == 0)
  # more padding with different content: same real outputs
  longer = jnp.concatenate([x, 5.0 * random_input(5, 1, 7, 3)], axis=1)
  out2, _ = init_apply(module, longer, jnp.asarray(np.arange(length + 7)[None] < real), variables=variables)
  np.testing.assert_allclose(np.asarray(out2)[0, :real], np.asarray(short)[0], rtol=1e-10, atol=1e-12)


def test_causal_ignores_future_and_bidirectional(x64):
  length, i = 12, 5
  x = random_input(6, 1, length, 3)
  x2 = x.at[:, i + 1:].add(random_input(7, 1, length - i - 1, 3))
  mask = jnp.ones((1, length), bool)
  causal = create_mixer("lru", d_state=4, causal=True, bidirectional=True)
  out, variables = init_apply(causal, x, mask)
  assert "C_b_re" not in variables["params"]
  out2, _ = init_apply(causal, x2, mask, variables=variables)
  np.testing.assert_allclose(np.asarray(out2)[0, :i + 1], np.asarray(out)[0, :i + 1], rtol=0, atol=1e-14)
  assert not np.allclose(np.asarray(out2)[0, i + 1:], np.asarray(out)[0, i + 1:])
  # the non-causal bidirectional layer does see the future
  bidir = create_mixer("lru", d_state=4, bidirectional=True)
  out, variables = init_apply(bidir, x, mask)
  out2, _ = init_apply(bidir, x2, mask, variables=variables)
  assert not np.allclose(np.asarray(out2)[0, :i + 1], np.asarray(out)[0, :i + 1])


def test_gradients_jit_and_dtypes():
  x = random_input(8, 2, 9, 4, jnp.float32)
  mask = jnp.asarray(np.arange(9)[None] < np.array([[9], [6]]))
  module = create_mixer("lru", d_state=8, bidirectional=True, r_min=0.4, r_max=0.9)
  variables = module.init(jax.random.PRNGKey(0), x, mask)
  params = variables["params"]
  assert SSM_NAMES == {k for k in params if k.startswith("ssm_")}
  assert {"C_re", "C_im", "C_b_re", "C_b_im", "D", "out1", "out2"} == {k for k in params if k not in SSM_NAMES}

  def loss(p):
    return jnp.sum(module.apply({"params": p}, x, mask) ** 2)

  grads = jax.jit(jax.grad(loss))(params)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    g = np.asarray(g)
    assert np.all(np.isfinite(g)) and np.any(g != 0), jax.tree_util.keystr(path)

  apply = jax.jit(lambda v, x, m: module.apply(v, x, m))
  out32 = apply(variables, x, mask)
  assert out32.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out32), np.asarray(module.apply(variables, x, mask)), rtol=1e-5, atol=1e-6)
  out16 = apply(variables, x.astype(jnp.bfloat16), mask)
  assert out16.dtype == jnp.bfloat16 and out16.shape == x.shape
  np.testing.assert_allclose(np.asarray(out16, np.float32), np.asarray(out32), rtol=0.1, atol=0.05)


def test_dropout_and_registry():
  x = random_input(9, 2, 7, 4, jnp.float32)
  mask = jnp.ones((2, 7), bool)
  module = create_mixer("lru", d_state=4, dropout_rate=0.5)
  variables = module.init(jax.random.PRNGKey(0), x, mask)
  det = module.apply(variables, x, mask)
  drop = module.apply(variables, x, mask, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
  assert not np.allclose(np.asarray(det), np.asarray(drop))
  np.testing.assert_array_equal(np.asarray(det), np.asarray(module.apply(variables, x, mask, deterministic=True)))

  config = mixer_config("lru")
  defaults = (config.d_state, config.r_min, config.r_max, config.max_phase, config.bidirectional)
  assert defaults == (256, 0.0, 1.0, 6.28, False)
  assert (config.causal, config.dropout_rate) == (False, 0.0)
  assert config.paper_name == "LRU" and config.family == "ssm" and mixer_family("lru") == "ssm"
  assert not config.gated_residual and config.no_causal_form is None
  assert config.state_size(1000, 64) == 512 == mixer_config("lru", d_state=128).state_size(5, 8) * 2


@pytest.mark.parametrize("overrides, match", [({"r_min": 0.9, "r_max": 0.5}, "r_min <= r_max"),
                                              ({"r_max": 1.2}, "r_max <= 1"), ({"r_min": -0.1}, "0 <= r_min"),
                                              ({"r_min": 1.0, "r_max": 1.0}, "r_min < 1"),
                                              ({"max_phase": 0.0}, "max_phase")])
def test_bad_rings_are_refused_when_the_config_is_made(overrides, match):
  """A ring outside the unit circle used to surface as a NaN at step 1 (γ = √(1 − |λ|²)); r_min > r_max
  silently drew |λ|² from [r_max², r_min²]."""
  with pytest.raises(ValueError, match=match):
    mixer_config("lru", **overrides)
