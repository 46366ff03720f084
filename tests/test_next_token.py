"""The next-token objective of the recall tasks: labels only at chosen positions, logits only there, a
causal model, the loss and accuracy over labelled slots, evaluation counts (tasks.base: "next_token")."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from lra_bench.training import models, objectives, steps


def _model_config(**extra) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict(dict(
      attention="vanilla", attention_kwargs=ml_collections.ConfigDict({"causal": True}), num_layers=2,
      num_heads=2, emb_dim=16, qkv_dim=16, mlp_dim=32, dropout_rate=0.0, attention_dropout_rate=0.0,
      pooling="MEAN", positions="learned", input_kind="tokens", mlp=True, embed_init_std=0.02,
      tie_embeddings=False))
  c.update(extra)
  return c


def _batch(seed=0, b=3, t=12, q=4, vocab=11):
  rng = np.random.default_rng(seed)
  inputs = rng.integers(1, vocab, (b, t)).astype(np.int32)
  positions = np.sort(rng.choice(t, (b, q)), axis=1).astype(np.int32)
  targets = rng.integers(0, vocab, (b, q)).astype(np.int32)
  return {"inputs": inputs, "positions": positions, "targets": targets}


def _init(config, batch, vocab=11):
  model = models.LanguageModel(config, vocab)
  params = model.init(jax.random.PRNGKey(0), batch)
  return model, params


def test_loss_and_accuracy_count_labelled_slots_only():
  logits = np.log(np.array([[[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]],
                            [[0.2, 0.2, 0.6], [0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]], np.float32))
  targets = np.array([[0, 2, -1], [2, -1, -1]], np.int32)
  loss, accuracy = steps.mean_loss_and_accuracy(*objectives.per_label(jnp.asarray(logits), jnp.asarray(targets)))
  expected = -(np.log(0.7) + np.log(0.1) + np.log(0.6)) / 3  # the three labelled slots
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  np.testing.assert_allclose(float(accuracy), 2 / 3, rtol=1e-6)  # slot (0, 1) predicts 1, not 2


def test_classification_loss_is_the_plain_mean():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)), jnp.float32)
  targets = jnp.asarray([0, 3, 1, 1, 2])
  loss, accuracy = steps.mean_loss_and_accuracy(*objectives.per_label(logits, targets))
  np.testing.assert_allclose(float(loss), float(jnp.mean(objectives.cross_entropy(logits, targets))), rtol=1e-6)
  np.testing.assert_allclose(float(accuracy), float(jnp.mean(jnp.argmax(logits, -1) == targets)))


@pytest.mark.parametrize("tie", [False, True])
def test_logits_only_at_positions_equal_the_full_sequence_logits(tie):
  config = _model_config(tie_embeddings=tie)
  batch = _batch()
  model, params = _init(config, batch)
  logits = model.apply(params, batch)
  assert logits.shape == (3, 4, 11) and logits.dtype == jnp.float32
  every = dict(batch, positions=np.tile(np.arange(12, dtype=np.int32), (3, 1)))
  full = model.apply(params, every)                                  # [B, T, V]
  gathered = np.take_along_axis(np.asarray(full), batch["positions"][..., None], axis=1)
  np.testing.assert_allclose(np.asarray(logits), gathered, rtol=1e-5, atol=1e-6)


def test_tied_output_layer_is_the_embedding():
  batch = _batch()
  _, tied = _init(_model_config(tie_embeddings=True), batch)
  _, untied = _init(_model_config(tie_embeddings=False), batch)
  assert "lm_head" not in tied["params"] and "lm_head" in untied["params"]
  assert tied["params"]["embed"]["embedding"].shape == (11, 16)
  assert "embed" not in tied["params"]["encoder"]  # one embedding, shared by input and output


def test_the_model_is_causal():
  """The logits at position p do not change when any later input changes."""
  config = _model_config()
  batch = _batch(q=1, t=12)
  batch["positions"] = np.full((3, 1), 5, np.int32)
  model, params = _init(config, batch)
  before = model.apply(params, batch)
  changed = dict(batch, inputs=batch["inputs"].copy())
  changed["inputs"][:, 6:] = (changed["inputs"][:, 6:] % 10) + 1
  np.testing.assert_allclose(np.asarray(model.apply(params, changed)), np.asarray(before), rtol=1e-6)
  earlier = dict(batch, inputs=batch["inputs"].copy())
  earlier["inputs"][:, 5] = (earlier["inputs"][:, 5] % 10) + 1
  assert not np.allclose(np.asarray(model.apply(params, earlier)), np.asarray(before))


def test_attention_only_blocks_have_no_mlp():
  batch = _batch()
  _, with_mlp = _init(_model_config(mlp=True), batch)
  _, without = _init(_model_config(mlp=False), batch)
  block = lambda p: p["params"]["encoder"]["block_0"]
  assert any(k.startswith("Dense") for k in block(with_mlp))
  assert not any(k.startswith("Dense") for k in block(without))


def test_eval_step_counts_labels_of_real_examples():
  config = _model_config()
  batch = _batch(b=4, q=3)
  batch["targets"][1, 2] = -1                       # an unused slot
  model, params = _init(config, batch)
  batch = dict(batch, weights=np.array([1, 1, 1, 0], np.float32))  # the last example is padding
  terms = lambda logits, batch: objectives.per_label(logits, batch["targets"])  # the next-token objective's
  sums = steps.eval_step(params["params"], {}, batch, model=model, terms=terms)
  assert float(sums["count"]) == 3 + 2 + 3 and float(sums["examples"]) == 3
  logits = np.asarray(model.apply(params, batch))
  predicted = logits.argmax(-1)
  labelled = (batch["targets"] >= 0) & (batch["weights"][:, None] > 0)
  assert float(sums["correct"]) == float(((predicted == batch["targets"]) & labelled).sum())


@pytest.mark.parametrize("rescale", [False, True])
def test_gpt2_dense_initialisation(rescale):
  # seq_icl / Zoology _init_weights: every block linear N(0, 0.02); with the GPT-2 rescale the attention's
  # output and the MLP's second layer N(0, 0.02 / sqrt(2 · num_layers)). Wide layers so the sample std
  # of each kernel is within a few percent of the drawn one.
  config = _model_config(emb_dim=256, qkv_dim=256, mlp_dim=1024, num_layers=2, dense_init_std=0.02,
                         residual_init_rescale=rescale)
  _, params = _init(config, _batch())
  block = params["params"]["encoder"]["block_1"]
  out_std = 0.02 / np.sqrt(4) if rescale else 0.02
  stds = {"query": np.std(block["MultiHeadAttention_0"]["query"]["kernel"]),
          "out": np.std(block["MultiHeadAttention_0"]["out"]["kernel"]),
          "fc1": np.std(block["Dense_0"]["kernel"]), "fc2": np.std(block["Dense_1"]["kernel"])}
  expected = {"query": 0.02, "out": out_std, "fc1": 0.02, "fc2": out_std}
  for name, std in stds.items():
    assert std == pytest.approx(expected[name], rel=0.05), name
  assert not np.any(block["Dense_1"]["bias"])


def test_attention_bias_is_zero_initialised_and_applied():
  # model.attention_bias: the PyTorch MHA of seq_icl / Zoology (nn.Linear with bias, zeroed by _init_weights).
  _, params = _init(_model_config(attention_bias=True), _batch())
  attention = params["params"]["encoder"]["block_0"]["MultiHeadAttention_0"]
  assert {name: attention[name]["bias"].shape for name in ("query", "key", "value", "out")} == {
      "query": (2, 8), "key": (2, 8), "value": (2, 8), "out": (16,)}
  assert not any(np.any(attention[name]["bias"]) for name in ("query", "key", "value", "out"))
  _, without = _init(_model_config(), _batch())
  assert "bias" not in without["params"]["encoder"]["block_0"]["MultiHeadAttention_0"]["query"]
  # A value bias b_v and an output bias b_o add b_v · W_out + b_o to every position (the attention
  # weights of each row sum to 1); a query bias changes the weights.
  mha = models.MultiHeadAttention(2, 16, "vanilla", {"causal": True}, 0.0, use_bias=True)
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 7, 16)), jnp.float32)
  mask = jnp.ones((2, 7), bool)
  p = mha.init(jax.random.PRNGKey(0), x, mask, True)
  base = np.asarray(mha.apply(p, x, mask, True), np.float64)
  rng = np.random.default_rng(2)
  b_v, b_o = rng.normal(size=(2, 8)), rng.normal(size=16)
  biased = jax.tree_util.tree_map(lambda a: a, p)
  biased["params"]["value"]["bias"] = jnp.asarray(b_v, jnp.float32)
  biased["params"]["out"]["bias"] = jnp.asarray(b_o, jnp.float32)
  shift = np.einsum("hd,hde->e", b_v, np.asarray(p["params"]["out"]["kernel"], np.float64)) + b_o
  np.testing.assert_allclose(np.asarray(mha.apply(biased, x, mask, True)), base + shift, atol=1e-5)
  biased["params"]["query"]["bias"] = jnp.asarray(rng.normal(size=(2, 8)), jnp.float32)
  assert not np.allclose(np.asarray(mha.apply(biased, x, mask, True)), base + shift, atol=1e-3)


def test_without_dense_init_std_the_layers_keep_their_defaults():
  _, params = _init(_model_config(emb_dim=256, qkv_dim=256, mlp_dim=1024), _batch())
  block = params["params"]["encoder"]["block_0"]
  assert np.std(block["Dense_0"]["kernel"]) == pytest.approx(1 / np.sqrt(256), rel=0.05)  # LeCun normal
  assert np.std(block["Dense_1"]["kernel"]) == pytest.approx(1 / np.sqrt(1024), rel=0.05)
  xavier = np.sqrt(2 / (256 + 256))  # xavier-uniform over the [256, heads, head_dim] kernel's fans
  assert np.std(block["MultiHeadAttention_0"]["query"]["kernel"]) == pytest.approx(xavier, rel=0.05)
