"""Mega (mixers ``mega`` / ``mega_chunk``): the FFT EMA equals the damped recurrence (and a direct sum when
truncated), the whole mixer and its chunked form equal a float64 numpy reimplementation from the module's
own parameters (softmax, laplace, relu2; padding; a residual distinct from x), padding and causality,
a registered core as the attention, gradients, jit, bfloat16, dropout, the registry entries."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers import mega

SMALL = {"z_dim": 4, "hidden_dim": 6, "ema_dim": 3, "max_positions": 16}
B, L, D = 2, 10, 5


def sigmoid(a):
  return 1.0 / (1.0 + np.exp(-a))


def silu(a):
  return a * sigmoid(a)


def inputs(seed=0, length=L, dtype=jnp.float64, lengths=(10, 7)):
  """x, residual [B, L, D] (padded positions hold garbage) and mask [B, L] padded at the end."""
  kx, kr = jax.random.split(jax.random.PRNGKey(seed))
  x = jax.random.normal(kx, (B, length, D), dtype)
  residual = jax.random.normal(kr, (B, length, D), dtype)
  mask = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  return x, residual, jnp.asarray(mask)


def build(name="mega", **overrides):
  return attention_zoo.create_mixer(name, **{**SMALL, **overrides})


def init_apply(module, x, mask, residual=None, variables=None):
  """Applies ``module``; without ``variables``, with :func:`bold` parameters."""
  if variables is None:
    variables = bold(module.init(jax.random.PRNGKey(1), x, mask, residual=residual))
  return module.apply(variables, x, mask, residual=residual), variables


def bold(variables, seed=5):
  """The parameters outside the EMA redrawn ~ N(0, 0.6²): at Mega's init (std 0.02, β = 0) the logits
  are ~1e-7 and the attention's share of the output ~1e-13, so no comparison could see the attention."""
  params = dict(variables["params"])
  leaves, tree = jax.tree_util.tree_flatten({k: v for k, v in params.items() if k != "ema"})
  keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
  drawn = [0.6 * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)]
  params.update(jax.tree_util.tree_unflatten(tree, drawn))
  return {"params": params}


def np_params(tree):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


# ------------------------------------------------------------------------------------------------
# numpy references


def ema_recurrence(p, x, mask, bidirectional):
  """SiLU(y + ω x), y from h_t = p β x_t + q h_{t−1}, y_t = Σ_n γ_n √(1/N) h_t (numpy loop)."""
  x = np.asarray(x, np.float64) * np.asarray(mask)[..., None]
  pp = sigmoid(p["delta"])
  q = 1.0 - pp * sigmoid(p["alpha"])
  scale = math.sqrt(1.0 / p["delta"].shape[-1])
  batch, length, dim = x.shape

  def run(xs, rows):
    h = np.zeros((batch, dim, p["delta"].shape[-1]))
    ys = []
    for t in range(length):
      h = (pp * p["beta"])[rows] * xs[:, t, :, None] + q[rows] * h
      ys.append(np.einsum("bdn,dn->bd", h, p["gamma"][rows] * scale))
    return np.stack(ys, axis=1)

  y = run(x, slice(0, dim))
  if bidirectional:
    y = y + run(x[:, ::-1], slice(dim, 2 * dim))[:, ::-1]
  return silu(y + p["omega"] * x)


def ema_direct(p, x, mask, bidirectional, truncation):
  """The same with the kernel cut at lag < truncation, as an explicit double sum."""
  x = np.asarray(x, np.float64) * np.asarray(mask)[..., None]
  pp = sigmoid(p["delta"])
  q = 1.0 - pp * sigmoid(p["alpha"])
  scale = math.sqrt(1.0 / p["delta"].shape[-1])
  lags = np.arange(truncation)
  kernel = np.einsum("knl,kn->kl", q[..., None] ** lags, pp * p["beta"] * p["gamma"] * scale)
  batch, length, dim = x.shape
  y = np.zeros_like(x)
  for t in range(length):
    for lag in lags:
      if t - lag >= 0:
        y[:, t] += kernel[:dim, lag] * x[:, t - lag]
      if bidirectional and t + lag < length:
        y[:, t] += kernel[dim:, lag] * x[:, t + lag]
  return silu(y + p["omega"] * x)


def mega_reference(params, x, mask, residual, config):
  """float64 numpy Mega from the definition: the attention as a dense [L, L] matrix whose allowed
  pairs are (same chunk) ∧ (real key) ∧ (j ≤ i if causal); relative bias w[M − 1 + (j % C) − (i % C)]."""
  p = np_params(params)
  x, residual = np.asarray(x, np.float64), np.asarray(residual, np.float64)
  mask = np.asarray(mask)
  xm = x * mask[..., None]
  _, length, dim = x.shape
  zd, vd = config.z_dim, config.hidden_dim
  v = silu(xm @ p["v_proj"]["kernel"] + p["v_proj"]["bias"])
  mx = ema_recurrence(p["ema"], x, mask, config.bidirectional and not config.causal)
  base = mx @ p["mx_proj"]["kernel"] + p["mx_proj"]["bias"]
  u, zr, hx = base[..., :dim], base[..., dim:dim + zd + vd], base[..., dim + zd + vd:]
  u = sigmoid(u)
  z, r = silu(zr)[..., :zd], silu(zr)[..., zd:]
  q = z * p["gamma"][0] + p["beta"][0]
  k = z * p["gamma"][1] + p["beta"][1]
  chunk = length if config.chunk_size is None else min(config.chunk_size, length)
  i, j = np.indices((length, length))
  allowed = (i // chunk == j // chunk)[None] & mask[:, None, :]
  if config.causal:
    allowed = allowed & (j <= i)[None]
  w = p["rel_pos_bias"]
  m = (w.shape[0] + 1) // 2
  bias = w[m - 1 + j % chunk - i % chunk]
  logits = np.einsum("biz,bjz->bij", q, k)
  if config.attention_fn == "softmax":
    s = np.where(allowed, logits / math.sqrt(zd) + bias, -np.inf)
    peak = np.max(s, axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(peak), peak, 0)), 0.0)
    attn = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
  else:
    s = logits / np.maximum(allowed.sum(-1, keepdims=True), 1) + bias
    if config.attention_fn == "laplace":
      erf = np.vectorize(math.erf)
      act = 0.5 * (1.0 + erf((s - 0.707107) / (0.282095 * math.sqrt(2.0))))
    else:
      act = np.maximum(s, 0.0) ** 2
    attn = act * allowed
  h = silu(hx + (np.einsum("bij,bjv->biv", attn, v) * r) @ p["h_proj"]["kernel"] + p["h_proj"]["bias"])
  return u * (h - residual) * mask[..., None]


# ------------------------------------------------------------------------------------------------
# the EMA


@pytest.mark.parametrize("bidirectional", [False, True])
def test_ema_fft_equals_damped_recurrence(x64, bidirectional):
  x, _, mask = inputs(0, length=13, lengths=(13, 9))
  ema = mega.MultiHeadEMA(ndim=3, bidirectional=bidirectional)
  variables = ema.init(jax.random.PRNGKey(2), x, mask)
  out = np.asarray(ema.apply(variables, x, mask))
  ref = ema_recurrence(np_params(variables["params"]), x, mask, bidirectional)
  np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_truncated_ema_equals_direct_sum(x64, bidirectional):
  x, _, mask = inputs(3, length=12, lengths=(12, 8))
  ema = mega.MultiHeadEMA(ndim=3, bidirectional=bidirectional, truncation=4)
  variables = ema.init(jax.random.PRNGKey(2), x, mask)
  out = np.asarray(ema.apply(variables, x, mask))
  ref = ema_direct(np_params(variables["params"]), x, mask, bidirectional, 4)
  np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)


def test_ema_init_follows_the_original():
  ema = mega.MultiHeadEMA(ndim=16, bidirectional=True)
  x = jnp.zeros((1, 8, 64))
  p = ema.init(jax.random.PRNGKey(0), x, jnp.ones((1, 8), bool))["params"]
  assert p["delta"].shape == p["alpha"].shape == p["beta"].shape == p["gamma"].shape == (128, 16)
  assert p["omega"].shape == (64,)
  sign = np.where(np.arange(16) % 2 == 0, 1.0, -1.0)
  np.testing.assert_allclose(np.std(np.asarray(p["beta"]) - sign), 0.02, rtol=0.1)
  np.testing.assert_allclose(np.std(np.asarray(p["delta"])), 0.2, rtol=0.1)
  np.testing.assert_allclose(np.std(np.asarray(p["gamma"])), 1.0, rtol=0.1)


def test_relative_bias_equals_the_originals_pad_tile_construction():
  positions = 7
  w = np.arange(2 * positions - 1, dtype=np.float64)
  for n in (1, 4, 7):
    b = w[positions - n:positions + n - 1]
    t = np.tile(np.pad(b, (0, n)), n)[:-n].reshape(n, 3 * n - 2)
    r = (2 * n - 1) // 2
    np.testing.assert_array_equal(np.asarray(mega.relative_bias(jnp.asarray(w), n)), t[:, r:t.shape[1] - r])
  with pytest.raises(ValueError, match="beyond max_positions"):
    mega.relative_bias(jnp.asarray(w), positions + 1)


# ------------------------------------------------------------------------------------------------
# the whole mixer against numpy


@pytest.mark.parametrize("overrides", [
    {},
    {"attention_fn": "laplace"},
    {"attention_fn": "relu2", "bidirectional": False},
    {"causal": True},
    {"causal": True, "attention_fn": "laplace"},
])
def test_mixer_matches_float64_reference(x64, overrides):
  module = build("mega", **overrides)
  x, residual, mask = inputs(4)
  out, variables = init_apply(module, x, mask, residual)
  ref = mega_reference(variables["params"], x, mask, residual, module.config)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-9, atol=1e-12)
  assert np.all(np.asarray(out)[~np.asarray(mask)] == 0)


@pytest.mark.parametrize("overrides", [
    {},  # L = 10 is not a multiple of C = 4: padded internally
    {"attention_fn": "laplace"},
    {"causal": True},
    {"chunk_size": 16},  # C > L: one chunk of L positions
])
def test_chunked_matches_block_diagonal_reference(x64, overrides):
  module = build("mega_chunk", **{"chunk_size": 4, **overrides})
  x, residual, mask = inputs(5, lengths=(10, 6))
  out, variables = init_apply(module, x, mask, residual)
  assert variables["params"]["rel_pos_bias"].shape == (2 * module.config.chunk_size - 1,)
  ref = mega_reference(variables["params"], x, mask, residual, module.config)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# padding, causality


@pytest.mark.parametrize("name,overrides", [
    ("mega", {}), ("mega", {"attention_fn": "laplace"}), ("mega_chunk", {"chunk_size": 4}),
    ("mega_chunk", {"chunk_size": 4, "attention_fn": "laplace"}), ("mega", {"attention": "vanilla"}),
])
def test_padding_equals_truncated_row(x64, name, overrides):
  module = build(name, **overrides)
  x, residual, mask = inputs(6, length=12, lengths=(12, 7))
  out, variables = init_apply(module, x, mask, residual)
  real = 7
  short, _ = init_apply(module, x[1:, :real], jnp.ones((1, real), bool), residual[1:, :real], variables)
  np.testing.assert_allclose(np.asarray(out)[1, :real], np.asarray(short)[0], rtol=1e-9, atol=1e-12)
  # More trailing pads, holding large garbage in x and residual: the same real outputs.
  longer = jnp.concatenate([x[1:, :real], 1e3 * jnp.ones((1, 9, D))], axis=1)
  res_longer = jnp.concatenate([residual[1:, :real], -1e3 * jnp.ones((1, 9, D))], axis=1)
  out_longer, _ = init_apply(module, longer, jnp.arange(16)[None] < real, res_longer, variables)
  np.testing.assert_allclose(np.asarray(out_longer)[0, :real], np.asarray(out)[1, :real], rtol=1e-9,
                             atol=1e-12)


@pytest.mark.parametrize("name,overrides", [
    ("mega", {}), ("mega", {"attention_fn": "laplace"}), ("mega_chunk", {"chunk_size": 4}),
    ("mega_chunk", {"chunk_size": 4, "attention": "vanilla"}),
])
def test_causal_output_ignores_the_future(x64, name, overrides):
  module = build(name, causal=True, **overrides)
  x, residual, _ = inputs(7)
  mask = jnp.ones((B, L), bool)
  out, variables = init_apply(module, x, mask, residual)
  assert variables["params"]["ema"]["delta"].shape[0] == D  # unidirectional EMA
  for i in (0, 3, 6):
    noise = jax.random.normal(jax.random.PRNGKey(i), x.shape, x.dtype)
    later = (jnp.arange(L) > i)[None, :, None]
    moved, _ = init_apply(module, x + later * noise, mask, residual + later * noise, variables)
    np.testing.assert_allclose(np.asarray(moved)[:, :i + 1], np.asarray(out)[:, :i + 1], rtol=0, atol=1e-11)
    assert not np.allclose(np.asarray(moved)[:, i + 1:], np.asarray(out)[:, i + 1:])


# ------------------------------------------------------------------------------------------------
# a registered core as the attention


@pytest.mark.parametrize("name,overrides", [
    ("mega", {}), ("mega", {"causal": True}), ("mega_chunk", {"chunk_size": 4}),
])
def test_vanilla_core_equals_builtin_softmax_without_bias(x64, name, overrides):
  """vanilla scales by 1/√Z like Mega's softmax; with the relative bias zeroed the two paths agree."""
  x, residual, mask = inputs(8, lengths=(10, 6))
  with_core = build(name, attention="vanilla", **overrides)
  out, variables = init_apply(with_core, x, mask, residual)
  assert "rel_pos_bias" not in variables["params"]
  builtin = build(name, **overrides)
  params = dict(variables["params"])
  positions = builtin.config.chunk_size or builtin.config.max_positions or x.shape[1]
  params["rel_pos_bias"] = jnp.zeros((2 * positions - 1,))
  expected, _ = init_apply(builtin, x, mask, residual, {"params": params})
  np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-10, atol=1e-12)
  ref = mega_reference(params, x, mask, residual, builtin.config)
  np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# gradients, jit, dtypes, dropout


def test_gradients_finite_and_nonzero_for_every_parameter():
  """mega_chunk with several chunks (C = 4 < L) and the laplace attention; the default mega (and mega_chunk with
  one chunk) is the conformance kit's ``gradients`` check (tests/test_attention_registry.py)."""
  module = build("mega_chunk", chunk_size=4, attention_fn="laplace")
  x, residual, mask = inputs(9, dtype=jnp.float32)
  variables = module.init(jax.random.PRNGKey(1), x, mask, residual=residual)
  weights = jax.random.normal(jax.random.PRNGKey(3), x.shape)

  def loss(params):
    return jnp.sum(module.apply({"params": params}, x, mask, residual=residual) * weights)

  grads = jax.jit(jax.grad(loss))(variables["params"])
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    g = np.asarray(g)
    assert np.all(np.isfinite(g)), path
    assert np.any(g != 0), path


def test_jit_and_bfloat16():
  module = build("mega_chunk", chunk_size=4)
  x, residual, mask = inputs(10, dtype=jnp.float32)
  out, variables = init_apply(module, x, mask, residual)
  jitted = jax.jit(lambda v, a, m, r: module.apply(v, a, m, residual=r))(variables, x, mask, residual)
  np.testing.assert_allclose(np.asarray(jitted), np.asarray(out), rtol=1e-5, atol=1e-6)
  half = module.apply(variables, x.astype(jnp.bfloat16), mask, residual=residual.astype(jnp.bfloat16))
  assert half.dtype == jnp.bfloat16 and out.dtype == jnp.float32
  half = np.asarray(half, np.float32)
  assert np.all(np.isfinite(half))
  np.testing.assert_allclose(half, np.asarray(out), atol=0.1)


def test_dropout_draws_from_the_dropout_stream():
  module = build("mega", dropout_rate=0.3, attention_dropout_rate=0.3, hidden_dropout_rate=0.3)
  x, residual, mask = inputs(11, dtype=jnp.float32)
  out, variables = init_apply(module, x, mask, residual)
  train = lambda seed: module.apply(variables, x, mask, deterministic=False, residual=residual,
                                    rngs={"dropout": jax.random.PRNGKey(seed)})
  a, b = np.asarray(train(0)), np.asarray(train(1))
  assert np.all(np.isfinite(a)) and not np.allclose(a, b) and not np.allclose(a, np.asarray(out))
  np.testing.assert_array_equal(a, np.asarray(train(0)))


# ------------------------------------------------------------------------------------------------
# registry and config


def test_registry_entries_and_config():
  assert {"mega", "mega_chunk"} <= set(attention_zoo.list_mixers())
  whole, chunked = attention_zoo.mixer_config("mega"), attention_zoo.mixer_config("mega_chunk")
  assert (whole.z_dim, whole.hidden_dim, whole.ema_dim, whole.max_positions) == (64, 160, 16, 1024)
  assert whole.attention_fn == "softmax" and whole.bidirectional and whole.chunk_size is None
  assert chunked.chunk_size == 128
  assert type(whole).paper_name == "Mega" and type(chunked).paper_name == "Mega-chunk"
  for config in (whole, chunked):
    assert type(config).family == "gated-ema" and type(config).gated_residual
    assert type(config).no_causal_form is None
  assert attention_zoo.layer_family("mega_chunk") == "gated-ema"
  assert whole.state_size(1000, 80) == 80 * 16 + 1000 * (64 + 160)
  assert chunked.state_size(1000, 80) == 80 * 16 + 128 * (64 + 160)
  assert chunked.state_size(50, 80) == 80 * 16 + 50 * (64 + 160)


def test_bad_configs_raise():
  x, residual, mask = inputs(12, dtype=jnp.float32)
  with pytest.raises(ValueError, match="attention_fn"):
    init_apply(build("mega", attention_fn="sigmoid"), x, mask, residual)
  with pytest.raises(ValueError, match="beyond max_positions"):
    init_apply(build("mega", max_positions=8), x, mask, residual)


def test_bad_sizes_are_refused_when_the_config_is_made():
  """Checked by the config (so a run's validation refuses them before any data is read), not at the first call."""
  from attention_zoo import mixer_config

  for name, overrides in (("mega_chunk", {"chunk_size": 0}), ("mega", {"chunk_size": -3}),
                          ("mega", {"attention_fn": "sigmoid"}), ("mega", {"max_positions": 0})):
    with pytest.raises(ValueError, match="Mega: "):
      mixer_config(name, **overrides)
