"""The shared encoder and heads: shapes, finite gradients, padding handling, dual-input head."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lra_bench.training import models


def model_config(**overrides):
  c = ml_collections.ConfigDict(dict(
      attention="vanilla", attention_kwargs={}, num_layers=2, num_heads=2, emb_dim=16, qkv_dim=16,
      mlp_dim=32, dropout_rate=0.1, attention_dropout_rate=0.1, pooling="CLS", positions="sinusoidal"))
  c.update(overrides)
  return c


@pytest.mark.parametrize("pooling", models.POOLINGS)
@pytest.mark.parametrize("positions", models.POSITIONS)
def test_logits_shape_and_finite_grads(pooling, positions):
  model = models.Classifier(model_config(pooling=pooling, positions=positions), vocab_size=17, num_classes=10)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 17, (3, 12)), jnp.int32).at[0, 8:].set(0)
  batch = {"inputs": tokens}
  variables = model.init(jax.random.key(0), batch)
  logits = model.apply(variables, batch, deterministic=False, rngs={"dropout": jax.random.key(1)})
  assert logits.shape == (3, 10) and logits.dtype == jnp.float32
  grads = jax.grad(lambda p: model.apply({"params": p}, batch).sum())(variables["params"])
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_cls_is_prepended_and_learned_positions_cover_it():
  model = models.Classifier(model_config(positions="learned"), vocab_size=17, num_classes=2)
  params = model.init(jax.random.key(0), {"inputs": jnp.ones((1, 12), jnp.int32)})["params"]
  assert params["encoder"]["positions"].shape == (1, 13, 16)
  assert params["encoder"]["cls"].shape == (1, 1, 16)


@pytest.mark.parametrize("pooling", ["MEAN", "CLS"])
def test_padding_does_not_change_the_prediction(pooling):
  """Appending pad tokens (id 0) leaves logits unchanged (positions of real tokens are unchanged)."""
  model = models.Classifier(model_config(pooling=pooling), vocab_size=17, num_classes=3)
  short = jnp.asarray([[3, 5, 7, 2, 9]], jnp.int32)
  padded = jnp.concatenate([short, jnp.zeros((1, 6), jnp.int32)], axis=1)
  variables = model.init(jax.random.key(0), {"inputs": padded})
  a = model.apply(variables, {"inputs": short})
  b = model.apply(variables, {"inputs": padded})
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_dual_input_head_uses_u_v_product_and_difference():
  model = models.Classifier(model_config(), vocab_size=257, num_classes=2, dual_input=True)
  batch = {"inputs1": jnp.ones((2, 10), jnp.int32), "inputs2": jnp.full((2, 10), 5, jnp.int32)}
  variables = model.init(jax.random.key(0), batch)
  assert model.apply(variables, batch).shape == (2, 2)
  assert variables["params"]["head_hidden"]["kernel"].shape == (4 * 16, 32)  # [u, v, u*v, u-v]
  # One encoder shared by both inputs.
  assert "encoder" in variables["params"] and len([k for k in variables["params"] if "encoder" in k]) == 1


def test_sinusoidal_table():
  table = models.sinusoidal_positions(50, 8)
  assert table.shape == (50, 8)
  np.testing.assert_allclose(table[0], [0, 0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_allclose(table[:, 0], np.sin(np.arange(50)), rtol=1e-6)  # first frequency: 1 rad/step
