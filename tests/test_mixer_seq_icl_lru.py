"""seq_icl's gated LRU mixer (attention_zoo/mixers/seq_icl_lru.py): the layer against a float64 numpy
reimplementation built from the module's own parameters (a sequential complex loop), the initialisation
(the eigenvalue ring, γ, the N(0, 0.02) projections), padding, the state size, the parameter groups and
the ``seq_icl`` protocol's settings."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import create_mixer, mixer_config
from attention_zoo import layer_family as mixer_family
from lra_bench.training import config as config_lib


def reference_layer(params, x, mask, eps=1e-5):
  """float64 numpy layer from the original's forward: in_proj, split, λ and γ, a sequential complex loop,
  [Re h, Im h] ⊙ SiLU(o), LayerNorm, out_proj; padded inputs zeroed, padded outputs zeroed."""
  p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
  keep = np.asarray(mask, np.float64)[..., None]
  x = np.asarray(x, np.float64)
  u = x @ p["in_proj"]["kernel"] + p["in_proj"]["bias"]
  h = x.shape[-1]
  v, o = u[..., :2 * h] * keep, u[..., 2 * h:]
  lam = np.exp(-np.exp(p["nu_log"])) * np.exp(1j * np.exp(p["theta_log"]))
  gamma = np.exp(p["gamma_log"])
  inp = gamma * v[..., :h] + 1j * gamma * v[..., h:]
  states = np.zeros_like(inp)
  state = np.zeros((x.shape[0], h), np.complex128)
  for k in range(x.shape[1]):
    state = lam * state + inp[:, k]
    states[:, k] = state
  y = np.concatenate([states.real, states.imag], -1) * (o / (1 + np.exp(-o)))
  mean = y.mean(-1, keepdims=True)
  var = ((y - mean) ** 2).mean(-1, keepdims=True)
  y = (y - mean) / np.sqrt(var + eps) * p["layer_norm"]["scale"] + p["layer_norm"]["bias"]
  return (y @ p["out_proj"]["kernel"] + p["out_proj"]["bias"]) * keep


def _randomised(params, seed):
  """The parameters with every bias, scale and projection moved off its initial value, so the
  reference comparison sees each term (zero biases would hide a missing bias)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda v: jnp.asarray(np.asarray(v) + 0.3 * rng.normal(size=v.shape), v.dtype), params)


def test_layer_matches_numpy_reference_with_padding(x64):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 11, 4)), jnp.float64)
  mask = np.ones((2, 11), bool)
  mask[1, 7:] = False
  module = create_mixer("seq_icl_lru")
  variables = module.init(jax.random.PRNGKey(0), x, jnp.asarray(mask))
  params = _randomised(variables["params"], 1)
  params = dict(params, nu_log=variables["params"]["nu_log"])  # keep |λ| < 1 as trained values would
  out = module.apply({"params": params}, x, jnp.asarray(mask))
  assert out.dtype == jnp.float64 and out.shape == x.shape
  np.testing.assert_allclose(np.asarray(out), reference_layer(params, x, mask), rtol=1e-10, atol=1e-12)
  # the padded tail of row 1 holds other content: the real positions do not change
  x2 = x.at[1, 7:].set(100.0)
  np.testing.assert_allclose(np.asarray(module.apply({"params": params}, x2, jnp.asarray(mask)))[1, :7],
                             np.asarray(out)[1, :7], rtol=1e-12, atol=1e-12)


def test_initialisation_is_the_originals():
  h = 2000
  x = jnp.zeros((1, 3, h), jnp.float32)
  params = create_mixer("seq_icl_lru").init(jax.random.PRNGKey(3), x, jnp.ones((1, 3), bool))["params"]
  p = jax.tree.map(lambda v: np.asarray(v, np.float64), params)
  radius = np.exp(-np.exp(p["nu_log"]))
  phase = np.exp(p["theta_log"])
  assert radius.min() >= 0.9 - 1e-6 and radius.max() <= 0.999 + 1e-6
  r2 = radius**2                                   # |λ|² ~ U[0.81, 0.998]
  lo, hi = 0.81, 0.999**2
  assert abs(r2.mean() - (lo + hi) / 2) < 4 * (hi - lo) / np.sqrt(12 * h)
  assert phase.min() >= 0 and phase.max() <= 2 * np.pi * (1 + 1e-6)
  assert abs(phase.mean() / np.pi - 1) < 0.05
  np.testing.assert_allclose(np.exp(2 * p["gamma_log"]), 1 - r2, rtol=1e-4, atol=1e-6)   # γ = √(1 − |λ|²)
  assert p["in_proj"]["kernel"].shape == (h, 4 * h) and p["out_proj"]["kernel"].shape == (2 * h, h)
  for name in ("in_proj", "out_proj"):
    assert abs(p[name]["kernel"].std() / 0.02 - 1) < 0.01 and not p[name]["bias"].any()
  assert p["layer_norm"]["scale"].shape == (2 * h,)
  rescaled = create_mixer("seq_icl_lru", out_init_std=0.01).init(jax.random.PRNGKey(3), x, jnp.ones((1, 3), bool))
  assert abs(np.asarray(rescaled["params"]["out_proj"]["kernel"]).std() / 0.01 - 1) < 0.01


def test_state_size_registry_and_optimizer_group():
  config = mixer_config("seq_icl_lru")
  assert config.state_size(1024, 32) == config.state_size(64, 32) == 64      # 2 · d_model, any length
  assert mixer_family("seq_icl_lru") == "ssm"
  params = create_mixer("seq_icl_lru").init(jax.random.PRNGKey(0), jnp.zeros((1, 2, 8)), None)["params"]
  # the original trains λ and γ with the global learning rate and weight decay: no SSM group
  assert not any(name.startswith("ssm_") for name in params)
  with pytest.raises(ValueError, match="r_min <= r_max"):
    mixer_config("seq_icl_lru", r_min=0.99, r_max=0.9)


def test_seq_icl_runs_it_with_the_layers_dropout():
  config = config_lib.load_config("seq_icl", "induction_head", [], attention="seq_icl_lru")
  assert config.model.attention_kwargs.dropout_rate == 0.2
  assert config.model.attention_kwargs.out_init_std == 0.01    # GPT-2: 0.02 / sqrt(2 · 2 layers)
  assert config.model.positions == "none"                       # lm_simple without position embeddings
  assert "ssm_learning_rate" not in config.optimizer
