"""The Xiong et al. protocol (Nyströmformer; reused by Skyformer and xformers): one small model for
every task — 2 layers, 64-dim, 2 heads of 32, FFN 128, mean pooling, learned positions, AdamW at 1e-4
with linear warm-up and linear decay, no weight decay.

Source: mlpen/Nystromformer ``LRA/code/lra_config.py`` (its model and training blocks, read 2026;
summarised in docs/lra_protocol.md §6). Path-X is not in that protocol; it gets the Pathfinder training
settings at 16K here.
Evaluation covers the full validation split (the original ran a fixed number of eval batches), and the
data keep the task lengths (the original padded max_seq_len up to a power of 2: 2048, 4096). Text runs at
the 1 000 tokens of their ``LRA/datasets/text.py`` (its pickles append 24 zero ids, padding); on the pixel
tasks black pixels are padding, as their ``mask = input_ids != 0`` on raw pixel ids made them
(``model.first_real_id``). Also
different on purpose: MEAN pooling averages the real tokens (the original's ``inp.mean(dim=1)`` divided
the sum over real tokens by the padded length), and the Q/K/V/output projections have no bias (the
original's ``nn.Linear`` layers had one) and this encoder's initialisers (PyTorch's defaults there).
The original trained in mixed precision (``run_tasks.py``: float16 autocast with a gradient scaler, the
attention cores themselves in float32); these runs compute in bfloat16 on a GPU or TPU (``precision="auto"``,
softmax, norms and the loss in float32, no loss scaling) and in float32 on the CPU.

  lra-bench train --task text --attention vanilla --protocol xiong --workdir runs/text_xiong
"""

from __future__ import annotations

import math

import ml_collections

from configs import lra

LINEAR = "constant * linear_warmup * linear_decay"   # torch OneCycleLR(anneal_strategy="linear")

# task: (max_length, batch_size, warmup, num_train_steps, eval_every) from lra_config.py
TRAINING = {
    "listops": (2000, 32, 1000, 5000, 50),
    # LRA/datasets/text.py builds IMDB with LRA's input pipeline at max_length 1000 (+24 zeros: 1024 ids),
    # although lra_config.py says max_seq_len 4000 (which sizes only the model: positions, Linformer's E)
    "text": (1000, 32, 8000, 20_000, 500),
    "retrieval": (4000, 32, 800, 30_000, 300),
    "image": (1024, 256, 175, 35_000, 175),
    "pathfinder": (1024, 256, 312, 62_400, 312),
    "pathx": (128 * 128, 256, 312, 62_400, 312),   # not in the protocol: Pathfinder's settings
}


# Per-attention settings of lra_config.py's ``extra_attn_config`` (the same for every task), applied by
# ``load_config`` when the attention is chosen (docs/lra_protocol.md §7).
NYSTROM = {"conv_kernel": 35,          # conv_kernel_size 35 for every nystrom-<m>
           # attention_nystrom.py tests `inv_coeff_init_option` but reads `inv_init_coeff_option`, so
           # its reachable pinv initialisation is "original": one max over batch and heads.
           "pinv_init": "batch"}
ATTENTION_KWARGS = {
    # linformer-256: linformer_k 256; attention_linformer.py: E [heads, k, n] N(0, 0.02), one for keys
    # and values, a class attribute shared by every layer (model.share_attention_core below)
    "linformer": {"k": 256, "per_head": True, "init_std": 0.02},
    # reformer-2: num_hash 2; transformers' LSHSelfAttention, whose other defaults are this core's
    # (chunks of 64 looking one chunk back, shared QK with length-normalised keys and logits / sqrt(D),
    # self-attention only as a last resort at -1e5, rotations redrawn every call, rounds combined by
    # logsumexp, LSH dropout 0); n_buckets: lsh_buckets() below
    "reformer": {"n_hashes": 2},
    # performer-256: rp_dim 256. attention_performer.py passes kernel_fn=ReLU() (config kernel_type
    # "relu") but not generalized_attention=True, so performer_pytorch ran its softmax kernel (FAVOR+);
    # q, k pre-divided by D^{1/4} and scaled again inside (2 normalizations), eps 1e-4, the projection
    # drawn once when the layer is built (FastAttention's buffer; nothing redraws it), chi norms.
    "performer": {"nb_features": 256, "input_normalizations": 2, "numerical_stabilizer": 1e-4,
                  "redraw": "fixed"},
    "nystromformer": {"num_landmarks": 64, **NYSTROM},             # nystrom-64
    "nystromformer_32": {"num_landmarks": 32, **NYSTROM},
    "nystromformer_128": {"num_landmarks": 128, **NYSTROM},
    "nystromformer_256": {"num_landmarks": 256, **NYSTROM},
    "vanilla": {},                                                 # softmax
    "linear_transformer": {},                                      # linear: elu + 1
}
# Settings of the published rows (lra_followups_accuracy.csv) these runs cannot match ("" = same). Performer
# and Reformer: reports/cpu_xiong_listops/README.md traces our ListOps cells' distance from the published
# numbers (+18.35, +11.60 points) to details of Xiong et al.'s calls that this preset does not copy.
PUBLISHED_DIFFERENCES = {
    "vanilla": "",
    "nystromformer": "",
    "linformer": "",
    "reformer": ("transformers' LSHSelfAttention hashed the padded positions into the buckets with the real "
                 "ones (a third of each window on ListOps); this core masks padding out of the buckets"),
    "performer": ("performer_pytorch's FastAttention as Xiong et al. called it kept padded keys as zero "
                  "vectors, whose features still enter the denominator, and took one key stabilizer (max) over "
                  "the whole batch; the preset gives padded keys zero weight and one stabilizer per batch and "
                  "head (padded_keys=zeroed, key_stabilizer=global reproduce theirs: not set, so the committed "
                  "cell stays the preset's)"),
}
# Image, Pathfinder (and Path-X here): Xiong et al. feed the raw pixel values as ids (LRA/datasets/cifar10.py,
# pathfinder.py) and mask ``input_ids != 0`` (LRA/code/dataset.py), so black pixels are padding: out of every
# attention and of the mean. Our pixel ids are value + 1 (black = 1): first_real_id 2 masks them the same way.
BLACK_IS_PADDING = ("image", "pathfinder", "pathx")
# Xiong et al.'s attention modules: only SoftmaxAttention applies attention dropout (its drop_attn);
# NystromAttention, LinformerAttention, PerformerAttention (performer_pytorch's FastAttention),
# LinearAttention and the reformer (transformers' LSHSelfAttention with ReformerConfig's default
# lsh_attention_probs_dropout_prob = 0) apply none, whatever the config's attention_dropout says.
NO_ATTENTION_DROPOUT = ("nystromformer", "nystromformer_32", "nystromformer_128", "nystromformer_256",
                        "linformer", "performer", "reformer", "linear_transformer")


def lsh_buckets(max_length: int, chunk: int = 64) -> int | None:
  """The number of buckets transformers' ``LSHSelfAttention`` chose for Xiong et al.'s reformer
  (``ReformerConfig`` leaves ``num_buckets`` unset, so ``_set_num_buckets`` takes the largest power of 2
  <= 2·(length // chunk), chunks of 64) at their input length, ``max_seq_len`` rounded up to a power
  of 2 by ``run_tasks.py`` (ListOps 2048 -> 64 buckets, each about half a chunk; this core's own default
  is ~P/C = 32). None where transformers factorised the buckets (above 2·max(√(length // chunk),
  chunk)), which this core has no form for (Path-X only)."""
  padded = 2 ** math.ceil(math.log2(max_length))
  power = (2 * (padded // chunk)).bit_length() - 1
  limit = 2 * max(int((padded // chunk) ** 0.5), chunk)
  return 2 ** power if 2 ** power <= limit else None


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  """Config key -> value Xiong et al. ran for ``config.model.attention`` (every task alike, but the
  reformer's bucket count, which follows the task's length)."""
  kwargs = dict(ATTENTION_KWARGS.get(config.model.attention, {}))
  if config.model.attention == "reformer" and (buckets := lsh_buckets(config.data.max_length)) is not None:
    kwargs["n_buckets"] = buckets
  settings = {f"model.attention_kwargs.{name}": value for name, value in kwargs.items()}
  if config.model.attention in NO_ATTENTION_DROPOUT:
    settings["model.attention_dropout_rate"] = 0.0
  if config.model.attention == "linformer":
    settings["model.share_attention_core"] = True
  return settings


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  # mlpen/Nystromformer LRA/code/run_tasks.py: float16 autocast with a gradient scaler; bfloat16 on GPU/TPU is
  # the harness's mixed precision (no loss scaling needed), float32 on the CPU
  c.precision = "auto"
  c.protocol = "xiong"
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.emb_dim = 64
  c.model.qkv_dim = 64                  # 2 heads x head_dim 32
  c.model.mlp_dim = 128
  c.model.dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.pooling = "MEAN"
  c.model.positions = "learned"         # learn_pos_emb=True, N(0, 0.02) (model.py)
  c.model.embed_init_std = 0.02         # model.py: word_embeddings normal_(std=0.02) (LRA's: N(0, 1))
  max_length, batch_size, warmup, steps, eval_every = TRAINING[task]
  c.data.max_length = max_length
  c.batch_size = batch_size
  c.num_train_steps = steps
  c.eval_every = eval_every
  c.optimizer.learning_rate = 1e-4
  c.optimizer.schedule = LINEAR
  c.optimizer.warmup_steps = warmup
  c.optimizer.steps_per_cycle = steps   # linear decay reaches 0 at the last step
  c.optimizer.weight_decay = 0.0
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6                # run_tasks.py: AdamW(betas=(0.9, 0.999), eps=1e-6)
  c.optimizer.grad_clip_norm = 0.0
  if task == "text":
    c.data.options.validation = "holdout"
  if task in BLACK_IS_PADDING:
    c.model.first_real_id = 2           # black pixels (id 1 here, 0 there) are padding, as theirs
  return c
