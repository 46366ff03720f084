"""The sequence-model protocols (``s4``, ``s5``, ``lru``, ``mega``), Zoology's block, ``xiong``'s data details and
the self-pretraining checks run the originals' settings, or say where they cannot (``PUBLISHED_DIFFERENCES``).

The expected values are written out here from the original files (not computed from ``configs/``), each with its
file: state-spaces/s4 @ e757cef (``configs/experiment/lra/s4-*.yaml``, ``configs/model/layer/s4.yaml``,
``src/models/sequence/kernels/{kernel,ssm,dplr}.py``, ``src/models/hippo/hippo.py``, ``src/utils/optim_groups.py``,
``configs/config.yaml``); lindermanlab/S5 (``bin/run_experiments/run_lra_*.sh``, ``run_train.py``,
``s5/train_helpers.py``, ``s5/seq_model.py``, ``s5/layers.py``); NicolasZucchet/minimal-LRU (``lru/model.py``,
``lru/dataloaders/lra.py``); facebookresearch/mega (``examples/mega/README.lra.md``,
``fairseq/models/lra/{model,mega_lra_encoder}.py``, ``fairseq/modules/normalized_feedforward_network.py``);
HazyResearch/zoology (``zoology/model.py``); mlpen/Nystromformer (``LRA/datasets/*.py``, ``LRA/code/dataset.py``);
IdoAmos/not-from-scratch (``src/dataloaders/lra.py``, ``src/dataloaders/base.py``).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import recall_cpu, xiong
from lra_bench.errors import ConfigError
from lra_bench.training import config as config_lib
from lra_bench.training import models, optim

TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")


def load(protocol, task, overrides=(), attention=None):
  return config_lib.load_config(protocol, task, list(overrides), attention=attention)


# --- 1. IMDB length ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, length, source", [
    ("s4", 4096, "s4-imdb.yaml dataset.l_max: 4096"),
    ("s5", 4096, "S5 s5/dataloaders/lra.py IMDB l_max 4096"),
    ("lru", 4096, "minimal-LRU lru/dataloaders/lra.py IMDB l_max 4096"),
    ("mega", 4000, "mega fairseq/models/lra/model.py mega_lra_imdb max_positions 4002 (4000 tokens + 2)"),
    ("xiong", 1000, "Nystromformer LRA/datasets/text.py get_tc_datasets(max_length=1000), + 24 zeros"),
])
def test_text_runs_the_originals_length(protocol, length, source):
  assert load(protocol, "text").data.max_length == length, source
  if protocol == "mega":
    assert load(protocol, "text").model.attention_kwargs.max_positions == 4000


# --- 2. dropout the originals do not have ------------------------------------------------------------------
def test_encoder_dropout_as_the_originals():
  for task in TASKS:
    s4 = load("s4", task).model
    # model/base.yaml dropinp 0 (SequenceModel.drop); backbones/block.py drops the layer output before the
    # residual (self.drop(y)), and the encoder ends in a norm when prenorm (backbones/model.py self.norm)
    assert s4.embed_dropout_rate == 0.0 and s4.get("residual_dropout", True) and s4.get("final_norm", True)
    for protocol in ("s5", "lru"):
      m = load(protocol, task).model
      # S5 s5/layers.py SequenceLayer / minimal-LRU lru/model.py SequenceLayer: x = skip + x (the layer ends in
      # its own dropout); StackedEncoderModel: encoder Dense, the layers, no final norm, no input dropout
      assert (m.embed_dropout_rate, m.residual_dropout, m.final_norm) == (0.0, False, False), (protocol, task)
      assert m.token_embedding == "onehot_dense", "one_hot(inputs, in_dim) -> nn.Dense(d_model)"
    mega = load("mega", task).model
    # normalized_feedforward_network.py: hidden_dropout = --act-dropout 0.0 (README.lra.md, every task)
    assert mega.mlp_hidden_dropout_rate == 0.0
    assert mega.get("residual_dropout", True)        # the FFN's and the EMA layer's output dropout (--dropout)


def test_batch_norm_momentum_as_the_originals():
  # run_train.py --bn_momentum 0.95, 0.9 in run_lra_pathfinder.sh / run_lra_pathx.sh; minimal-LRU: flax's default
  # nn.BatchNorm momentum 0.99; S4 / Mega: torch BatchNorm1d momentum 0.1 (flax 0.9, the default here)
  assert [load("s5", t).model.batch_norm_momentum for t in TASKS] == [0.95, 0.95, 0.95, 0.95, 0.9, 0.9]
  assert {load("lru", t).model.batch_norm_momentum for t in TASKS} == {0.99}
  assert "batch_norm_momentum" not in load("s4", "image").model


# --- 3. mega -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task, warmup, total", [
    ("listops", 3_000, 90_000), ("text", 10_000, 25_000), ("retrieval", 10_000, 91_960),
    ("image", 9_000, 180_000), ("pathfinder", 50_000, 250_000), ("pathx", 25_000, 125_000)])
def test_mega_is_the_readme(task, warmup, total):
  """examples/mega/README.lra.md: --warmup-updates, --max-update, --attention-dropout 0.0 --act-dropout 0.0."""
  for attention in ("mega", "mega_chunk"):
    c = load("mega", task, attention=attention)
    assert (c.optimizer.warmup_steps, c.num_train_steps, c.optimizer.steps_per_cycle) == (warmup, total, total)
    kwargs = c.model.attention_kwargs
    assert (kwargs.attention_dropout_rate, kwargs.hidden_dropout_rate) == (0.0, 0.0)
    m = c.model
    # mega_lra_encoder.py Embedding: N(0, embedding_dim^-1/2); normalized_feedforward_network.py fc1/fc2 N(0, 0.02)
    assert m.embed_init_std == pytest.approx(m.emb_dim ** -0.5) and m.dense_init_std == 0.02
    # model.py LRAModel: classifier Linear -> dropout (--dropout) -> GELU -> Linear; AAN classifier_in_dim 2 d
    assert (m.head, m.head_activation, m.head_dropout_rate) == ("mlp", "gelu", m.dropout_rate)
    assert m.get("dual_features", "nli") == ("concat" if task == "retrieval" else "nli")


# --- 4. s4 ---------------------------------------------------------------------------------------------------
def _groups(config):
  """parameter path -> (rate, decay) of the model that config builds (the real parameter tree)."""
  import tasks as tasks_lib

  task = tasks_lib.get_task(config.task)
  model = models.Classifier(config.model, task.vocab_size, task.num_classes, task.dual_input)
  names = ("inputs1", "inputs2") if task.dual_input else ("inputs",)
  pixels = config.model.get("input_kind", "tokens") == "pixels"
  batch = {n: jnp.ones((1, 8), jnp.float32 if pixels else jnp.int32) for n in names}
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), batch))["params"]
  rules = optim.parse_param_groups(config.optimizer.get("param_groups", ""))
  paths = jax.tree_util.tree_flatten_with_path(shapes)[0]
  return {"/".join(optim._names(path)): optim.param_group(rules, path) for path, _ in paths}


def _only(groups, suffix):
  found = {value for path, value in groups.items() if path.endswith(suffix)}
  assert len(found) == 1, (suffix, found)
  return found.pop()


@pytest.mark.parametrize("task", ["listops", "image"])
def test_s4_layer_rates_and_weight_decay(task):
  """kernel.py register(name, tensor, lr, wd): ListOps/IMDB/AAN lr {dt: null, A: 1e-3, B: 1e-3}: Δ at the main
  rate, A and B at 1e-3, none decayed, C at the main rate and decay; CIFAR/Pathfinder/Path-X lr 0.001: C too at
  1e-3 (ssm.py register("C", C, lr, None): main decay). optim_groups.py add_optimizer_hooks: no decay on
  biases, norms, nn.Embedding."""
  config = load("s4", task, ["data.max_length=8"])
  groups = _groups(config)
  dict_lr = task == "listops"
  assert _only(groups, "mixer/ssm_inv_dt") == (("main", "0") if dict_lr else ("ssm", "ssm"))
  assert _only(groups, "mixer/ssm_log_A_re") == ("ssm", "ssm") == _only(groups, "mixer/ssm_B")
  assert _only(groups, "mixer/C") == (("main", "main") if dict_lr else ("ssm", "main"))
  assert _only(groups, "mixer/D") == ("main", "main") == _only(groups, "output_linear/kernel")
  assert _only(groups, "/bias") == ("main", "0")
  assert {v for p, v in groups.items() if "BatchNorm" in p} == {("main", "0")}
  if not dict_lr:
    assert _only(groups, "pixel_projection/kernel") == ("main", "main")
  else:
    assert _only(groups, "embed/embedding") == ("main", "0")
  assert config.optimizer.ssm_learning_rate == 0.001 and config.optimizer.ssm_weight_decay == 0.0


def test_s4_kernel_options_are_the_yamls():
  for task in TASKS:
    kwargs = load("s4", task).model.attention_kwargs
    # dplr.ssm('legs') -> hippo.nplr B (trained: lr B 1e-3); layer/s4.yaml dt_transform softplus; n_ssm of the yaml
    assert (kwargs.B_init, kwargs.trainable_B, kwargs.dt_transform) == ("legs", True, "softplus")
    assert kwargs.n_ssm == (None if task in ("pathfinder", "pathx") else 1), "s4-pathfinder/pathx: n_ssm null"
  assert load("s4", "retrieval").model.head_activation == "gelu", "pipeline/aan.yaml decoder activation gelu"


# --- 5. s5 / lru ---------------------------------------------------------------------------------------------
def test_s5_optimizer_variants_of_the_scripts():
  """run_lra_*.sh --opt_config / --dt_global / --warmup_end, s5/train_helpers.py create_train_state."""
  expected = {"listops": "ssm_B=main/main",          # BfastandCdecay: B in "regular" (lr, weight decay)
              "image": "ssm_B=main/main",            # BfastandCdecay
              "pathx": "ssm_B=ssm/main",             # BandCdecay: AdamW(ssm_lr, weight_decay) for B
              "text": "ssm_log_step=main/main",      # dt_global: log_step in "regular"
              "retrieval": "ssm_log_step=main/main",  # dt_global
              "pathfinder": None}                    # standard
  for task, groups in expected.items():
    assert load("s5", task).optimizer.get("param_groups") == groups, task
  text = load("s5", "text")
  assert text.optimizer.warmup_steps == 0 and "linear_warmup" not in text.optimizer.schedule  # --warmup_end=0
  assert load("s5", "listops").optimizer.warmup_steps == 1920          # one epoch of 96 000 at batch 50
  assert load("s5", "retrieval").model.head_activation == "gelu"       # seq_model.py RetrievalDecoder


def test_onehot_dense_is_a_dense_layer_on_one_hot_tokens():
  ids = jnp.array([[3, 1, 0, 2]])
  layer = models.OneHotDense(5, 4)
  params = layer.init(jax.random.PRNGKey(0), ids)["params"]
  params = {**params, "bias": jnp.arange(4.0)}
  dense = nn.Dense(4).apply({"params": params}, jax.nn.one_hot(ids, 5))
  np.testing.assert_allclose(layer.apply({"params": params}, ids), dense, rtol=1e-6)
  assert params["kernel"].shape == (5, 4)


# --- 6. zoology --------------------------------------------------------------------------------------------
def test_zoology_block_adds_the_norm_of_the_residual():
  """zoology/model.py TransformerBlock.forward with an Identity state mixer: residual r = x + mixer(norm1(x)),
  the next block (or LMBackbone's ln_f) adds dropout(norm2(r)): x' = r + norm2(r)."""
  zoology = load("zoology", "mqar").model
  assert zoology.identity_state_mixer is True and zoology.mlp is False
  assert load("recall_cpu", "mqar").model.identity_state_mixer is True     # since 2026-12-06, as zoology
  c = ml_collections.ConfigDict(zoology.to_dict())
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, c.emb_dim))
  mask = jnp.ones((2, 6), bool)
  block = models.EncoderBlock(c)
  variables = block.init(jax.random.PRNGKey(1), x, mask, deterministic=True)
  out = block.apply(variables, x, mask, deterministic=True)
  without = ml_collections.ConfigDict({**c.to_dict(), "identity_state_mixer": False})
  params = {k: v for k, v in variables["params"].items() if k != "LayerNorm_1"}
  r = models.EncoderBlock(without).apply({"params": params}, x, mask, deterministic=True)
  norm2 = nn.LayerNorm().apply({"params": variables["params"]["LayerNorm_1"]}, r)
  np.testing.assert_allclose(out, r + norm2, rtol=1e-5, atol=1e-6)


def test_recall_cpu_says_its_block_differs():
  """The preset runs Zoology's block and differs in the budget only; a record without Zoology's block (the cells
  committed before 2026-12-06, made again with --set model.identity_state_mixer=False) says the block differs."""
  from lra_bench.report import reference
  assert reference.preset_match("recall_cpu", "vanilla") == (False, recall_cpu.BUDGET_DIFFERS)
  assert "norm2(residual)" not in recall_cpu.BUDGET_DIFFERS
  old = load("recall_cpu", "mqar", ["model.identity_state_mixer=False"]).to_dict()
  committed = {**old, "model": {k: v for k, v in old["model"].items() if k != "identity_state_mixer"}}
  for config in (old, committed):
    text = recall_cpu.published_difference("vanilla", config)
    assert "norm2(residual)" in text and "model.identity_state_mixer=False" in text
  assert recall_cpu.published_difference("vanilla", load("recall_cpu", "mqar").to_dict()) == recall_cpu.BUDGET_DIFFERS


# --- 7. xiong -----------------------------------------------------------------------------------------------
def test_xiong_black_pixels_are_padding():
  """LRA/datasets/cifar10.py, pathfinder.py: raw pixel values as ids; LRA/code/dataset.py mask = ids != 0."""
  for task in ("image", "pathfinder", "pathx"):
    assert load("xiong", task).model.first_real_id == 2
  assert "first_real_id" not in load("xiong", "listops").model
  config = load("xiong", "image", ["data.max_length=8"])
  model = models.Encoder(config.model, 257)
  ids = jnp.array([[1, 5, 1, 9, 0, 0, 1, 3]])
  variables = model.init(jax.random.PRNGKey(0), ids, True)
  _, mask = model.apply(variables, ids, True)
  assert mask.tolist() == [[False, True, False, True, False, False, False, True]]


def test_xiong_performer_and_reformer_differ():
  assert xiong.PUBLISHED_DIFFERENCES["performer"] and xiong.PUBLISHED_DIFFERENCES["reformer"]
  assert "stabilizer" in xiong.PUBLISHED_DIFFERENCES["performer"]
  assert "padded" in xiong.PUBLISHED_DIFFERENCES["reformer"]


# --- 8. self-pretraining, validation ------------------------------------------------------------------------
def test_masked_spt_refuses_a_forward_only_layer():
  with pytest.raises(ConfigError, match="both sides"):
    load("lru", "listops", ["pretrain.objective=masked"])
  load("lru", "listops", ["pretrain.objective=masked", "model.attention_kwargs.bidirectional=True"])
  load("lru", "pathfinder", ["pretrain.objective=masked"])        # bidirectional there (Table 9)


@pytest.mark.parametrize("overrides, match", [
    (["model.attention_kwargs.r_min=0.9", "model.attention_kwargs.r_max=0.5"], "r_min <= r_max"),
    (["model.attention_kwargs.r_max=1.2"], "r_max <= 1"),
])
def test_lru_ring_is_checked_with_the_config(overrides, match):
  with pytest.raises(ConfigError, match=match):
    load("lru", "listops", overrides)


def test_mega_chunk_size_is_checked_with_the_config():
  with pytest.raises(ConfigError, match="chunk_size"):
    load("mega", "listops", ["model.attention_kwargs.chunk_size=0"], attention="mega_chunk")


def test_new_model_options_are_checked():
  with pytest.raises(ConfigError, match="model.head_activation"):
    load("s4", "listops", ["model.head_activation=tanh"])
  with pytest.raises(ConfigError, match="model.identity_state_mixer"):
    load("smoke", "listops", ["model.identity_state_mixer=True"])     # the smoke model has an MLP
  with pytest.raises(ConfigError, match="param_groups"):
    load("s4", "listops", ["optimizer.param_groups=C=fast/0"])
  with pytest.raises(ConfigError, match="ssm_learning_rate"):
    load("smoke", "listops", ["optimizer.param_groups=C=ssm/0"])


def test_param_groups_set_each_parameters_rate_and_decay():
  """AdamW with a zero gradient moves a parameter by −lr·wd·p: each rule's rate and decay are its own."""
  opt = ml_collections.ConfigDict({"learning_rate": 0.1, "ssm_learning_rate": 0.01, "weight_decay": 0.5,
                                   "ssm_weight_decay": 0.0, "schedule": "constant", "warmup_steps": 0,
                                   "steps_per_cycle": 1, "b1": 0.9, "b2": 0.999, "eps": 1e-8,
                                   "grad_clip_norm": 0.0, "param_groups": "C=ssm/main, bias=main/0"})
  params = {"mixer": {"C": jnp.ones(2), "ssm_A": jnp.ones(2), "D": jnp.ones(2), "bias": jnp.ones(2)}}
  tx = optim.make_optimizer(opt)
  updates, _ = tx.update(jax.tree_util.tree_map(jnp.zeros_like, params), tx.init(params), params)
  moved = {k: float(v[0]) for k, v in updates["mixer"].items()}
  assert moved == pytest.approx({"C": -0.01 * 0.5, "ssm_A": 0.0, "D": -0.1 * 0.5, "bias": 0.0})


def test_cpu_runs_the_modern_layers_in_their_faster_form_on_a_cpu():
  """The `cpu` protocol trains the layers of RECURRENT_ON_CPU token by token (the same function, faster on a
  CPU), mlstm, mamba2, rwkv6 and hgrn2 in their default chunked form, and the Transformer cores as they are."""
  import dataclasses

  import attention_zoo
  from configs import cpu

  for name in cpu.RECURRENT_ON_CPU:
    assert "mode" in {f.name for f in dataclasses.fields(attention_zoo.layer_config(name))}, name
    assert config_lib.load_config("cpu", "listops", attention=name).model.attention_kwargs.mode == "recurrent"
  for name in ("mlstm", "mamba2", "rwkv6", "hgrn2", "vanilla", "s4d"):
    assert "mode" not in config_lib.load_config("cpu", "listops", attention=name).model.attention_kwargs, name
