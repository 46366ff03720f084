"""Synthesizer: every mode vs a float64 reference built from the definition (synthetic logits [+ dot
product], one softmax over real keys), causal masking, length-dependent parameters (shorter inputs use
the top-left block, longer ones fail), input-independent weights for the random modes, presets."""

import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo import synthesizer
from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv
from tests.dense_reference import key_and_causal_mask


def end_and_middle_mask(batch, length):
  """bool [B, L]: example 0 padded at the end, example 1 in the middle."""
  mask = np.ones((batch, length), bool)
  mask[0, length - 6:] = False
  mask[1, 11:15] = False
  return mask


def reference(q, k, v, mask, params, config):
  """float64 numpy: softmax over allowed keys of (sum of synthetic parts [+ q kᵀ/√d]), times v."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  p = {name: np.asarray(w, np.float64) for name, w in params.items()}
  length = q.shape[1]
  logits = np.zeros((q.shape[0], q.shape[2], length, length))
  for part in config.mode.split("+"):
    if part == "random":
      logits += p["random"][None, :, :length, :length]
    elif part == "factorized_random":
      logits += (p["random1"][:, :length] @ p["random2"][:, :, :length])[None]
    else:
      hidden = np.maximum(np.einsum("bqhd,hde->bhqe", q, p["dense1"]), 0.0)
      logits += hidden @ p["dense2"][None, :, :, :length]
  if not config.ignore_dot_product:
    logits += np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  allowed = np.broadcast_to(key_and_causal_mask(mask, config.causal), logits.shape)
  logits = np.where(allowed, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhv->bqhv", weights, v)


@pytest.mark.parametrize("name, overrides", [
    ("synthesizer", {}),                                   # LRA Table 1: random + dot product
    ("synthesizer", {"causal": True}),
    ("synthesizer_factorized_random", {"k": 3}),
    ("synthesizer_dense", {"mode": "dense+factorized_random", "ignore_dot_product": False, "hidden": 5}),
])
def test_matches_float64_definition(x64, name, overrides):
  length = 37
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = end_and_middle_mask(2, length)
  out, variables = init_and_apply(create(name, **overrides), q, k, v, mask)
  config = attention_zoo.attention_config(name, **overrides)
  expected = reference(q, k, v, mask, variables["params"], config)
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("name, shapes", [
    ("synthesizer", {"random": (2, 20, 20)}),
    ("synthesizer_factorized_random", {"random1": (2, 20, 32), "random2": (2, 32, 20)}),
    ("synthesizer_dense", {"dense1": (2, 4, 4), "dense2": (2, 4, 20)}),
])
def test_length_dependent_parameters(x64, name, shapes):
  """Sized at init; a shorter input uses the top-left block (same as slicing the input), a longer one
  fails with a clear error."""
  q, k, v = random_qkv(1, 1, 20, 2, 4, 3, dtype=jnp.float64)
  core = create(name)
  full, variables = init_and_apply(core, q, k, v)
  assert {n: w.shape for n, w in variables["params"].items()} == shapes
  short, _ = init_and_apply(core, q[:, :13], k[:, :13], v[:, :13], variables=variables)
  config = attention_zoo.attention_config(name)
  np.testing.assert_allclose(np.asarray(short),
                             reference(q[:, :13], k[:, :13], v[:, :13], np.ones((1, 13), bool),
                                       variables["params"], config), rtol=1e-9, atol=1e-11)
  longer = random_qkv(1, 1, 21, 2, 4, 3, dtype=jnp.float64)
  with pytest.raises(ValueError, match="exceeds the length 20"):
    init_and_apply(core, *longer, variables=variables)


def test_random_weights_do_not_depend_on_the_input(x64):
  """Without the dot product the random synthesizer's attention matrix is a learned constant."""
  length = 17
  core = create("synthesizer_factorized_random")
  q1, k1, _ = random_qkv(2, 1, length, 1, 4, 1, dtype=jnp.float64)
  q2, k2, _ = random_qkv(3, 1, length, 1, 4, 1, dtype=jnp.float64)
  p1 = effective_matrix(core, q1, k1)
  p2 = effective_matrix(core, q2, k2)
  np.testing.assert_allclose(p1, p2, rtol=1e-12, atol=1e-14)
  mixed = create("synthesizer")
  assert not np.allclose(effective_matrix(mixed, q1, k1), effective_matrix(mixed, q2, k2))


def test_invalid_modes_are_rejected():
  for mode in ("dense+dense", "conv", ""):
    with pytest.raises(ValueError, match="mode"):
      synthesizer.SynthesizerConfig(mode=mode)
  assert synthesizer.SynthesizerConfig().paper_name == "Synthesizer"
  assert synthesizer.FactorizedRandomSynthesizerConfig().paper_name is None
