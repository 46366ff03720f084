"""Linformer: the exact formula softmax(Q (Eᵀ K_m)ᵀ/√d)(Fᵀ V_m) vs a float64 reference (K_m, V_m: padded
rows zeroed), shorter inputs use the first rows of E, longer ones fail, the probe is A·Fᵀ on real keys
(not stochastic, as declared), E = F = I recovers softmax attention, no causal form."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import linformer
from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv
from tests.dense_reference import dense_masked_attention


def end_and_middle_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 in the middle."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 11:15] = False
  return mask


def reference(q, k, v, mask, e, f):
  """float64 numpy Linformer from the definition, on masked K/V."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  m = np.asarray(mask, np.float64)[:, :, None, None]
  k_proj = np.einsum("lm,blhd->bmhd", e, k * m)
  v_proj = np.einsum("lm,blhv->bmhv", f, v * m)
  logits = np.einsum("blhd,bmhd->bhlm", q, k_proj) / np.sqrt(q.shape[-1])
  a = np.exp(logits - logits.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  return np.einsum("bhlm,bmhv->blhv", a, v_proj)


@pytest.mark.parametrize("overrides", [{}, {"share_kv": False, "k": 5}])
def test_matches_float64_formula_with_padding(x64, overrides):
  length = 37
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, length)
  out, variables = init_and_apply(create("linformer", **overrides), q, k, v, mask)
  params = variables["params"]
  e = np.asarray(params["E"])
  f = np.asarray(params["F"]) if "F" in params else e
  assert e.shape == (length, overrides.get("k", 16)) and ("F" in params) == ("share_kv" in overrides)
  np.testing.assert_allclose(np.asarray(out)[mask], reference(q, k, v, mask, e, f)[mask],
                             rtol=1e-10, atol=1e-12)


def per_head_reference(q, k, v, mask, e):
  """float64 Linformer with one projection per head, E [H, L, k] (Xiong et al.'s form), K and V masked."""
  return np.concatenate([reference(q[:, :, h:h + 1], k[:, :, h:h + 1], v[:, :, h:h + 1], mask, e[h], e[h])
                         for h in range(e.shape[0])], axis=2)


def test_per_head_projection_matches_float64_formula(x64):
  """``per_head=True, init_std=0.02`` (the xiong preset): E [H, L, k] drawn N(0, 0.02²), each head
  projected by its own E (the same for its keys and values)."""
  length = 37
  q, k, v = random_qkv(3, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, length)
  out, variables = init_and_apply(create("linformer", k=9, per_head=True, init_std=0.02), q, k, v, mask)
  e = np.asarray(variables["params"]["E"])
  assert e.shape == (2, length, 9) and abs(e.std() - 0.02) < 0.004
  assert np.abs(e[0] - e[1]).max() > 0                    # the heads differ
  np.testing.assert_allclose(np.asarray(out)[mask], per_head_reference(q, k, v, mask, e)[mask],
                             rtol=1e-10, atol=1e-12)
  short = [x[:, :30] for x in (q, k, v)]                  # shorter inputs use the first rows of each head
  out, _ = init_and_apply(create("linformer", k=9, per_head=True, init_std=0.02), *short, mask[:, :30],
                          variables=variables)
  np.testing.assert_allclose(np.asarray(out)[mask[:, :30]],
                             per_head_reference(*short, mask[:, :30], e[:, :30])[mask[:, :30]], rtol=1e-10, atol=1e-12)


def test_shorter_input_uses_first_rows_and_longer_input_fails(x64):
  core = create("linformer", k_fraction=0.25)
  q, k, v = random_qkv(1, 1, 40, 1, 4, 3, dtype=jnp.float64)
  _, variables = init_and_apply(core, q, k, v)
  e = np.asarray(variables["params"]["E"])
  assert e.shape == (40, 10)  # k = ceil(0.25 · 40)
  short = [x[:, :33] for x in (q, k, v)]
  out, _ = init_and_apply(core, *short, variables=variables)
  np.testing.assert_allclose(np.asarray(out), reference(*short, np.ones((1, 33)), e[:33], e[:33]),
                             rtol=1e-10, atol=1e-12)
  longer = random_qkv(1, 1, 41, 1, 4, 3, dtype=jnp.float64)
  with pytest.raises(ValueError, match="exceeds the length 40"):
    init_and_apply(core, *longer, variables=variables)


def test_probe_is_softmax_times_projection_on_real_keys(x64):
  """P = A Fᵀ with the columns of padded keys zeroed: linear in V, zero on padding, not stochastic."""
  length = 21
  q, k, _ = random_qkv(2, 1, length, 1, 4, 1, dtype=jnp.float64)
  mask = np.ones((1, length), bool)
  mask[0, 5:8] = False
  core = create("linformer", k=6)
  eye = jnp.eye(length, dtype=jnp.float64)[None, :, None, :]
  _, variables = init_and_apply(core, q, k, eye, mask)
  p = effective_matrix(core, q, k, mask, variables=variables)[0]
  e = np.asarray(variables["params"]["E"])
  logits = np.einsum("ld,md->lm", np.asarray(q)[0, :, 0], (e * mask[0, :, None]).T @ np.asarray(k)[0, :, 0])
  a = np.exp(logits / 2.0 - (logits / 2.0).max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  np.testing.assert_allclose(p, (a @ e.T) * mask[0], rtol=1e-10, atol=1e-12)
  assert np.all(p[:, ~mask[0]] == 0)
  assert p.min() < 0 and not np.allclose(p.sum(-1), 1.0)  # what the config declares it does not promise


def test_identity_projections_recover_softmax_attention(x64):
  length = 19
  q, k, v = random_qkv(3, 1, length, 2, 4, 3, dtype=jnp.float64)
  core = create("linformer", k=length)
  _, variables = init_and_apply(core, q, k, v)
  identity = {"params": {"E": jnp.eye(length, dtype=jnp.float64)}}
  out, _ = init_and_apply(core, q, k, v, variables=identity)
  expected = dense_masked_attention(q, k, v, np.ones((length, length), bool))
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-10, atol=1e-12)


def test_causal_is_not_implemented():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="future"):
    init_and_apply(create("linformer", causal=True), q, k, v)
  with pytest.raises(ValueError, match="k_fraction"):
    linformer.LinformerConfig(k_fraction=1.5)
