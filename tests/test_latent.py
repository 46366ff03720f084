"""Luna / ISAB: the packed two-step attention equals its float64 definition (padding at the end and in
the middle), presets, padded keys excluded from the packing; causal Luna equals its per-position
definition and its dropout is unbiased; ISAB has no causal form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention


def end_and_middle_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 in the middle, others full."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 8:] = False
  mask[1, 5:12] = False
  return mask


def init_with_output(core, q, k, v, mask=None, **kwargs):
  """(out, variables) of ``core`` under one jit."""
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1), "attention": jax.random.key(2)}
  fn = jax.jit(lambda q, k, v, m: core.init_with_output(rngs, q, k, v, mask=m, **kwargs))
  return fn(q, k, v, None if mask is None else jnp.asarray(mask))


def latent_reference(latents, q, k, v, mask):
  """Definition in float64: P′ = Attn(P, X) over real keys, Y = Attn(X, P′) with keys and values
  packed by the same weights. latents [H, M, D]."""
  batch = q.shape[0]
  p = np.broadcast_to(np.asarray(latents, np.float64).transpose(1, 0, 2)[None], (batch,) + (
      latents.shape[1], latents.shape[0], latents.shape[2]))                  # [B, M, H, D]
  packed = mask[:, None, None, :]                                             # [B, 1, 1, K]
  packed_keys = dense_masked_attention(p, k, k, packed)                      # [B, M, H, D]
  packed_values = dense_masked_attention(p, k, v, packed)                    # [B, M, H, V]
  return dense_masked_attention(q, packed_keys, packed_values, True)


@pytest.mark.parametrize("name, latents", [("luna", 5), ("isab", None)])
def test_matches_float64_definition(x64, name, latents):
  overrides = {} if latents is None else {"num_latents": latents}
  q, k, v = random_qkv(0, 3, 29, 2, 6, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(3, 29)
  out, variables = init_with_output(create(name, **overrides), q, k, v, mask)
  params = np.asarray(variables["params"]["latents"])
  assert params.shape == (2, latents or 32, 6)
  expected = latent_reference(params, np.asarray(q), np.asarray(k), np.asarray(v), mask)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_mab_scaling_divides_logits_by_the_full_width(x64):
  """mab_scaling: the definition with every logit divided by a further √H."""
  heads = 4
  q, k, v = random_qkv(6, 2, 19, heads, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, 19)
  out, variables = init_with_output(create("isab", num_latents=3, mab_scaling=True), q, k, v, mask)
  latents = np.asarray(variables["params"]["latents"]) / np.sqrt(heads)
  expected = latent_reference(latents, np.asarray(q) / np.sqrt(heads), np.asarray(k), np.asarray(v), mask)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_presets():
  q, k, v = random_qkv(1, 1, 16, 2, 4, 4)
  for name, num in (("luna", 256), ("isab", 32)):
    variables = jax.eval_shape(create(name).init, jax.random.key(0), q, k, v)
    assert variables["params"]["latents"].shape == (2, num, 4)


def test_probe_is_product_of_two_stochastic_maps(x64):
  """value = eye(L): P = softmax_M(Q P′_kᵀ/√D) @ A, with A the packing weights; padded columns zero."""
  length = 21
  q, k, _ = random_qkv(2, 1, length, 1, 4, 1, dtype=jnp.float64)
  mask = np.ones((1, length), bool)
  mask[0, 7:10] = False
  eye = jnp.eye(length, dtype=jnp.float64)[None, :, None, :]
  out, variables = init_with_output(create("luna", num_latents=4), q, k, eye, mask)
  p = np.asarray(out)[0, :, 0]                                               # [Q, K]
  latents = np.asarray(variables["params"]["latents"])[0]                    # [M, D]
  logits = latents @ np.asarray(k)[0, :, 0].T / 2.0
  pack = np.where(mask[0], np.exp(logits - logits.max(-1, keepdims=True)), 0.0)
  pack /= pack.sum(-1, keepdims=True)                                        # [M, K]
  unpack = np.exp(np.asarray(q)[0, :, 0] @ (pack @ np.asarray(k)[0, :, 0]).T / 2.0)
  unpack /= unpack.sum(-1, keepdims=True)                                    # [Q, M]
  np.testing.assert_allclose(p, unpack @ pack, rtol=1e-10, atol=1e-14)
  assert np.all(p[:, ~mask[0]] == 0)


def causal_reference(latents, q, k, v, mask):
  """Causal Luna from its definition, one position at a time: w[t, m] = log2(1 + 2^(p_m·k_t/√D)) over
  the real t ≤ i, P′(i) = Σ_t w k_t / Σ_t w (keys and values alike), y_i = softmax_m(q_i·P′_k/√D) P′_v."""
  q, k, v, p = (np.asarray(x, np.float64) for x in (q, k, v, latents))
  batch, length, heads, dim = q.shape
  out = np.zeros(v.shape)
  for b in range(batch):
    for h in range(heads):
      w = np.log2(1 + 2 ** (k[b, :, h] @ p[h].T / np.sqrt(dim))) * mask[b][:, None]   # [L, M]
      for i in range(length):
        total = w[:i + 1].sum(0)
        if not np.any(total > 0):
          continue
        packed_k = w[:i + 1].T @ k[b, :i + 1, h] / total[:, None]
        packed_v = w[:i + 1].T @ v[b, :i + 1, h] / total[:, None]
        logits = packed_k @ q[b, i, h] / np.sqrt(dim)
        a = np.exp(logits - logits.max())
        out[b, i, h] = a @ packed_v / a.sum()
  return out


def test_causal_luna_matches_float64_definition(x64):
  q, k, v = random_qkv(4, 3, 29, 2, 6, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(3, 29)
  mask[2, :4] = False  # leading padding: the first real query packs only itself
  core = create("luna", num_latents=5, causal=True, causal_chunk=8)  # 4 chunks, the last partial
  out, variables = init_with_output(core, q, k, v, mask)
  expected = causal_reference(variables["params"]["latents"], q, k, v, mask)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-10, atol=1e-12)


def test_causal_luna_dropout_is_unbiased():
  """Mean over 512 dropout keys of the causal effective matrix is the deterministic one."""
  length = 20
  q, k, _ = random_qkv(5, 1, length, 1, 4, 1)
  eye = jnp.eye(length)[None, :, None, :]
  core = create("luna", num_latents=4, causal=True, causal_chunk=8, dropout_rate=0.3)
  det, variables = init_with_output(core, q, k, eye)
  sample = lambda rng: core.apply(variables, q, k, eye, deterministic=False, rngs={"dropout": rng})
  mean = jax.jit(jax.vmap(sample))(jax.random.split(jax.random.key(3), 512)).mean(0)
  assert float(jnp.linalg.norm(mean - det) / jnp.linalg.norm(det)) < 0.06
  assert np.all(np.triu(np.asarray(mean)[0, :, 0], 1) == 0)


def test_isab_has_no_causal_form():
  q, k, v = random_qkv(3, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="causal"):
    init_with_output(create("isab", causal=True), q, k, v)


def test_config_validation():
  with pytest.raises(ValueError, match="num_latents"):
    create("luna", num_latents=0)
