"""Performer: exact quadratic forms (ReLU and FAVOR+ with its drawn features, causal FAVOR+ with its
running-max stabilizer), convergence to softmax (bidirectional and causal, the latter a regression test
for the running-mean bug), orthogonal projections, the redraw policy and key dropout."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import performer
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, padded_mask, run_core


def quadratic_form(q_features, k_features, v, causal):
  """(φ(Q)φ(K)ᵀ V) / (φ(Q)φ(K)ᵀ 1), with the lower-triangular mask when causal. [B, L, H, *]."""
  scores = np.einsum("bqhm,bkhm->bhqk", q_features, k_features)
  if causal:
    scores = scores * np.tril(np.ones(scores.shape[-2:]))
  return np.einsum("bhqk,bkhv->bqhv", scores / scores.sum(-1, keepdims=True), np.asarray(v))


def numpy_favor_features(x, w, mask=None, eps=1e-6):
  """Independent numpy transcription of the bidirectional FAVOR+ features in the module docstring."""
  x = np.asarray(x, np.float64) * x.shape[-1] ** -0.25
  z = np.einsum("blhd,md->blhm", x, np.asarray(w)) - 0.5 * (x**2).sum(-1, keepdims=True)
  if mask is None:  # query: own max over features
    return (np.exp(z - z.max(-1, keepdims=True)) + eps) / np.sqrt(w.shape[0])
  real = np.asarray(mask)[:, :, None, None]
  peak = np.where(real, z, -np.inf).max(axis=(1, 3), keepdims=True)
  return np.where(real, np.exp(z - peak) + eps, 0.0) / np.sqrt(w.shape[0])


def numpy_causal_favor(q, k, v, w, mask, eps=1e-6):
  """Dense causal FAVOR+ from the docstring's definition: key j seen from query i has features
  M^{-1/2}(exp(z_j − s_i) + ε·exp(r_j − s_i)), r_j = max_m z_jm, s_i = max of r over real j ≤ i."""
  phi_q = numpy_favor_features(q, w, eps=eps)
  x = np.asarray(k, np.float64) * k.shape[-1] ** -0.25
  z = np.einsum("blhd,md->blhm", x, np.asarray(w)) - 0.5 * (x**2).sum(-1, keepdims=True)
  r = np.where(np.asarray(mask)[:, :, None], z.max(-1), -np.inf)             # [B, L, H]
  s = np.maximum.accumulate(r, axis=1)
  exponent = z[:, None] - s[:, :, None, :, None]                             # [B, Q, K, H, M]
  features = (np.exp(exponent) + eps * np.exp(r[:, None] - s[:, :, None])[..., None]) / np.sqrt(w.shape[0])
  allowed = np.tril(np.ones((q.shape[1],) * 2, bool))[None, :, :, None] & np.asarray(mask)[:, None, :, None]
  scores = np.where(allowed, np.einsum("bqhm,bqkhm->bqkh", phi_q, np.nan_to_num(features)), 0.0)
  return np.einsum("bqkh,bkhv->bqhv", scores / scores.sum(2, keepdims=True), np.asarray(v))


@pytest.mark.parametrize("causal", [False, True])
def test_relu_kernel_equals_its_quadratic_form(x64, causal):
  q, k, v = random_qkv(0, 2, 37, 2, 6, 5, dtype=jnp.float64)
  mask = padded_mask(2, 37, 9)
  core = create("performer", kernel="relu", causal=causal, causal_chunk=8)  # 5 chunks, last partial
  out = run_core(core, q, k, v, mask)
  phi_q = np.maximum(np.asarray(q), 0) + 1e-3
  phi_k = (np.maximum(np.asarray(k), 0) + 1e-3) * mask[:, :, None, None]
  np.testing.assert_allclose(np.asarray(out)[mask], quadratic_form(phi_q, phi_k, v, causal)[mask],
                             rtol=1e-10, atol=1e-12)


def test_favor_equals_quadratic_form_of_its_features(x64):
  q, k, v = random_qkv(1, 2, 37, 2, 8, 3, dtype=jnp.float64)
  mask = padded_mask(2, 37, 9)
  out, sown = run_core(create("performer", nb_features=24), q, k, v, mask, intermediates=True)
  w = np.asarray(sown["projection"][0])
  assert w.shape == (24, 8)
  expected = quadratic_form(numpy_favor_features(q, w), numpy_favor_features(k, w, mask), v, False)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)


def test_two_input_normalizations_equal_xiong_et_al_features(x64):
  """``input_normalizations=2`` (Xiong et al.'s performer: q and k divided by D^{1/4}, then
  performer_pytorch's softmax_kernel scales them by D^{-1/4} again): the quadratic form of the FAVOR+
  features of q·D^{-1/4} and k·D^{-1/4}, with the drawn W and that code's ε = 1e-4."""
  q, k, v = random_qkv(1, 2, 37, 2, 8, 3, dtype=jnp.float64)
  mask = padded_mask(2, 37, 9)
  core = create("performer", nb_features=24, input_normalizations=2, numerical_stabilizer=1e-4)
  out, sown = run_core(core, q, k, v, mask, intermediates=True)
  w = np.asarray(sown["projection"][0])
  scaled = lambda x: np.asarray(x) * x.shape[-1] ** -0.25
  expected = quadratic_form(numpy_favor_features(scaled(q), w, eps=1e-4),
                            numpy_favor_features(scaled(k), w, mask, eps=1e-4), v, False)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)
  once = run_core(create("performer", nb_features=24, numerical_stabilizer=1e-4), q, k, v, mask)
  assert np.abs(np.asarray(once) - np.asarray(out))[mask].max() > 1e-3   # a different function


def test_two_input_normalizations_approximate_softmax_at_temperature_sqrt_d(x64):
  """With many features the ``input_normalizations=2`` core approaches softmax(q·k/D) (not /√D)."""
  q, k, v = random_qkv(4, 1, 16, 1, 8, 3, dtype=jnp.float64)
  mask = padded_mask(1, 16, 3)
  core = create("performer", nb_features=4096, input_normalizations=2, redraw="fixed")
  out = np.asarray(run_core(core, q, k, v, mask))
  want = dense_masked_attention(np.asarray(q) / 8 ** 0.5, k, v, key_and_causal_mask(mask, False))
  other = dense_masked_attention(q, k, v, key_and_causal_mask(mask, False))
  err = np.abs(out - np.asarray(want))[mask].max()
  assert err < 0.05 and err < 0.5 * np.abs(out - np.asarray(other))[mask].max(), err


@pytest.mark.parametrize("kwargs", [{"input_normalizations": 3}, {"input_normalizations": 2, "kernel": "relu"}])
def test_bad_input_normalizations_are_refused(kwargs):
  with pytest.raises(ValueError, match="input_normalizations"):
    performer.PerformerConfig(**kwargs)


def test_causal_favor_equals_its_dense_definition(x64):
  """Padding at the end (example 0) and in the middle (example 1); chunks of 8 at L = 37. Large
  inputs so that the running max really grows inside and across chunks."""
  q, k, v = random_qkv(1, 2, 37, 2, 8, 3, dtype=jnp.float64, scale=2.0)
  mask = padded_mask(2, 37, 9)
  mask[1, 11:19] = False
  out, sown = run_core(create("performer", nb_features=24, causal=True, causal_chunk=8), q, k, v, mask,
                       intermediates=True)
  expected = numpy_causal_favor(q, k, v, np.asarray(sown["projection"][0]), mask)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)


def _favor_errors(q, k, v, exact, causal, num_features, seeds=4):
  """Relative L2 errors of FAVOR+ vs ``exact`` per feature draw, and of the mean over the draws."""
  core = create("performer", nb_features=num_features, causal=causal)
  apply = jax.jit(lambda rng: core.apply({}, q, k, v, rngs={"attention": rng}))
  outs = [np.asarray(apply(jax.random.key(s))) for s in range(seeds)]
  rel = lambda out: np.linalg.norm(out - exact) / np.linalg.norm(exact)
  return np.mean([rel(out) for out in outs]), rel(np.mean(outs, 0))


def test_causal_favor_approximates_causal_softmax(x64):
  """Regression: with the data-independent key bound the causal output was cumsum(v)/t (running mean).
  At D = 64, q, k ~ N(0, 0.5²), L = 64 the running mean is ~0.2 from exact causal softmax; causal FAVOR+
  (notes: 0.39 at M = 64, 0.16 at M = 1024, mean of 4 draws 0.08) errs about as much as bidirectional."""
  length = 64
  q, k, v = random_qkv(0, 1, length, 1, 64, 8, dtype=jnp.float64, scale=0.5)
  exact = dense_masked_attention(q, k, v, key_and_causal_mask(np.ones((1, length), bool), True))
  running_mean = np.cumsum(np.asarray(v), 1) / np.arange(1, length + 1)[None, :, None, None]
  mean_error = np.linalg.norm(running_mean - exact) / np.linalg.norm(exact)
  small, _ = _favor_errors(q, k, v, exact, True, 64)
  large, averaged = _favor_errors(q, k, v, exact, True, 1024)
  assert large < 0.6 * small, (small, large)
  assert averaged < 0.5 * mean_error, (averaged, mean_error)
  bidirectional, _ = _favor_errors(q, k, v, dense_masked_attention(q, k, v, True), False, 1024)
  assert large < 1.5 * bidirectional, (large, bidirectional)


def test_causal_favor_last_row_is_bidirectional_up_to_epsilon(x64):
  """The last causal row sees every key and the same stabilizer as the bidirectional core."""
  q, k, v = random_qkv(2, 1, 40, 1, 16, 4, dtype=jnp.float64)
  kwargs = dict(nb_features=32, redraw="fixed", numerical_stabilizer=0.0)
  causal = run_core(create("performer", causal=True, causal_chunk=16, **kwargs), q, k, v)
  full = run_core(create("performer", **kwargs), q, k, v)
  np.testing.assert_allclose(np.asarray(causal)[:, -1], np.asarray(full)[:, -1], rtol=1e-10)


@pytest.mark.parametrize("feature_norms", ["chi", "sqrt_d"])
def test_projection_blocks_are_orthogonal(x64, feature_norms):
  dim, num_features = 16, 40  # two full blocks and a partial one
  w = np.asarray(performer.draw_projection(jax.random.key(0), num_features, dim,
                                           feature_norms=feature_norms, dtype=jnp.float64))
  assert w.shape == (num_features, dim)
  norms = np.linalg.norm(w, axis=1)
  for start in range(0, num_features, dim):
    block = w[start:start + dim]
    gram = block @ block.T
    np.testing.assert_allclose(gram, np.diag(np.diag(gram)), atol=1e-10)
  if feature_norms == "sqrt_d":
    np.testing.assert_allclose(norms, np.sqrt(dim), rtol=1e-12)
  else:  # chi(d): mean ≈ sqrt(d − 1/2), over many rows
    draw = jax.jit(performer.draw_projection, static_argnums=(1, 2))
    many = np.linalg.norm(np.asarray(draw(jax.random.key(1), 4096, dim)), axis=1)
    assert abs(many.mean() - np.sqrt(dim - 0.5)) < 0.05
    assert many.std() > 0.5  # not a constant norm


class _TwoLayers(nn.Module):
  @nn.compact
  def __call__(self, q, k, v):
    config = performer.PerformerConfig(redraw="fixed", nb_features=8)
    return [performer.PerformerAttention(config, name=f"layer_{i}")(q, k, v) for i in (0, 1)]


def test_redraw_policy():
  q, k, v = random_qkv(3, 1, 16, 1, 4, 4)

  def projection(rngs=None, **overrides):
    core = create("performer", nb_features=8, **overrides)
    return np.asarray(core.apply({}, 4, jnp.float32, method="projection", rngs=rngs or {}))

  fixed = projection(redraw="fixed")
  a, b = projection({"attention": jax.random.key(1)}), projection({"attention": jax.random.key(2)})
  assert not np.allclose(a, b)                                           # redrawn per call/rng
  np.testing.assert_array_equal(a, projection({"attention": jax.random.key(1)}))  # reproducible
  np.testing.assert_array_equal(projection(), fixed)                     # no stream: fixed fallback
  np.testing.assert_array_equal(projection({"attention": jax.random.key(1)}, redraw="fixed"), fixed)
  assert not np.allclose(projection(redraw="fixed", seed=1), fixed)
  _, state = jax.jit(lambda q, k, v: _TwoLayers().apply({}, q, k, v, mutable=["intermediates"]))(q, k, v)
  layers = state["intermediates"]
  assert not np.allclose(layers["layer_0"]["projection"][0], layers["layer_1"]["projection"][0])


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_drops_whole_keys_unbiased(causal):
  """Effective matrix under dropout: every column is either dropped or scaled by 1/(1 − p)."""
  length = 24
  q, k, _ = random_qkv(4, 1, length, 1, 8, 1)
  eye = jnp.eye(length)[None, :, None, :]
  core = create("performer", kernel="relu", dropout_rate=0.5, causal=causal, causal_chunk=8)
  det = run_core(core, q, k, eye)
  drop = run_core(core, q, k, eye, deterministic=False, seed=5)
  det, drop = np.asarray(det)[0, :, 0], np.asarray(drop)[0, :, 0]  # [Q, K]
  kept = np.all(np.isclose(drop, 2 * det, rtol=1e-5, atol=1e-7), axis=0)
  dropped = np.all(drop == 0, axis=0)
  assert np.all(kept | dropped) and kept.any() and dropped.any()


def test_orthonormal_columns_equal_qr_with_positive_diagonal():
  from attention_zoo.performer import orthonormal_columns

  gaussians = jax.random.normal(jax.random.key(0), (3, 16, 16))
  q = np.asarray(orthonormal_columns(gaussians))
  np.testing.assert_allclose(np.einsum("nij,nik->njk", q, q), np.broadcast_to(np.eye(16), (3, 16, 16)),
                             atol=1e-5)
  q_ref, r_ref = np.linalg.qr(np.asarray(gaussians, np.float64))
  signs = np.sign(np.diagonal(r_ref, axis1=1, axis2=2))[:, None, :]
  np.testing.assert_allclose(q, q_ref * signs, atol=1e-5)


@pytest.mark.timeout(300)
def test_four_layer_text_model_step_completes():
  """Regression: with LAPACK QR in every layer, this 4-layer forward never returned on XLA:CPU."""
  import ml_collections

  from lra_bench.training import models

  config = ml_collections.ConfigDict(dict(
      attention="performer", attention_kwargs={"redraw": "fixed"}, num_layers=4, num_heads=4,
      emb_dim=256, qkv_dim=256, mlp_dim=1024, dropout_rate=0.0, attention_dropout_rate=0.0,
      pooling="CLS", positions="sinusoidal"))
  model = models.Classifier(config, vocab_size=257, num_classes=2)
  batch = {"inputs": jnp.ones((1, 256), jnp.int32)}  # the LRA Table 2 Text model at L = 256
  variables = model.init(jax.random.key(0), batch)
  assert np.all(np.isfinite(np.asarray(jax.jit(model.apply)(variables, batch))))


def test_fixed_projection_is_a_constant_of_the_compiled_program():
  """redraw="fixed" (and every_call without the stream) draws W once when tracing: no random or loop
  primitive is left in the program, and W is the draw from key(seed) folded with the path hash (0
  at top level). A per-call redraw stays in the program."""
  q = jnp.ones((1, 16, 2, 8))

  def primitives(stream, **overrides):
    core = create("performer", nb_features=12, **overrides)
    apply = lambda q, rng: core.apply({}, q, q, q, rngs={"attention": rng} if stream else {})
    jaxpr = jax.make_jaxpr(apply)(q, jax.random.key(1))  # the stream's key is traced, as under jit
    return {eqn.primitive.name for eqn in jaxpr.jaxpr.eqns}

  drawing = {"random_split", "random_fold_in", "random_bits", "scan", "while"}
  assert not primitives(True, redraw="fixed") & drawing
  assert not primitives(False) & drawing
  assert primitives(True) & drawing
  core = create("performer", nb_features=12, redraw="fixed", seed=3)
  projection = core.apply({}, 8, jnp.float32, method="projection")
  expected = performer.draw_projection(jax.random.fold_in(jax.random.key(3), 0), 12, 8)
  np.testing.assert_allclose(np.asarray(projection), np.asarray(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_no_mask_equals_an_all_real_mask(x64, kernel):
  """mask=None skips the masking work; it must mean "every key is real" (bidirectional and causal)."""
  q, k, v = random_qkv(6, 2, 20, 2, 8, 3, dtype=jnp.float64)
  for causal in (False, True):
    core = create("performer", kernel=kernel, nb_features=16, redraw="fixed", causal=causal, causal_chunk=8)
    np.testing.assert_allclose(np.asarray(run_core(core, q, k, v)),
                               np.asarray(run_core(core, q, k, v, np.ones((2, 20), bool))), rtol=1e-12)


def numpy_xiong_favor(q, k, v, w, mask, eps=1e-4):
  """Dense transcription of Xiong et al.'s performer call (``padded_keys="zeroed"``,
  ``key_stabilizer="global"``): K·mask and V·mask enter as they are; query features as FAVOR+; key
  features ``M^{-1/2}(exp(x̃Wᵀ − |x̃|²/2 − max(x̃Wᵀ)) + ε)`` with ONE max over batch, keys, heads and
  features; output ``φ(Q)(φ(K)ᵀV) / φ(Q)Σφ(K)`` over every position, padded ones included."""
  real = np.asarray(mask)[:, :, None, None]
  k, v = np.asarray(k, np.float64) * real, np.asarray(v, np.float64) * real
  x = k * k.shape[-1] ** -0.25
  dash = np.einsum("blhd,md->blhm", x, np.asarray(w))
  z = dash - 0.5 * (x**2).sum(-1, keepdims=True)
  phi_k = (np.exp(z - dash.max()) + eps) / np.sqrt(w.shape[0])
  return quadratic_form(numpy_favor_features(q, w, eps=eps), phi_k, v, False)


def test_xiong_padding_and_global_stabilizer_equal_their_dense_definition(x64):
  q, k, v = random_qkv(7, 2, 37, 2, 8, 3, dtype=jnp.float64)
  k = k * 3.0   # spread the keys' z, so the global max leaves some keys' features mostly ε
  mask = padded_mask(2, 37, 9)
  core = create("performer", nb_features=24, numerical_stabilizer=1e-4, padded_keys="zeroed",
                key_stabilizer="global")
  out, sown = run_core(core, q, k, v, mask, intermediates=True)
  w = np.asarray(sown["projection"][0])
  expected = numpy_xiong_favor(q, k, v, w, mask)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)
  # each option alone is another function than the default, and than the two together
  default = np.asarray(run_core(create("performer", nb_features=24, numerical_stabilizer=1e-4), q, k, v, mask))
  for option in ({"padded_keys": "zeroed"}, {"key_stabilizer": "global"}):
    alone = np.asarray(run_core(create("performer", nb_features=24, numerical_stabilizer=1e-4, **option),
                                q, k, v, mask))
    for other in (default, np.asarray(out)):
      assert np.abs(alone - other)[mask].max() > 1e-4, option


def test_zeroed_padding_counts_padded_keys_but_ignores_their_contents(x64):
  """Xiong et al.'s padding: the padded keys' contents do not matter (they are zeroed) but their NUMBER
  does (each adds a zero key's weight to the denominator); masked padding depends on neither."""
  q, k, v = random_qkv(3, 1, 40, 2, 8, 3, dtype=jnp.float64)
  mask = np.arange(40)[None] < 20                                       # 20 real, 20 padded
  k2, v2 = (jnp.where(mask[:, :, None, None], x, 5 * jax.random.normal(jax.random.key(9), x.shape, x.dtype))
            for x in (k, v))
  for padded_keys in ("masked", "zeroed"):
    core = create("performer", nb_features=16, padded_keys=padded_keys, redraw="fixed")
    base = np.asarray(run_core(core, q, k, v, mask))[:, :20]
    other_contents = np.asarray(run_core(core, q, k2, v2, mask))[:, :20]
    less_padding = np.asarray(run_core(core, q[:, :30], k[:, :30], v[:, :30], mask[:, :30]))[:, :20]
    np.testing.assert_allclose(other_contents, base, rtol=1e-10, atol=1e-12)
    if padded_keys == "masked":
      np.testing.assert_allclose(less_padding, base, rtol=1e-10, atol=1e-12)
    else:
      assert np.abs(less_padding - base).max() > 1e-3


@pytest.mark.parametrize("kwargs", [{"padded_keys": "zero"}, {"key_stabilizer": "batch"},
                                    {"padded_keys": "zeroed", "causal": True},
                                    {"key_stabilizer": "global", "kernel": "relu"}])
def test_bad_xiong_options_are_refused(kwargs):
  with pytest.raises(ValueError, match="performer"):
    performer.PerformerConfig(**kwargs)
