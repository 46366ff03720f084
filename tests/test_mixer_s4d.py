"""S4D mixer: the convolution equals the explicit diagonal recurrence (ZOH and bilinear, float64), the
bidirectional kernel equals a forward plus a one-step-late backward recurrence, the whole layer equals a
numpy reimplementation, padding and causality, the documented initialisations, gradients, jit, bf16."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

import attention_zoo
from attention_zoo import create_mixer, mixer_config
from attention_zoo import layer_family as mixer_family
from attention_zoo.mixers import s4d


def make(**overrides):
  overrides = {"d_state": 8, **overrides}
  return create_mixer("s4d", **overrides)


def inputs(seed, batch, length, width, dtype=jnp.float64):
  return jax.random.normal(jax.random.PRNGKey(seed), (batch, length, width), dtype)


def run(module, x, mask=None, variables=None, seed=1):
  if mask is None:
    mask = jnp.ones(x.shape[:2], bool)
  if variables is None:
    variables = module.init(jax.random.PRNGKey(seed), x, mask)
  out, state = module.apply(variables, x, mask, mutable=["intermediates"])
  return np.asarray(out), np.asarray(state["intermediates"]["ssm_output"][0]), variables


def numpy_params(params):
  """dt [H], A, B complex [H, N/2], C complex [C, H, N/2], D [H] as float64 numpy."""
  p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
  dt = np.exp(p["ssm_log_dt"]) if "ssm_log_dt" in p else np.log1p(np.exp(p["ssm_inv_dt"]))  # exp or softplus
  A = -np.exp(p["ssm_log_A_re"]) + 1j * p["ssm_A_im"]
  A = np.concatenate([A] * (len(dt) // len(A)))  # n_ssm copies of A: channel h uses copy h % n_ssm
  B = p["ssm_B"][..., 0] + 1j * p["ssm_B"][..., 1] if "ssm_B" in p else np.ones_like(A)
  B = np.concatenate([B] * (len(dt) // len(B)))  # the LegS B: one row per copy, like A
  C = p["C"][..., 0] + 1j * p["C"][..., 1]
  return dt, A, B, C, p["D"]


def numpy_discretize(dt, A, B, disc):
  dtA = dt[:, None] * A
  if disc == "zoh":
    return np.exp(dtA), B * (np.exp(dtA) - 1) / A
  return (1 + dtA / 2) / (1 - dtA / 2), B * dt[:, None] / (1 - dtA / 2)


def forward_recurrence(u, dA, dB, C):
  """u [L, H] -> 2 Re(C x_k) with x_k = Ā x_{k−1} + B̄ u_k, x_{−1} = 0."""
  state = np.zeros(dA.shape, complex)
  out = np.zeros(u.shape)
  for k in range(u.shape[0]):
    state = dA * state + dB * u[k][:, None]
    out[k] = 2 * np.real((C * state).sum(-1))
  return out


def backward_recurrence_one_step_late(u, dA, dB, C):
  """u [L, H] -> 2 Re(C z_{k+1}) with z_k = Ā z_{k+1} + B̄ u_k, z_L = 0 (u_k itself is not seen)."""
  state = np.zeros(dA.shape, complex)
  out = np.zeros(u.shape)
  for k in reversed(range(u.shape[0])):
    out[k] = 2 * np.real((C * state).sum(-1))
    state = dA * state + dB * u[k][:, None]
  return out


def numpy_ssm(u, params, disc, two_sided):
  """float64 [B, L, H]: the SSM with its D term, from the recurrences."""
  dt, A, B, C, D = numpy_params(params)
  dA, dB = numpy_discretize(dt, A, B, disc)
  ys = []
  for row in np.asarray(u, np.float64):
    y = forward_recurrence(row, dA, dB, C[0]) + D * row
    if two_sided:
      y = y + backward_recurrence_one_step_late(row, dA, dB, C[1])
    ys.append(y)
  return np.stack(ys)


def numpy_layer(u, params, disc="zoh", two_sided=True, postact="glu"):
  y = numpy_ssm(u, params, disc, two_sided)
  y = 0.5 * y * (1 + erf(y / math.sqrt(2)))  # exact GELU
  if postact == "none":
    return y
  w = np.asarray(params["output_linear"]["kernel"], np.float64)
  b = np.asarray(params["output_linear"]["bias"], np.float64)
  y = y @ w + b
  if postact == "glu":
    h = y.shape[-1] // 2
    y = y[..., :h] / (1 + np.exp(-y[..., h:]))
  return y


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_unidirectional_convolution_equals_recurrence(x64, disc):
  x = inputs(0, 2, 13, 3)
  _, ssm_out, variables = run(make(disc=disc, bidirectional=False, init="lin"), x)
  assert variables["params"]["C"].shape == (1, 3, 4, 2)
  np.testing.assert_allclose(ssm_out, numpy_ssm(x, variables["params"], disc, False), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_kernel_function_equals_powers(x64, disc):
  """s4d_kernel: K_l = 2 Re Σ C B̄ Ā^l with Ā, B̄ of the documented discretisation."""
  rng = np.random.default_rng(0)
  dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), 3))
  A = -rng.uniform(0.1, 1.0, (3, 4)) + 1j * rng.uniform(0, 10, (3, 4))
  B = rng.normal(size=(3, 4)) + 1j * rng.normal(size=(3, 4))
  C = rng.normal(size=(2, 3, 4)) + 1j * rng.normal(size=(2, 3, 4))
  k = np.asarray(s4d.s4d_kernel(jnp.asarray(dt), jnp.asarray(A), jnp.asarray(B), jnp.asarray(C), 9, disc))
  dA, dB = numpy_discretize(dt, A, B, disc)
  expected = 2 * np.real(np.einsum("chn,hnl->chl", C * dB, dA[..., None] ** np.arange(9)))
  np.testing.assert_allclose(k, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("disc", ["zoh", "bilinear"])
def test_bidirectional_equals_forward_plus_backward_one_step_late(x64, disc):
  x = inputs(1, 2, 11, 3)
  _, ssm_out, variables = run(make(disc=disc), x)
  assert variables["params"]["C"].shape == (2, 3, 4, 2)
  np.testing.assert_allclose(ssm_out, numpy_ssm(x, variables["params"], disc, True), rtol=1e-10, atol=1e-12)


def test_convolution_offsets():
  """ssm_convolution on impulses: y_i = Σ_{j≤i} k0[i−j] u_j + Σ_{j>i} k1[j−i−1] u_j."""
  length = 6
  k0 = np.arange(1.0, 7.0)[None]
  k1 = 10 * np.arange(1.0, 7.0)[None]
  u = np.zeros((1, length, 1))
  u[0, 3, 0] = 1.0
  y = np.asarray(s4d.ssm_convolution(jnp.asarray(u, jnp.float32), jnp.asarray(k0, jnp.float32),
                                     jnp.asarray(k1, jnp.float32)))[0, :, 0]
  np.testing.assert_allclose(y, [30, 20, 10, 1, 2, 3], atol=1e-5)
  y = np.asarray(s4d.ssm_convolution(jnp.asarray(u, jnp.float32), jnp.asarray(k0, jnp.float32)))[0, :, 0]
  np.testing.assert_allclose(y, [0, 0, 0, 1, 2, 3], atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"postact": "linear", "init": "inv", "disc": "bilinear",
                                            "bidirectional": False, "trainable_B": True},
                                       {"postact": "none"}, {"n_ssm": 2, "B_init": "random"},
                                       {"n_ssm": 2, "B_init": "legs", "trainable_B": True,
                                        "dt_transform": "softplus"}])
def test_layer_matches_numpy(x64, overrides):
  x = inputs(2, 2, 10, 4)
  module = make(**overrides)
  variables = module.init(jax.random.PRNGKey(3), x, jnp.ones((2, 10), bool))
  params = variables["params"]
  if "ssm_B" in params:  # move B off its init so that it matters
    params = {**params, "ssm_B": params["ssm_B"] + 0.3 * jax.random.normal(jax.random.PRNGKey(4),
                                                                              params["ssm_B"].shape)}
  if "n_ssm" in overrides:  # make the shared copies of A differ, so that which channel uses which matters
    params = {**params, "ssm_A_im": params["ssm_A_im"] * jnp.arange(1.0, 1.0 + len(params["ssm_A_im"]))[:, None]}
  out, _, _ = run(module, x, variables={"params": params})
  expected = numpy_layer(x, params, overrides.get("disc", "zoh"), overrides.get("bidirectional", True),
                         overrides.get("postact", "glu"))
  assert out.shape == (2, 10, 4) and out.dtype == np.float64
  np.testing.assert_allclose(out, expected, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_padding_equals_truncated_row(x64, bidirectional):
  length, real = 14, 9
  x = np.asarray(inputs(5, 2, length, 3))
  mask = np.ones((2, length), bool)
  mask[1, real:] = False
  x_padded = x.copy()
  x_padded[1, real:] = 7.0  # garbage in padded positions: the mixer zeroes them again
  module = make(bidirectional=bidirectional)
  out, _, variables = run(module, jnp.asarray(x_padded), jnp.asarray(mask))
  short, _, _ = run(module, jnp.asarray(x[1:, :real]), variables=variables)
  np.testing.assert_allclose(out[1, :real], short[0], rtol=1e-10, atol=1e-12)
  longer = np.concatenate([x, np.zeros((2, 5, 3))], axis=1)  # more padding after the same row
  mask_longer = np.concatenate([mask, np.zeros((2, 5), bool)], axis=1)
  out_longer, _, _ = run(module, jnp.asarray(longer), jnp.asarray(mask_longer), variables=variables)
  np.testing.assert_allclose(out_longer[1, :real], short[0], rtol=1e-10, atol=1e-12)


def test_causal_ignores_future_and_bidirectional(x64):
  length = 12
  x = inputs(6, 1, length, 3)
  module = make(causal=True, bidirectional=True)
  out, _, variables = run(module, x)
  assert variables["params"]["C"].shape[0] == 1  # forward kernel only
  for j in (4, 9):
    perturbed = x.at[:, j:].add(jax.random.normal(jax.random.PRNGKey(j), x[:, j:].shape))
    out_p, _, _ = run(module, perturbed, variables=variables)
    np.testing.assert_allclose(out_p[:, :j], out[:, :j], rtol=1e-12, atol=1e-13)
    assert not np.allclose(out_p[:, j:], out[:, j:])
  # the bidirectional layer does see the future
  two_sided = make()
  out2, _, v2 = run(two_sided, x)
  out2_p, _, _ = run(two_sided, x.at[:, 9].add(1.0), variables=v2)
  assert not np.allclose(out2_p[:, :9], out2[:, :9])


def legs_normal_part_eigenvalues(n_state):
  """Eigenvalues of HiPPO-LegS A + P Pᵀ (A_nk = −√(2n+1)√(2k+1) for n > k, −(n+1) on the diagonal, 0
  above; P_n = √(n + 1/2)) from numpy's general eigensolver."""
  q = np.arange(n_state, dtype=np.float64)
  r = np.sqrt(2 * q + 1)
  a = -np.tril(np.outer(r, r), -1) - np.diag(q + 1)
  p = np.sqrt(q + 0.5)
  return np.linalg.eigvals(a + np.outer(p, p))


@pytest.mark.parametrize("init", ["lin", "inv", "legs"])
def test_initialisations(init):
  n_state, width = 16, 32
  x = jnp.zeros((1, 5, width), jnp.float32)
  module = create_mixer("s4d", d_state=n_state, init=init)
  params = module.init(jax.random.PRNGKey(0), x, jnp.ones((1, 5), bool))["params"]
  a_im = np.asarray(params["ssm_A_im"], np.float64)
  n = np.arange(n_state // 2)
  if init == "lin":
    expected = np.pi * n
  elif init == "inv":
    expected = n_state / np.pi * (n_state / (2 * n + 1) - 1)
  else:
    w = legs_normal_part_eigenvalues(n_state)
    np.testing.assert_allclose(w.real, -0.5, atol=1e-8)
    expected = np.sort(w.imag[w.imag > 0])[::-1]  # the original's order: largest first
    assert expected.shape == (n_state // 2,)
  np.testing.assert_allclose(a_im, np.broadcast_to(expected, (width, n_state // 2)), rtol=1e-6, atol=1e-5)
  np.testing.assert_allclose(-np.exp(np.asarray(params["ssm_log_A_re"])), -0.5, rtol=1e-6)
  dt = np.exp(np.asarray(params["ssm_log_dt"], np.float64))
  assert dt.shape == (width,) and np.all(dt >= 1e-3 * (1 - 1e-6)) and np.all(dt <= 1e-1 * (1 + 1e-6))
  assert np.log(dt).std() > 0.5  # spread log-uniformly, not constant
  c = np.asarray(params["C"])
  assert c.shape == (2, width, n_state // 2, 2) and abs(c.std() - math.sqrt(0.5)) < 0.05
  assert "ssm_B" not in params and params["D"].shape == (width,)


def test_config_registry_and_parameter_names():
  config = mixer_config("s4d")
  assert (config.d_state, config.init, config.disc, config.dt_min, config.dt_max, config.bidirectional,
          config.trainable_B, config.tie_dropout, config.postact) == (64, "legs", "zoh", 1e-3, 1e-1, True,
                                                                     False, False, "glu")
  assert type(config).paper_name == "S4D" and mixer_family("s4d") == "ssm"
  assert attention_zoo.layer_kind("s4d") == "mixer"
  assert config.state_size(1000, 16) == 16 * 64 == config.state_size(10, 16)
  for bad in ({"d_state": 7}, {"init": "foo"}, {"disc": "dss"}, {"postact": "gelu"}):
    with pytest.raises(ValueError):
      mixer_config("s4d", **bad)
  params = make(trainable_B=True).init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 3)),
                                        jnp.ones((1, 4), bool))["params"]
  ssm = {k for k in params if k.startswith("ssm_")}
  assert ssm == {"ssm_log_dt", "ssm_log_A_re", "ssm_A_im", "ssm_B"}
  assert set(params) - ssm == {"C", "D", "output_linear"}


def test_gradients_jit_and_bfloat16():
  x = inputs(7, 2, 8, 4, jnp.float32)
  mask = jnp.ones((2, 8), bool).at[1, 6:].set(False)
  module = make(trainable_B=True, dropout_rate=0.1)
  variables = module.init(jax.random.PRNGKey(0), x, mask)

  def loss(params):
    out = module.apply({"params": params}, x, mask, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    return jnp.sum(out ** 2)

  grads = jax.grad(loss)(variables["params"])
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    g = np.asarray(g)
    assert np.all(np.isfinite(g)) and np.any(g != 0), jax.tree_util.keystr(path)

  eager = module.apply(variables, x, mask)
  jitted = jax.jit(lambda v, x, m: module.apply(v, x, m))(variables, x, mask)
  np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-5, atol=1e-5)
  out16 = module.apply(variables, x.astype(jnp.bfloat16), mask)
  assert out16.dtype == jnp.bfloat16 and out16.shape == x.shape
  np.testing.assert_allclose(np.asarray(out16, np.float32), np.asarray(eager), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("tie", [True, False])
def test_dropout_tied_over_time(tie):
  x = jnp.abs(inputs(8, 2, 16, 6, jnp.float32)) + 1.0
  mask = jnp.ones((2, 16), bool)
  module = make(postact="none", dropout_rate=0.5, tie_dropout=tie)
  params = module.init(jax.random.PRNGKey(0), x, mask)["params"]
  # C = 0, D = 1: y = u > 0, so GELU(y) > 0 and a zero output is a dropped entry
  variables = {"params": {**params, "C": jnp.zeros_like(params["C"]), "D": jnp.ones_like(params["D"])}}
  kept = np.asarray(module.apply(variables, x, mask, deterministic=False,
                                 rngs={"dropout": jax.random.PRNGKey(2)})) != 0
  assert 0 < kept.mean() < 1
  same_over_time = np.all(kept == kept[:, :1], axis=1)
  assert same_over_time.all() if tie else not same_over_time.all()
  np.testing.assert_array_equal(np.asarray(module.apply(variables, x, mask)) != 0, True)  # deterministic: none


def test_output_init_option():
  """``out_init_std`` (seq_icl's N(0, 0.02) re-initialisation of linear maps): the output linear's kernel
  has that spread and a zero bias; without it, flax's LeCun normal (std 1/sqrt(H))."""
  h = 400
  x, mask = jnp.zeros((1, 4, h)), jnp.ones((1, 4), bool)
  for postact, width in (("linear", h), ("glu", 2 * h)):
    params = create_mixer("s4d", postact=postact, out_init_std=0.02).init(jax.random.PRNGKey(0), x, mask)["params"]
    kernel = np.asarray(params["output_linear"]["kernel"])
    assert kernel.shape == (h, width) and abs(kernel.std() / 0.02 - 1) < 0.02
    assert not np.asarray(params["output_linear"]["bias"]).any()
  default = create_mixer("s4d", postact="linear").init(jax.random.PRNGKey(0), x, mask)["params"]
  assert abs(np.asarray(default["output_linear"]["kernel"]).std() * np.sqrt(h) - 1) < 0.05
  with pytest.raises(ValueError, match="out_init_std"):
    create_mixer("s4d", out_init_std=0.0)


def _C_and_A(params):
  C = np.asarray(params["C"][..., 0], np.float64) + 1j * np.asarray(params["C"][..., 1], np.float64)
  A = -np.exp(np.asarray(params["ssm_log_A_re"], np.float64)) + 1j * np.asarray(params["ssm_A_im"], np.float64)
  return C[0], A[0]


@pytest.mark.parametrize("n_ssm", [1, None])
def test_random_B_is_normalised_and_folded_into_C(n_ssm):
  """``B_init="random"`` (``random_dplr``): C starts as C0 · B with C0 ~ CN(0, 1) and B normalised to
  2 Σ_n |B_n / A_n|² = 1, so the channels' mean of 2 Σ_n |C_n / A_n|² is 1 (about 2 Σ_n 1/|A_n|² ≈ 9
  with B = 1); with n_ssm = 1 every channel has the same B, so E_h |C_hn|² = |B_n|² obeys the same sum."""
  h = 4000
  x, mask = jnp.zeros((1, 4, h)), jnp.ones((1, 4), bool)
  module = create_mixer("s4d", d_state=64, init="inv", bidirectional=False, postact="linear",
                        B_init="random", n_ssm=n_ssm)
  C, A = _C_and_A(module.init(jax.random.PRNGKey(0), x, mask)["params"])
  per_channel = 2 * np.sum(np.abs(C / A) ** 2, axis=-1)
  if n_ssm == 1:
    B_squared = np.mean(np.abs(C) ** 2, axis=0)           # [N/2]: |B_n|², the shared B
    assert 2 * np.sum(B_squared / np.abs(A) ** 2) == pytest.approx(1.0, rel=0.05)
  else:
    assert per_channel.mean() == pytest.approx(1.0, rel=0.1)
  ones = create_mixer("s4d", d_state=64, init="inv", bidirectional=False, postact="linear")
  C1, _ = _C_and_A(ones.init(jax.random.PRNGKey(0), x, mask)["params"])
  assert 2 * np.sum(np.abs(C1 / A) ** 2, axis=-1).mean() > 5
  with pytest.raises(ValueError, match="B_init"):
    create_mixer("s4d", B_init="uniform")


def test_n_ssm_shares_A_over_channels():
  x, mask = jnp.zeros((1, 4, 6)), jnp.ones((1, 4), bool)
  params = create_mixer("s4d", d_state=8, n_ssm=2).init(jax.random.PRNGKey(0), x, mask)["params"]
  assert params["ssm_A_im"].shape == (2, 4) and params["ssm_log_A_re"].shape == (2, 4)
  assert params["ssm_log_dt"].shape == (6,)  # Δ stays per channel
  default = create_mixer("s4d", d_state=8).init(jax.random.PRNGKey(0), x, mask)["params"]
  assert default["ssm_A_im"].shape == (6, 4)
  with pytest.raises(ValueError, match="n_ssm=4 must divide the width 6"):
    create_mixer("s4d", d_state=8, n_ssm=4).init(jax.random.PRNGKey(0), x, mask)
  with pytest.raises(ValueError, match="n_ssm"):
    create_mixer("s4d", n_ssm=0)


def test_legs_B_is_hippo_nplr_B(x64):
  """``B_init="legs"``: S4's ``dplr.ssm('legs')`` -> ``hippo.nplr('legs', N, B_clip=2.0)``: B = V*·√(2n+1) in the
  eigenbasis of A + P Pᵀ (A the LegS matrix, P = √(n + ½)), the modes with Im A < 0 (sorted), Im B clipped to
  [−2, 2]; stored conjugated beside Im A > 0. Trained (``ssm_B``, one row per copy) with ``trainable_B``."""
  n = 8
  q = np.sqrt(1 + 2 * np.arange(n))
  hippo_A = -(np.tril(np.outer(q, q)) - np.diag(np.arange(n)))   # hippo.transition('legs')
  p = np.sqrt(0.5 + np.arange(n))                                 # hippo.rank_correction('legs')
  ap = hippo_A + np.outer(p, p)
  w_im, v = np.linalg.eigh(ap * -1j)                              # torch.linalg.eigh(AP * -1j): lower triangle
  order = np.argsort(w_im, kind="stable")
  v, w_im = v[:, order][:, :n // 2], w_im[order][:n // 2]
  b = v.conj().T @ q
  b = b.real + 1j * np.clip(b.imag, -2.0, 2.0)
  np.testing.assert_allclose(s4d.legs_B(n), np.conj(b), atol=1e-12)
  np.testing.assert_allclose(s4d.init_A_imag("legs", n), -w_im, atol=1e-12)   # the same modes, same order
  magnitude = np.abs(s4d.legs_B(64))
  assert 0.55 < magnitude.min() < 0.65 and 1.95 < magnitude.max() < 2.05   # |B| between ~0.6 and 2
  x = inputs(0, 1, 5, 4, jnp.float32)
  params = make(B_init="legs", trainable_B=True, n_ssm=1).init(jax.random.PRNGKey(0), x, jnp.ones((1, 5), bool))
  B = params["params"]["ssm_B"]
  assert B.shape == (1, 4, 2)
  np.testing.assert_allclose(np.asarray(B[0, :, 0]) + 1j * np.asarray(B[0, :, 1]), s4d.legs_B(8), rtol=1e-6)
  with pytest.raises(ValueError, match="B_init='legs'"):
    create_mixer("s4d", B_init="legs", init="lin")


def test_softplus_dt_transform(x64):
  """``dt_transform="softplus"`` (S4's layer config): ssm_inv_dt = softplus⁻¹(Δ₀), Δ₀ log-uniform in
  [dt_min, dt_max]."""
  x = inputs(0, 1, 5, 64)
  params = make(dt_transform="softplus", dt_min=1e-3, dt_max=1e-1).init(jax.random.PRNGKey(0), x,
                                                                          jnp.ones((1, 5), bool))["params"]
  assert "ssm_log_dt" not in params
  dt = np.log1p(np.exp(np.asarray(params["ssm_inv_dt"], np.float64)))
  assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5) and dt.max() / dt.min() > 10
  with pytest.raises(ValueError, match="dt_transform"):
    create_mixer("s4d", dt_transform="sigmoid")
