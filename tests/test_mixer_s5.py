"""S5 mixer: the associative scan vs a sequential float64 numpy loop (ZOH and bilinear, forward and
bidirectional, every activation), the HiPPO-LegS DPLR init vs an independent numpy eigendecomposition
and B̃ = V⁻¹B, padding independence, causality, gradients, jit, bfloat16, tied dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo.mixers import s5

H, L = 4, 9
SMALL = {"d_state": 8, "blocks": 2}


def make(**overrides):
  return attention_zoo.create_mixer("s5", **{**SMALL, **overrides})


def random_x(seed, batch=2, length=L, dtype=jnp.float64):
  return jax.random.normal(jax.random.PRNGKey(seed), (batch, length, H), dtype)


def init_apply(model, x, mask=None, seed=1):
  mask = np.ones(x.shape[:2], bool) if mask is None else mask
  variables = model.init(jax.random.PRNGKey(seed), x, mask)
  return model.apply(variables, x, mask), variables


def gelu(z):  # flax's nn.gelu default: the tanh approximation
  return 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z ** 3)))


def sigmoid(z):
  return 0.5 * (1.0 + np.tanh(z / 2))


def reference(params, x, mask, cfg):
  """float64 numpy: discretise, x_k = Λ̄x_{k−1} + B̄u_k by a loop (reverse loop too when bidirectional;
  padded positions feed no state), y = 2Re(C̃[x, x']) + Du, then the activation."""
  p = {k: np.asarray(v, np.float64) if not isinstance(v, dict) else v for k, v in params.items()}
  lam_re = np.minimum(p["ssm_Lambda_re"], -1e-4) if cfg.clip_eigs else p["ssm_Lambda_re"]
  lam = lam_re + 1j * p["ssm_Lambda_im"]
  step = cfg.step_rescale * np.exp(p["ssm_log_step"])
  b_tilde = p["ssm_B"][..., 0] + 1j * p["ssm_B"][..., 1]
  if cfg.discretization == "zoh":
    lam_bar = np.exp(lam * step)
    b_bar = ((lam_bar - 1) / lam)[:, None] * b_tilde
  else:
    lam_bar = (1 + step * lam / 2) / (1 - step * lam / 2)
    b_bar = (step / (1 - step * lam / 2))[:, None] * b_tilde
  cs = [p[n] for n in ("C", "C1", "C2") if n in p]
  c_tilde = np.concatenate([c[..., 0] + 1j * c[..., 1] for c in cs], axis=-1)
  bidirectional = cfg.bidirectional and not cfg.causal
  u = np.asarray(x, np.float64)
  batch, length, _ = u.shape
  y = np.zeros(u.shape)
  for b in range(batch):
    fwd = np.zeros((length, lam.size), complex)
    bwd = np.zeros((length, lam.size), complex)
    state = np.zeros(lam.size, complex)
    for k in range(length):
      state = lam_bar * state + (b_bar @ u[b, k] if mask[b, k] else 0)
      fwd[k] = state
    state = np.zeros(lam.size, complex)
    for k in reversed(range(length)):
      state = lam_bar * state + (b_bar @ u[b, k] if mask[b, k] else 0)
      bwd[k] = state
    states = np.concatenate([fwd, bwd], -1) if bidirectional else fwd
    out = (states @ c_tilde.T).real
    y[b] = (2 * out if cfg.conj_sym else out) + p["D"] * u[b]

  def dense(name, z):
    return z @ np.asarray(params[name]["kernel"]) + np.asarray(params[name]["bias"])

  z = gelu(y)
  if cfg.activation == "half_glu1":
    return z * sigmoid(dense("out2", z))
  if cfg.activation == "half_glu2":
    return y * sigmoid(dense("out2", z))
  if cfg.activation == "full_glu":
    return dense("out1", z) * sigmoid(dense("out2", z))
  return z


@pytest.mark.parametrize("overrides", [
    {"bidirectional": False},
    {"bidirectional": False, "discretization": "bilinear"},
    {"bidirectional": False, "conj_sym": False, "C_init": "lecun_normal", "activation": "half_glu2"},
    {"bidirectional": False, "discretization": "bilinear", "clip_eigs": True, "step_rescale": 2.0,
     "activation": "gelu"},
])
def test_scan_matches_sequential_loop(x64, overrides):
  model = make(**overrides)
  x = random_x(0)
  out, variables = init_apply(model, x)
  params = variables["params"]
  assert params["ssm_Lambda_re"].dtype == jnp.float64 and out.dtype == jnp.float64
  assert "C" in params and "C2" not in params
  np.testing.assert_allclose(np.asarray(out), reference(params, x, np.ones((2, L), bool), model.config),
                             rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("overrides", [
    {},
    {"discretization": "bilinear", "activation": "full_glu"},
    {"C_init": "complex_normal", "activation": "half_glu2"},
    {"conj_sym": False, "C_init": "lecun_normal"},
])
def test_bidirectional_matches_forward_plus_reverse_loop(x64, overrides):
  model = make(**overrides)
  assert model.config.bidirectional  # the default (the original's LRA runs)
  x = random_x(2)
  out, variables = init_apply(model, x)
  params = variables["params"]
  n = model.config.num_modes
  if model.config.C_init == "complex_normal":
    assert params["C"].shape == (H, 2 * n, 2)  # one C of width 2N, as the original
  else:
    assert params["C1"].shape == params["C2"].shape == (H, n, 2)
  np.testing.assert_allclose(np.asarray(out), reference(params, x, np.ones((2, L), bool), model.config),
                             rtol=1e-10, atol=1e-12)


def independent_legs_normal(n):
  """HiPPO-LegS A plus the rank-one p pᵀ (p_n = √(n + ½)), element by element."""
  s = np.zeros((n, n))
  for i in range(n):
    for k in range(n):
      a = -np.sqrt((2 * i + 1) * (2 * k + 1)) if i > k else (-(i + 1.0) if i == k else 0.0)
      s[i, k] = a + np.sqrt((i + 0.5) * (k + 0.5))
  return s


@pytest.mark.parametrize("conj_sym", [True, False])
def test_hippo_init_and_vinv_b(x64, monkeypatch, conj_sym):
  drawn = []

  def recording_b_init(key, shape, dtype):  # a known real B in place of the lecun_normal draw
    del key
    drawn.append(np.random.default_rng(0).standard_normal(shape) / np.sqrt(shape[0]))
    return jnp.asarray(drawn[-1], dtype)

  monkeypatch.setattr(s5, "B_INIT", recording_b_init)
  d_state, blocks = 12, 2
  model = make(d_state=d_state, blocks=blocks, conj_sym=conj_sym)
  _, variables = init_apply(model, random_x(3))
  params = variables["params"]
  block = d_state // blocks
  kept = block // 2 if conj_sym else block

  normal = independent_legs_normal(block)
  eigvals, eigvecs = np.linalg.eig(normal)
  order = np.argsort(eigvals.imag)
  eigvals, eigvecs = eigvals[order][:kept], eigvecs[:, order][:, :kept]
  np.testing.assert_allclose(eigvals.real, -0.5, atol=1e-10)
  lam = np.asarray(params["ssm_Lambda_re"]) + 1j * np.asarray(params["ssm_Lambda_im"])
  assert lam.shape == (blocks * kept,)
  np.testing.assert_allclose(lam, np.tile(eigvals, blocks), atol=1e-9)

  # The module's V: eigenvectors of S (phase-free check), orthonormal, block-diagonal, V⁻¹ = Vᴴ.
  lam_init, v, vinv = s5.init_lambda_v(d_state, blocks, conj_sym)
  assert v.shape == (d_state, blocks * kept)
  for j in range(blocks):
    vj = v[j * block:(j + 1) * block, j * kept:(j + 1) * kept]
    np.testing.assert_allclose(normal @ vj, vj * eigvals, atol=1e-9)
  np.testing.assert_allclose(v.conj().T @ v, np.eye(blocks * kept), atol=1e-12)
  np.testing.assert_allclose(vinv, v.conj().T)

  # B̃ = V⁻¹B for the real B [P, H] drawn at init; |B̃| also from numpy's own eigenvectors.
  b = drawn[0]
  assert all(np.array_equal(d, b) for d in drawn)  # flax's apply re-traces initialisers for shapes
  assert b.shape == (d_state, H)
  b_tilde = np.asarray(params["ssm_B"][..., 0]) + 1j * np.asarray(params["ssm_B"][..., 1])
  np.testing.assert_allclose(b_tilde, vinv @ b, atol=1e-12)
  unit = eigvecs / np.linalg.norm(eigvecs, axis=0)
  for j in range(blocks):
    np.testing.assert_allclose(np.abs(b_tilde[j * kept:(j + 1) * kept]),
                               np.abs(unit.conj().T @ b[j * block:(j + 1) * block]), atol=1e-9)
  log_step = np.asarray(params["ssm_log_step"])
  assert np.all((log_step >= np.log(1e-3)) & (log_step <= np.log(1e-1)))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_padding_equals_truncated_rows(x64, bidirectional):
  model = make(bidirectional=bidirectional, activation="half_glu2")
  x = random_x(4)
  mask = np.ones((2, L), bool)
  mask[0, 5:] = False
  garbage = x.at[0, 5:].set(1e3 * random_x(5)[0, 5:])  # padded content must not matter
  out, variables = init_apply(model, garbage, mask)
  short = model.apply(variables, x[:1, :5], np.ones((1, 5), bool))
  np.testing.assert_allclose(np.asarray(out[0, :5]), np.asarray(short[0]), rtol=1e-10, atol=1e-12)
  longer = jnp.concatenate([garbage, random_x(6)[:, :4]], axis=1)  # more padding after the row
  mask_longer = np.concatenate([mask, np.zeros((2, 4), bool)], axis=1)
  mask_longer[1, L:] = True
  out_longer = model.apply(variables, longer, mask_longer)
  np.testing.assert_allclose(np.asarray(out_longer[0, :5]), np.asarray(short[0]), rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(out)[mask],
                             reference(variables["params"], garbage, mask, model.config)[mask],
                             rtol=1e-10, atol=1e-12)


def test_causal_ignores_the_future(x64):
  model = make(causal=True)  # bidirectional=True is ignored
  x = random_x(7)
  out, variables = init_apply(model, x)
  assert "C" in variables["params"] and "C2" not in variables["params"]
  for i in (0, 3, L - 2):
    perturbed = x.at[:, i + 1:].add(random_x(8)[:, i + 1:])
    out2 = model.apply(variables, perturbed, np.ones((2, L), bool))
    np.testing.assert_allclose(np.asarray(out2[:, :i + 1]), np.asarray(out[:, :i + 1]), rtol=1e-12,
                               atol=1e-14)
    assert not np.allclose(np.asarray(out2[:, i + 1]), np.asarray(out[:, i + 1]))
  assert model.config.state_size(100, H) == 8 == attention_zoo.mixer_config("s5", d_state=8, blocks=2).state_size(7, 3)
  assert attention_zoo.mixer_config("s5", d_state=8, blocks=2, conj_sym=False).state_size(1, 1) == 16


def test_gradients_jit_bfloat16_and_registry():
  """full_glu (its out1 map too); the default activation (half_glu1) is the conformance kit's ``gradients``,
  ``jit`` and ``bfloat16`` checks (tests/test_attention_registry.py)."""
  model = make(activation="full_glu")
  x = random_x(9, dtype=jnp.float32)
  mask = np.ones((2, L), bool)
  mask[1, 6:] = False
  variables = model.init(jax.random.PRNGKey(0), x, mask)
  weights = random_x(10, dtype=jnp.float32)

  def loss(params):
    return jnp.sum(model.apply({"params": params}, x, mask) * weights)

  grads = jax.jit(jax.grad(loss))(variables["params"])
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.all(np.isfinite(g)) and np.any(g != 0), jax.tree_util.keystr(path)
  ssm_names = {name for name in variables["params"] if name.startswith("ssm_")}
  assert ssm_names == {"ssm_Lambda_re", "ssm_Lambda_im", "ssm_B", "ssm_log_step"}
  eager = model.apply(variables, x, mask)
  np.testing.assert_allclose(jax.jit(model.apply)(variables, x, mask), eager, rtol=1e-5, atol=1e-5)
  out_bf16 = model.apply(variables, x.astype(jnp.bfloat16), mask)
  assert out_bf16.dtype == jnp.bfloat16 and out_bf16.shape == x.shape
  assert np.all(np.isfinite(np.asarray(out_bf16, np.float32)))
  cfg = attention_zoo.mixer_config("s5")
  assert (cfg.d_state, cfg.blocks, cfg.C_init, cfg.activation, cfg.bidirectional) == (
      256, 8, "trunc_standard_normal", "half_glu1", True)
  assert attention_zoo.layer_family("s5") == "ssm" and type(cfg).paper_name == "S5"
  with pytest.raises(ValueError, match="even"):
    attention_zoo.mixer_config("s5", d_state=6, blocks=2)


@pytest.mark.parametrize("tie", [True, False])
def test_dropout_mask_shared_over_time(tie):
  model = make(activation="gelu", dropout_rate=0.5, tie_dropout=tie)
  x = random_x(11, dtype=jnp.float32)
  mask = np.ones((2, L), bool)
  variables = model.init(jax.random.PRNGKey(0), x, mask)
  kept = model.apply(variables, x, mask)
  dropped = model.apply(variables, x, mask, deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)})
  kept, dropped = np.asarray(kept), np.asarray(dropped)
  visible = np.abs(kept) > 1e-3  # gelu can underflow to 0 by itself
  keep = np.where(visible, dropped / np.where(visible, 2 * kept, 1.0), np.nan)  # 1 kept, 0 dropped
  np.testing.assert_allclose(keep[visible] * (1 - keep[visible]), 0, atol=1e-5)
  assert np.any(keep[visible] < 0.5) and np.any(keep[visible] > 0.5)
  same_over_time = np.nanmax(keep, axis=1) - np.nanmin(keep, axis=1) < 0.5  # [B, H]
  assert np.all(same_over_time) == tie  # the same features dropped at every position


def test_associative_and_sequential_scans_agree(x64):
  """The module runs the sequential scan on a CPU (faster there) and the original's associative scan
  elsewhere: both give the states of the loop."""
  from attention_zoo.mixers import _scan
  rng = np.random.default_rng(3)
  lam = np.exp(-rng.uniform(0.01, 0.5, 5) + 1j * rng.uniform(0, 3, 5))
  bu = rng.normal(size=(2, 11, 5)) + 1j * rng.normal(size=(2, 11, 5))
  for reverse in (False, True):
    expected = np.zeros_like(bu)
    h = np.zeros((2, 5), complex)
    for t in (range(10, -1, -1) if reverse else range(11)):
      h = lam * h + bu[:, t]
      expected[:, t] = h
    for method in _scan.METHODS:
      got = np.asarray(s5.linear_scan(jnp.asarray(lam), jnp.asarray(bu), reverse=reverse, method=method))
      np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
  assert _scan.default_method() == ("sequential" if jax.default_backend() == "cpu" else "associative")
