"""The sequence-mixer contract (attention_zoo.mixers): one namespace with the attention cores, the encoder
around a mixer (zeroed padding, the gated residual, the norms and the head of the SSM recipes), the SSM
parameter group of the optimizer, the records' ``layer_kind``, config validation and the mixer kit.

A toy mixer stands in for the real ones (their own tests check their mathematics): a per-channel decay
recurrence h_t = a ⊙ h_{t-1} + x_t with ``a = sigmoid(ssm_a)``, then a Dense layer.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench import testing
from lra_bench.errors import ConfigError
from lra_bench.experiments import cell, results, suite
from lra_bench.training import config as config_lib
from lra_bench.training import models, optim
from tests.conftest import tiny_overrides


@dataclasses.dataclass(frozen=True)
class ToyConfig(registry.MixerConfig):
  bidirectional: bool = True
  family = "ssm"

  def state_size(self, length, d_model):
    return d_model


def _scan(a, x, mask):
  """h_t = a h_{t-1} + x_t over axis 1 ([B, L, D]); x at padded positions is already zero."""
  def step(h, xt):
    h = a * h + xt
    return h, h
  _, hs = jax.lax.scan(step, jnp.zeros_like(x[:, 0]), jnp.swapaxes(x, 0, 1))
  return jnp.swapaxes(hs, 0, 1)


class Toy(nn.Module):
  config: ToyConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    a = nn.sigmoid(self.param("ssm_a", nn.initializers.zeros, (x.shape[-1],)))
    x32 = x.astype(jnp.float32)  # relies on the contract: the encoder zeroed the padded positions
    h = _scan(a, x32, mask)
    if self.config.bidirectional and not self.config.causal:
      h = h + jnp.flip(_scan(a, jnp.flip(x32, 1), mask), 1)
    h = nn.Dropout(self.config.dropout_rate)(h, deterministic=deterministic)
    return nn.Dense(x.shape[-1], name="out")(h).astype(x.dtype)


@dataclasses.dataclass(frozen=True)
class GatedConfig(registry.MixerConfig):
  gated_residual = True


class Gated(nn.Module):
  """Returns residual-dependent update: the block must add it without dropout."""
  config: GatedConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True, residual=None):
    gate = nn.sigmoid(nn.Dense(x.shape[-1], name="gate")(x))
    return (gate * (jnp.tanh(x) - residual)).astype(x.dtype)


@pytest.fixture
def toy():
  with registry.temporary({"toy_mixer": (Toy, ToyConfig), "toy_gated": (Gated, GatedConfig)}) as names:
    yield names


def test_one_namespace_and_kinds(toy):
  assert "toy_mixer" in attention_zoo.list_mixers() and "toy_mixer" not in attention_zoo.list_attentions()
  assert attention_zoo.layer_kind("toy_mixer") == "mixer" and attention_zoo.layer_kind("vanilla") == "attention"
  assert attention_zoo.list_layers()[-len(attention_zoo.list_mixers()):] == attention_zoo.list_mixers()
  with pytest.raises(registry.PluginError,
                     match=r"registered twice: .*\(as an attention core and as a sequence mixer\)"):
    registry.register_mixer("vanilla", ToyConfig)(Toy)
  with pytest.raises(ValueError, match="unknown attention 'nope'"):
    attention_zoo.create_mixer("nope")
  with pytest.raises(TypeError, match="has no config field"):
    attention_zoo.mixer_config("toy_mixer", wrong=1)


def _model(overrides, vocab=20):
  config = config_lib.load_config("smoke", "listops", tiny_overrides(**overrides))
  return config, models.Classifier(config.model, vocab, 10)


def test_encoder_zeroes_padding_and_pads_do_not_reach_real_tokens(toy):
  config, model = _model({"model.attention": "toy_mixer", "model.attention_kwargs.bidirectional": True})
  tokens = np.array([[3, 4, 5, 6, 7, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10]])
  variables = model.init(jax.random.key(0), {"inputs": tokens})
  encoder = models.Encoder(config.model, 20)
  enc_vars = {"params": variables["params"]["encoder"]}
  padded, _ = encoder.apply(enc_vars, jnp.asarray(tokens[:1]), deterministic=True)
  cut, _ = encoder.apply(enc_vars, jnp.asarray(tokens[:1, :5]), deterministic=True)
  # the CLS of the smoke protocol sits at 0; positions are sinusoidal (the same values for both)
  np.testing.assert_allclose(padded[0, :6], cut[0], atol=2e-5)


def test_gated_residual_is_added_without_dropout(toy):
  config, model = _model({"model.attention": "toy_gated", "model.mlp": False, "model.dropout_rate": 0.5})
  block = models.EncoderBlock(config.model)
  x = jax.random.normal(jax.random.key(1), (2, 6, 16))
  mask = jnp.ones((2, 6), bool)
  variables = block.init(jax.random.key(0), x, mask, deterministic=True)
  a = block.apply(variables, x, mask, deterministic=False, rngs={"dropout": jax.random.key(2)})
  b = block.apply(variables, x, mask, deterministic=False, rngs={"dropout": jax.random.key(3)})
  np.testing.assert_allclose(a, b)  # no dropout on the gated update
  # pre-norm: the mixer sees LayerNorm(x), the gate's residual is x itself
  ln = nn.LayerNorm()
  y = ln.apply({"params": variables["params"]["LayerNorm_0"]}, x)
  gate = nn.sigmoid(y @ variables["params"]["mixer"]["gate"]["kernel"] + variables["params"]["mixer"]["gate"]["bias"])
  np.testing.assert_allclose(a, x + gate * (jnp.tanh(y) - x), atol=1e-5)


def test_post_norm_batch_norm_linear_head_train_and_eval(toy):
  config, model = _model({"model.attention": "toy_mixer", "model.norm": "batch", "model.norm_position": "post",
                          "model.head": "linear", "model.pooling": "MEAN", "model.positions": "none",
                          "model.mlp": False, "model.dropout_broadcast_time": True})
  tokens = jnp.array([[3, 4, 5, 0], [6, 7, 8, 9]])
  variables = model.init(jax.random.key(0), {"inputs": tokens})
  assert "batch_stats" in variables and "encoder_norm" not in variables["params"]["encoder"]
  assert set(variables["params"]) == {"encoder", "head_out"}  # the linear head
  _, updated = model.apply(variables, {"inputs": tokens}, deterministic=False, mutable=["batch_stats"],
                           rngs={"dropout": jax.random.key(1)})
  stats = updated["batch_stats"]["encoder"]["block_0"]["BatchNorm_0"]
  assert not np.allclose(stats["mean"], 0)  # the running mean moved (its masking: the next test)
  logits = model.apply(variables, {"inputs": tokens}, deterministic=True)  # running averages
  assert logits.shape == (2, 10) and np.all(np.isfinite(logits))


def test_batch_norm_ignores_padded_positions():
  norm_fn = lambda x, mask: models.make_norm("batch", jnp.float32)(x, mask, False)

  class Wrap(nn.Module):
    @nn.compact
    def __call__(self, x, mask):
      return norm_fn(x, mask)

  x = jax.random.normal(jax.random.key(0), (2, 5, 3))
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  variables = Wrap().init(jax.random.key(0), x, mask)
  _, state = Wrap().apply(variables, x.at[0, 3:].set(100.0), mask, mutable=["batch_stats"])
  real = np.asarray(x)[np.asarray(mask)]
  np.testing.assert_allclose(state["batch_stats"]["BatchNorm_0"]["mean"], 0.1 * real.mean(0), rtol=1e-5)


def test_ssm_parameters_get_their_own_rate_and_no_weight_decay():
  opt = ml_collections.ConfigDict({"schedule": "constant", "learning_rate": 0.1, "warmup_steps": 0,
                                   "steps_per_cycle": 1, "weight_decay": 0.5, "b1": 0.9, "b2": 0.98,
                                   "eps": 1e-9, "grad_clip_norm": 0.0})
  params = {"layer": {"ssm_A": jnp.ones(3), "kernel": jnp.ones(3)}}
  grads = {"layer": {"ssm_A": jnp.ones(3), "kernel": jnp.ones(3)}}
  one = optim.make_optimizer(opt)
  updates, _ = one.update(grads, one.init(params), params)
  np.testing.assert_allclose(updates["layer"]["ssm_A"], updates["layer"]["kernel"])  # no group: alike
  opt.ssm_learning_rate = 0.01
  two = optim.make_optimizer(opt)
  updates, _ = two.update(grads, two.init(params), params)
  # Adam's first step is -lr·sign(g) (+ decoupled decay lr·wd·p): ssm: -0.01; others: -0.1 - 0.1·0.5
  np.testing.assert_allclose(updates["layer"]["ssm_A"], -0.01, rtol=1e-5)
  np.testing.assert_allclose(updates["layer"]["kernel"], -0.1 - 0.05, rtol=1e-5)
  assert optim.is_ssm_param((jax.tree_util.DictKey("ssm_log_dt"),))
  assert not optim.is_ssm_param((jax.tree_util.DictKey("kernel"),))


@pytest.mark.parametrize("key,value,expected", [
    ("model.norm", "group", "one of layer, batch, scale"),
    ("model.norm_position", "middle", "one of pre, post"),
    ("model.head", "deep", "one of mlp, linear"),
    ("model.dropout_broadcast_time", 1, "True or False"),
    ("optimizer.ssm_learning_rate", 0.0, "> 0"),
    ("model.attention_kwargs.bidirectional", 3, "True or False"),
])
def test_bad_values_name_the_key(toy, key, value, expected):
  config = config_lib.load_config("lra", "listops", ["model.attention=toy_mixer"])  # no mixer settings
  parent, _, leaf = key.rpartition(".")
  node = config
  for part in parent.split("."):
    node = node[part]
  with node.unlocked():
    node[leaf] = value
  with pytest.raises(ConfigError, match=f"{key}={value!r} is not allowed; expected .*{expected}"):
    config_lib.validate(config)


def test_a_mixer_cell_trains_and_its_record_says_mixer(toy, listops_dir, tmp_path):
  config = config_lib.load_config("smoke", "listops", tiny_overrides(**{
      "model.attention": "toy_mixer", "optimizer.ssm_learning_rate": 0.001, "model.norm": "batch"}))
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir)
  assert record["status"] == "ok", record.get("error")
  assert record["layer_kind"] == "mixer" and record["attention"] == "toy_mixer"
  assert record["attention_module"] == __name__
  assert 0 <= record["test_accuracy"] <= 1


def test_suite_all_includes_mixers_and_their_causal_form(toy, tmp_path):
  cells, _ = suite.plan("smoke", ["listops"], attention_zoo.list_layers(), [0], str(tmp_path))
  assert {"toy_mixer", "toy_gated"} <= {c.attention for c in cells}
  causal = config_lib.load_config("smoke", "listops", tiny_overrides(**{
      "model.attention": "toy_mixer", "model.attention_kwargs.causal": True, "model.pooling": "MEAN"}))
  assert suite.causal_form_problem(causal) is None
  assert results.layer_kind("toy_mixer") == "mixer"


def test_mixer_kit_passes_the_toy_and_catches_a_leak(toy):
  assert testing.failures(testing.run_conformance("toy_mixer")) == []

  class Leaky(Toy):  # adds a bias before the scan without masking again: the padded tail's count leaks
    @nn.compact
    def __call__(self, x, mask, deterministic=True):
      return super().__call__(x + 1.0, mask, deterministic)

  with registry.temporary({"toy_leaky": (Leaky, ToyConfig)}):
    result = testing.check_one("toy_leaky", "padding")
  assert result.passed is False and "padded tail reaches" in result.detail


def test_a_one_way_mixer_under_cls_pooling_is_refused_and_cpu_makes_it_bidirectional(toy):
  """The CLS vector is the first position: a forward-only scan gives it nothing of the sequence."""
  with pytest.raises(ConfigError, match="model.pooling='CLS' is not allowed; expected MEAN, SUM or MAX with the "
                                        "one-directional sequence mixer 'toy_mixer'"):
    config_lib.load_config("lra", "listops", ["model.attention_kwargs.bidirectional=False"], attention="toy_mixer")
  config_lib.load_config("lra", "listops", ["model.attention_kwargs.bidirectional=False", "model.pooling=MEAN"],
                         attention="toy_mixer")
  assert config_lib.load_config("cpu", "listops", attention="lru").model.attention_kwargs.bidirectional is True
  assert config_lib.load_config("lru", "listops").model.attention_kwargs.bidirectional is False  # MEAN pooling
  assert "bidirectional" not in config_lib.load_config("cpu", "listops").model.attention_kwargs  # vanilla


@pytest.mark.parametrize("protocol", ["s4", "s5", "lru", "mega"])
def test_each_recipe_trains_its_mixer_end_to_end(protocol, listops_dir, tmp_path):
  """The recipe's encoder (BatchNorm / post-norm / linear head / SSM parameter group) around its own
  mixer, shrunk to the tiny ListOps data: a record with its settings, finite loss, an accuracy."""
  shrink = tiny_overrides(**{"model.num_layers": 1, "model.emb_dim": 16, "model.mlp_dim": 16})
  shrink += ["data.options.name=tiny", "data.max_length=64"]
  config = config_lib.load_config(protocol, "listops", shrink)
  record = cell.train_cell(config, str(tmp_path / protocol), listops_dir)
  assert record["status"] == "ok", record.get("error")
  assert record["layer_kind"] == "mixer" and record["attention"] == {"s4": "s4d"}.get(protocol, protocol)
  model = record["config"]["model"]
  assert model["pooling"] == "MEAN" and model["positions"] == "none"
  if protocol != "mega":
    assert record["config"]["optimizer"]["ssm_learning_rate"] > 0 and model["norm"] == "batch"
  assert 0 <= record["test_accuracy"] <= 1


def test_the_recall_report_counts_a_mixers_state():
  """The x axis of the recall figures for a mixer: its own state_size at the model's width."""
  from lra_bench.report import recall

  config = {"model": {"num_heads": 1, "qkv_dim": 64, "emb_dim": 32, "attention_kwargs": {"causal": True}},
            "data": {"max_length": 64}}
  assert recall.state_size("s4d", config)[0] == 32 * 64      # d_model · d_state (64)
  assert recall.state_size("lru", config)[0] == 2 * 256      # 2 · d_state, whatever the width
  assert recall.state_size("vanilla", config)[0] == 2 * 64 * 64  # the KV cache: 2·H·D·L
