"""Per-attention protocol settings: ``load_config`` gives each (protocol, task, attention) the settings the
original ran (LRA's files for `lra` and `combiner`, Xiong et al.'s ``lra_config.py`` for `xiong`), before
the command line's overrides; `smoke` keeps the cores' registered defaults.

The expected values are written out here from the original files (paths under
google-research/long-range-arena @ cd31e5c ``lra_benchmarks/``, and mlpen/Nystromformer
``LRA/code/lra_config.py``), not computed from ``configs/``, so a wrong preset fails.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from configs import lra as lra_protocol
from configs import xiong as xiong_protocol
from lra_bench.training import config as config_lib

ALL_TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
IMAGE_TASKS = ("image", "pathfinder")

# attention -> (expected attention_kwargs on every task, per-task additions, the LRA file they come from)
LRA_KWARGS = {
    "performer": ({}, {"listops": {"kernel": "softmax", "nb_features": 2, "feature_norms": "chi"},
                       **{t: {"kernel": "relu"} for t in ALL_TASKS if t != "listops"}},
                  "models/performer/performer.py ('generalized'); listops/configs/performer_base.py"),
    "reformer": ({"chunk_len": None, "n_buckets": 10, "n_hashes": 1, "lra_sqrt_d_quirk": True,
                  "normalize_keys": False, "mask_self": False, "redraw": "fixed"}, {},
                 "models/reformer/reformer_attention.py"),
    "sparse_fixed": ({"block_len": 50, "summary": 10, "first_column": True, "causal": True},
                     {"listops": {"cls_token": True}, "text": {"cls_token": True},
                      "retrieval": {"cls_token": True}, "image": {"cls_token": True},
                      "pathfinder": {"cls_token": False}, "pathx": {"cls_token": False}},
                     "utils/train_utils.py; models/sparse_transformer/sparse_attention.py (use_cls_token)"),
    "sinkhorn": ({"grouping": "strided", "lra_noop_sort": True},
                 {t: {"block_size": 64 if t in IMAGE_TASKS else 50} for t in ALL_TASKS},
                 "models/sinkhorn_transformer/sinkhorn_attention.py; image/configs/*/sinkhorn_base.py"),
    "bigbird": ({"block_size": 64, "num_rand_blocks": 3, "rand_block_span": 1024}, {},
                "models/bigbird/bigbird_attention.py (:322, :323, :375)"),
    "local": ({"grouping": "lra_strided"},
              {t: {"block_size": 64 if t in IMAGE_TASKS else 50} for t in ALL_TASKS},
              "models/local/local.py (50); image/configs/{cifar10,pathfinder32}/local_base.py (64)"),
    "longformer": ({"window": 512, "num_global": 0}, {}, "models/longformer/longformer_attention.py"),
    "linformer": ({"k": 16}, {}, "models/linformer/linformer_attention.py"),
    "linear_transformer": ({"eps": 1e-6}, {}, "models/linear_transformer/linear_attention.py"),
    "synthesizer": ({"mode": "random", "ignore_dot_product": False}, {}, "models/synthesizer/synthesizer.py"),
    "vanilla": ({}, {}, "models/transformer/transformer.py"),
}

# (attention, task) -> model/optimizer keys of image/configs/<task>/<model>_base.py (and the encoders'
# pooling defaults); keys not listed keep the task config (the transformer_base.py values).
LRA_MODEL = {
    ("local", "image"): {"num_layers": 1, "num_heads": 2, "emb_dim": 128, "qkv_dim": 64, "mlp_dim": 128,
                         "pooling": "MEAN"},
    ("longformer", "image"): {"num_layers": 4, "num_heads": 4, "emb_dim": 128, "qkv_dim": 64, "mlp_dim": 128,
                              "pooling": "MEAN"},
    ("reformer", "image"): {"num_layers": 4, "num_heads": 8, "emb_dim": 64, "qkv_dim": 32, "mlp_dim": 64},
    ("sinkhorn", "image"): {"num_layers": 1, "num_heads": 1, "emb_dim": 32, "qkv_dim": 32, "mlp_dim": 64,
                            "dropout_rate": 0.1, "weight_decay": 0.7},
    ("bigbird", "image"): {"num_layers": 1, "num_heads": 4, "emb_dim": 128, "qkv_dim": 64, "mlp_dim": 128},
    ("performer", "image"): {"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64, "mlp_dim": 128},
    ("performer", "pathfinder"): {"num_layers": 4, "num_heads": 8, "emb_dim": 32, "qkv_dim": 16,
                                  "mlp_dim": 32, "dropout_rate": 0.2},
    ("bigbird", "pathfinder"): {"num_layers": 4, "num_heads": 2, "emb_dim": 64, "qkv_dim": 32, "mlp_dim": 64,
                                "dropout_rate": 0.2},
    ("linear_transformer", "pathfinder"): {"num_layers": 1, "num_heads": 2, "emb_dim": 128, "qkv_dim": 64,
                                           "mlp_dim": 128, "dropout_rate": 0.2},
    ("linformer", "pathfinder"): {"num_layers": 1, "num_heads": 2, "emb_dim": 32, "qkv_dim": 16,
                                  "mlp_dim": 32, "dropout_rate": 0.2},
    ("local", "pathfinder"): {"num_layers": 2, "num_heads": 4, "emb_dim": 64, "qkv_dim": 32, "mlp_dim": 64,
                              "dropout_rate": 0.1},
    ("longformer", "pathfinder"): {"num_layers": 2, "num_heads": 2, "emb_dim": 32, "qkv_dim": 16,
                                   "mlp_dim": 32, "dropout_rate": 0.1},
    ("reformer", "pathfinder"): {"num_layers": 2, "num_heads": 8, "emb_dim": 64, "qkv_dim": 32, "mlp_dim": 64,
                                 "dropout_rate": 0.2},
    ("sinkhorn", "pathfinder"): {"num_layers": 2, "num_heads": 4, "emb_dim": 32, "qkv_dim": 16, "mlp_dim": 64,
                                 "dropout_rate": 0.2},
    ("sparse_fixed", "pathfinder"): {"num_layers": 1, "num_heads": 8, "emb_dim": 32, "qkv_dim": 16,
                                     "mlp_dim": 32, "dropout_rate": 0.2},
    ("synthesizer", "pathfinder"): {"num_layers": 2, "num_heads": 4, "emb_dim": 64, "qkv_dim": 32,
                                    "mlp_dim": 64, "dropout_rate": 0.2},
    ("sinkhorn", "listops"): {"pooling": "MEAN"},   # encoder default 'MEAN'; listops/train.py passes none
    ("vanilla", "image"): {"num_layers": 1, "num_heads": 8, "emb_dim": 128, "qkv_dim": 64, "mlp_dim": 128,
                           "pooling": "CLS"},
    ("vanilla", "pathfinder"): {"num_layers": 4, "num_heads": 4, "emb_dim": 32, "qkv_dim": 16, "mlp_dim": 32,
                                "pooling": "MEAN"},
}
# Cores whose LRA attention module applied no attention dropout (performer_attention.py,
# reformer_attention.py, linear_attention.py `del dropout_rate`, bigbird_attention.py's sparse path).
NO_ATTENTION_DROPOUT = {"performer", "reformer", "linear_transformer", "bigbird"}

# mlpen/Nystromformer LRA/code/lra_config.py extra_attn_config (every task alike).
XIONG_KWARGS = {
    "linformer": {"k": 256, "per_head": True, "init_std": 0.02},      # + model.share_attention_core
    # transformers' LSHSelfAttention picked the buckets from the length (a power of 2 <= 2 * 2048 // 64)
    "reformer": {"n_hashes": 2, "n_buckets": 64},
    # attention_performer.py: FastAttention(nb_features=rp_dim) without generalized_attention (FAVOR+),
    # q, k / D^{1/4} before softmax_kernel's own D^{-1/4}, its eps 1e-4, the buffer drawn once
    "performer": {"nb_features": 256, "input_normalizations": 2, "numerical_stabilizer": 1e-4, "redraw": "fixed"},
    "nystromformer": {"num_landmarks": 64, "conv_kernel": 35, "pinv_init": "batch"},
    "nystromformer_32": {"num_landmarks": 32, "conv_kernel": 35, "pinv_init": "batch"},
    "nystromformer_128": {"num_landmarks": 128, "conv_kernel": 35, "pinv_init": "batch"},
    "nystromformer_256": {"num_landmarks": 256, "conv_kernel": 35, "pinv_init": "batch"},
    "vanilla": {}, "linear_transformer": {},
}


def _model_value(config, key):
  return config.optimizer[key] if key == "weight_decay" else config.model[key]


@pytest.mark.parametrize("task", ALL_TASKS)
@pytest.mark.parametrize("attention", sorted(LRA_KWARGS))
def test_lra_preset_is_what_lra_ran(attention, task):
  common, per_task, source = LRA_KWARGS[attention]
  config = config_lib.load_config("lra", task, attention=attention)
  expected = {**common, **per_task.get(task, {})}
  assert config.model.attention_kwargs.to_dict() == expected, source
  base = config_lib.load_config("lra", task)            # vanilla: the task config (transformer_base.py)
  model = LRA_MODEL.get((attention, task), {})
  for key in ("num_layers", "num_heads", "emb_dim", "qkv_dim", "mlp_dim", "dropout_rate", "pooling",
              "weight_decay"):
    assert _model_value(config, key) == model.get(key, _model_value(base, key)), (attention, task, key)
  rate = 0.0 if attention in NO_ATTENTION_DROPOUT else base.model.attention_dropout_rate
  assert config.model.attention_dropout_rate == rate


def test_every_lra_table1_model_has_a_preset():
  """Every attention mapped to an LRA Table 1 row has LRA's settings (so its deltas are like for like)."""
  table1 = {"Transformer", "Local Attention", "Sparse Trans.", "Longformer", "Linformer", "Reformer",
            "Sinkhorn Trans.", "Synthesizer", "BigBird", "Linear Trans.", "Performer"}
  from lra_bench.report import reference
  mapped = {a for a in attention_zoo.list_attentions() if reference.paper_name(a) in table1}
  assert mapped == set(LRA_KWARGS)
  assert set(lra_protocol.PUBLISHED_DIFFERENCES) == set(LRA_KWARGS)


@pytest.mark.parametrize("attention", sorted(XIONG_KWARGS))
def test_xiong_preset_is_what_xiong_ran(attention):
  for task in ("listops", "image"):
    config = config_lib.load_config("xiong", task, attention=attention)
    expected = dict(XIONG_KWARGS[attention])
    if attention == "reformer" and task == "image":  # 1024 tokens: 2 * 1024 // 64 = 32 buckets
      expected["n_buckets"] = 32
    assert config.model.attention_kwargs.to_dict() == expected
    # only Xiong et al.'s SoftmaxAttention dropped attention weights (drop_attn); the others never read
    # the config's attention_dropout
    assert config.model.attention_dropout_rate == (0.1 if attention == "vanilla" else 0.0), attention
  assert set(xiong_protocol.PUBLISHED_DIFFERENCES) <= set(XIONG_KWARGS)


def test_xiong_reformer_buckets_follow_transformers_rule():
  """transformers' _set_num_buckets at run_tasks.py's padded length: 2 ** floor(log2(2 * P // 64)),
  factorised (no form here: the core's default stays) above 2 * max(sqrt(P // 64), 64)."""
  assert [xiong_protocol.lsh_buckets(n) for n in (1024, 2000, 2048, 3000, 4000)] == [32, 64, 64, 128, 128]
  assert xiong_protocol.lsh_buckets(16384) is None          # 2 * 256 = 512 > 128: factorised
  assert "n_buckets" not in config_lib.load_config("xiong", "pathx", attention="reformer").model.attention_kwargs


def test_combiner_protocol_uses_lra_presets_and_smoke_none():
  combiner = config_lib.load_config("combiner", "listops", attention="sparse_fixed")
  assert combiner.model.attention_kwargs.to_dict() == config_lib.load_config(
      "lra", "listops", attention="sparse_fixed").model.attention_kwargs.to_dict()
  for attention in LRA_KWARGS:
    assert config_lib.load_config("smoke", "listops", attention=attention).model.attention_kwargs.to_dict() == {}


def test_overrides_win_over_the_preset_and_choose_it():
  config = config_lib.load_config("lra", "image", ["model.attention_kwargs.block_size=32", "model.num_heads=4"],
                                  attention="local")
  assert (config.model.attention_kwargs.block_size, config.model.num_heads) == (32, 4)
  assert config.model.attention_kwargs.grouping == "lra_strided"
  # an attention chosen by override gets its preset too (the record shows what ran)
  chosen = config_lib.load_config("lra", "listops", ["model.attention=sinkhorn"])
  assert chosen.model.attention_kwargs.lra_noop_sort is True and chosen.model.pooling == "MEAN"
  reformer = config_lib.load_config("lra", "text", ["model.attention_kwargs.chunk_len=32"], attention="reformer")
  assert reformer.model.attention_kwargs.chunk_len == 32 and reformer.model.attention_kwargs.n_buckets == 10


def test_cls_token_follows_the_pooling():
  """sparse_fixed's CLS row/column is on exactly when the preset's model pools a CLS token."""
  for task in ALL_TASKS:
    config = config_lib.load_config("lra", task, attention="sparse_fixed")
    assert config.model.attention_kwargs.cls_token == (config.model.pooling == "CLS")


def test_bad_protocol_setting_is_a_config_error():
  config = lra_protocol.get_config("listops")
  with pytest.raises(config_lib.ConfigError, match="model.nonexistent"):
    config_lib.apply_settings(config, {"model.nonexistent": 1})
  config_lib.apply_settings(config, {"model.attention_kwargs.block_size": 8})  # open section: new keys
  assert config.model.attention_kwargs.block_size == 8


@pytest.mark.parametrize("protocol, attention, task", [
    ("lra", "performer", "listops"), ("lra", "reformer", "text"), ("lra", "sparse_fixed", "listops"),
    ("lra", "sinkhorn", "image"), ("lra", "local", "pathfinder"),
])
def test_preset_cores_run(protocol, attention, task):
  """The presets' new combinations of options build working cores (short input, padding): finite
  outputs. (Every lra preset was also run through the whole model on every task by hand.)"""
  kwargs = config_lib.load_config(protocol, task, attention=attention).model.attention_kwargs.to_dict()
  core = attention_zoo.create_attention(attention, **kwargs)
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 131, 2, 8)) for i in range(3))
  mask = jnp.arange(131)[None, :] < jnp.array([[131], [100]])
  variables = core.init({"params": jax.random.key(0)}, q, k, v, mask)
  out = core.apply(variables, q, k, v, mask)
  assert out.shape == (2, 131, 2, 8) and bool(np.all(np.isfinite(np.asarray(out))))
