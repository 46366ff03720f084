"""``model.share_attention_core``: one attention core (its parameters) used by every layer of the
encoder, as Xiong et al.'s Linformer kept its projection in a class attribute (the ``xiong`` preset)."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra_bench.errors import ConfigError
from lra_bench.training import config as config_lib
from lra_bench.training import objectives

OVERRIDES = ["data.max_length=48", "model.attention_kwargs.k=8", "model.dropout_rate=0.0"]


def _model(share: bool):
  extra = ["model.share_attention_core=True"] if share else []
  config = config_lib.load_config("smoke", "listops", [*OVERRIDES, *extra], attention="linformer")
  config.model.num_layers = 2
  return objectives.select(config).create_model(20)


def _batch():
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (3, 48), 1, 20), np.int32)
  tokens[0, 30:] = 0                                                   # padding
  return {"inputs": tokens}


def test_one_core_serves_every_layer_and_equals_two_copies_of_it(x64):
  shared = _model(True)
  variables = shared.init(jax.random.key(0), _batch())
  encoder = variables["params"]["encoder"]
  assert encoder["shared_core"]["E"].shape == (49, 8)                  # 48 tokens + the CLS position
  for i in range(2):
    assert "core" not in encoder[f"block_{i}"]["MultiHeadAttention_0"]
  # the unshared model with both layers' cores set to the shared parameters computes the same function
  unshared = _model(False)
  copied = copy.deepcopy(jax.tree.map(np.asarray, variables))
  core = copied["params"]["encoder"].pop("shared_core")
  for i in range(2):
    copied["params"]["encoder"][f"block_{i}"]["MultiHeadAttention_0"]["core"] = core
  assert jax.tree.structure(copied["params"]) == jax.tree.structure(
      unshared.init(jax.random.key(0), _batch())["params"])             # the unshared model's own layout
  np.testing.assert_allclose(np.asarray(shared.apply(variables, _batch())),
                             np.asarray(unshared.apply(copied, _batch())), rtol=1e-12, atol=1e-12)
  # and its gradient is the sum of the two layers' gradients
  loss = lambda model, params: jnp.sum(model.apply({"params": params}, _batch()) ** 2)
  g_shared = jax.grad(lambda p: loss(shared, p))(variables["params"])["encoder"]["shared_core"]["E"]
  g_layers = jax.grad(lambda p: loss(unshared, p))(copied["params"])["encoder"]
  np.testing.assert_allclose(np.asarray(g_shared),
                             sum(np.asarray(g_layers[f"block_{i}"]["MultiHeadAttention_0"]["core"]["E"])
                                 for i in range(2)), rtol=1e-10, atol=1e-12)


def test_a_mixer_cannot_share_an_attention_core():
  """Refused when the config is loaded (one line naming the key), and by the model itself for a config
  built without validation."""
  with pytest.raises(ConfigError, match=r"model.share_attention_core=True is not allowed; expected False "
                                        r"with the sequence mixer 's4d'"):
    config_lib.load_config("smoke", "listops", ["model.share_attention_core=True"], attention="s4d")
  config = config_lib.load_config("smoke", "listops", attention="s4d")
  with config.unlocked():
    config.model.share_attention_core = True
  model = objectives.select(config).create_model(20)
  with pytest.raises(ValueError, match="share_attention_core applies to layers one instance of which may serve"):
    model.init(jax.random.key(0), {"inputs": np.ones((1, 16), np.int32)})


def test_the_xiong_linformer_preset_shares_one_projection_per_head():
  config = config_lib.load_config("xiong", "listops", ["data.max_length=64"], attention="linformer")
  assert config.model.share_attention_core is True
  model = objectives.select(config).create_model(20)
  params = jax.eval_shape(model.init, jax.random.key(0), {"inputs": np.ones((1, 64), np.int32)})["params"]
  assert params["encoder"]["shared_core"]["E"].shape == (2, 64, 256)   # [heads, n, k]
  assert "share_attention_core" not in config_lib.load_config("xiong", "listops", attention="vanilla").model
