"""The official LRA protocol: the per-task Transformer configs of google-research/long-range-arena.

Values are the repo's ``lra_benchmarks/<task>/configs/base_*_config.py`` plus the model's
``transformer_base.py``; the repo configs are authoritative over the paper appendix (as its maintainers
said in LRA issues #17 and #21). The settings and the model are written out in docs/lra_protocol.md
(§2 per-task table, §3 model).

  lra-bench train --task listops --attention vanilla --protocol lra --workdir runs/listops_vanilla
"""

from __future__ import annotations

import ml_collections

# Learning-rate factor strings of the LRA ``create_learning_rate_scheduler``.
RSQRT = "constant * linear_warmup * rsqrt_decay"
COSINE = "constant * linear_warmup * cosine_decay"


def base_config() -> ml_collections.ConfigDict:
  """Fields every task shares; each task below overrides what differs."""
  c = ml_collections.ConfigDict()
  c.protocol = "lra"
  c.task = ""
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  c.model.attention = "vanilla"
  # Overrides of the attention core's config (attention_zoo.attention_config(name) lists the fields).
  c.model.attention_kwargs = ml_collections.ConfigDict()
  c.model.num_layers = 4
  c.model.num_heads = 8
  c.model.emb_dim = 512
  c.model.qkv_dim = 512
  c.model.mlp_dim = 1024
  c.model.dropout_rate = 0.1            # model default in LRA (ListOps/Text/Retrieval configs don't set it)
  c.model.attention_dropout_rate = 0.1
  c.model.pooling = "CLS"               # CLS prepends a learned (zero-init) vector, so length + 1
  c.model.positions = "sinusoidal"      # LRA default: fixed sinusoidal (learn_pos_emb=False)
  c.model.input_kind = "tokens"         # "pixels": float pixels through a dense projection (image tasks)

  c.data = ml_collections.ConfigDict()
  c.data.max_length = 2000
  c.data.shuffle_buffer = 1024          # LRA train pipelines shuffle with a 1024 buffer
  c.data.options = ml_collections.ConfigDict()   # passed to Task.examples (e.g. ListOps file name)
  c.data.prepare = ml_collections.ConfigDict()   # passed to Task.prepare by `data prepare --protocol`

  c.batch_size = 32                     # the global batch: over all devices and accumulation steps
  # Scale-out (lra_bench/training/parallel.py). Gradient accumulation: the batch is run as this many equal
  # micro-batches, one optimizer step (same result, 1/accumulate_steps of the activation memory).
  c.accumulate_steps = 1
  c.precision = "float32"               # or "bfloat16": bf16 activations/matmuls; params, softmax, norms, loss f32
  c.param_sharding = "replicated"       # or "fsdp": large params/optimizer moments split over the devices
  c.num_train_steps = 5000
  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.learning_rate = 0.05      # `constant` factor
  c.optimizer.schedule = RSQRT
  c.optimizer.warmup_steps = 1000
  c.optimizer.steps_per_cycle = 100_000  # cosine_decay only
  c.optimizer.weight_decay = 0.1        # decoupled, lr-scaled, on all parameters (flax.optim Adam)
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.98
  c.optimizer.eps = 1e-9
  c.optimizer.grad_clip_norm = 0.0      # 0 = no clipping

  c.eval_every = 100
  c.num_eval_batches = -1               # -1 = the full validation split
  c.log_every = 50
  c.checkpoint_every = 500
  return c


def listops(c: ml_collections.ConfigDict) -> None:
  """listops/configs/base_listops_config.py (4 layers since commit 8d3dc39)."""
  c.data.max_length = 2000              # tokens (+1 CLS in the model); no example exceeds 1999
  c.data.options.name = "basic"         # basic_{train,val,test}.tsv, as the release
  c.eval_every = 50                     # eval_frequency 50, full validation set


def text(c: ml_collections.ConfigDict) -> None:
  """text_classification/configs/base_tc_config.py (+ transformer_base.py)."""
  c.model.num_heads = 4
  c.model.emb_dim = 256
  c.model.qkv_dim = 256
  c.model.mlp_dim = 1024
  c.data.max_length = 1000              # the LRA code config (the paper says 4K: --set data.max_length=4000)
  c.data.shuffle_buffer = 256           # LRA text pipeline
  c.data.options.validation = "holdout" # train[90%:]; "test" = LRA's test-as-validation (parity)
  c.num_train_steps = 20_000
  c.optimizer.warmup_steps = 8000


def retrieval(c: ml_collections.ConfigDict) -> None:
  """matching/configs/base_match_config.py (+ transformer_base.py); 4000 bytes per document."""
  c.model.num_heads = 4
  c.model.emb_dim = 128
  c.model.qkv_dim = 128
  c.model.mlp_dim = 512
  c.data.max_length = 4000
  c.data.shuffle_buffer = 2048          # LRA matching pipeline (after a 10k CSV shuffle)
  c.num_train_steps = 5000
  c.optimizer.warmup_steps = 8000       # as the repo: the run ends inside the warm-up (max lr 3.5e-4)


def cosine_epochs(c: ml_collections.ConfigDict, *, batch_size: int, steps_per_epoch: int, epochs: int,
                  learning_rate: float) -> None:
  """The image configs' schedule: one warm-up epoch, one cosine cycle over the run, no weight decay,
  eval every epoch (LRA image/configs: const * linear_warmup * cosine_decay)."""
  c.batch_size = batch_size
  c.num_train_steps = epochs * steps_per_epoch
  c.optimizer.learning_rate = learning_rate
  c.optimizer.schedule = COSINE
  c.optimizer.warmup_steps = steps_per_epoch
  c.optimizer.steps_per_cycle = epochs * steps_per_epoch
  c.optimizer.weight_decay = 0.0
  c.eval_every = steps_per_epoch


def image(c: ml_collections.ConfigDict) -> None:
  """image/configs/cifar10/base_cifar10_config.py (+ transformer config, 8 heads per commit ee6649e)."""
  c.model.num_layers = 1
  c.model.num_heads = 8
  c.model.emb_dim = 128
  c.model.qkv_dim = 64
  c.model.mlp_dim = 128
  c.model.dropout_rate = 0.3
  c.model.attention_dropout_rate = 0.2
  c.model.positions = "learned"
  c.data.max_length = 1024              # 32 x 32 gray pixels
  c.data.shuffle_buffer = 256
  cosine_epochs(c, batch_size=256, steps_per_epoch=175, epochs=200, learning_rate=5e-4)  # 35k steps


def pathfinder(c: ml_collections.ConfigDict) -> None:
  """image/configs/pathfinder32/ transformer config; pathfinder32_hard (contour 14), LRA issue #11."""
  c.model.num_heads = 4
  c.model.emb_dim = 32
  c.model.qkv_dim = 16
  c.model.mlp_dim = 32
  c.model.dropout_rate = 0.2
  c.model.attention_dropout_rate = 0.1
  c.model.pooling = "MEAN"
  c.model.positions = "sinusoidal"      # learn_pos_emb=False in the repo config (see LRA issue #60)
  c.data.max_length = 1024
  c.data.options.contour_length = 14
  c.data.prepare.contour_length = 14
  c.data.prepare.num_images = 200_000   # per difficulty, as the release (160k/20k/20k)
  cosine_epochs(c, batch_size=512, steps_per_epoch=312, epochs=200, learning_rate=1e-3)  # 62.4k steps


def pathx(c: ml_collections.ConfigDict) -> None:
  """image/configs/pathfinder128/ transformer config (Path-X = pathfinder128_hard)."""
  c.model.num_layers = 1
  c.model.num_heads = 2
  c.model.emb_dim = 32
  c.model.qkv_dim = 16
  c.model.mlp_dim = 32
  c.model.dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.pooling = "MEAN"
  c.model.positions = "learned"
  c.data.max_length = 128 * 128
  c.data.options.contour_length = 14
  c.data.prepare.contour_length = 14
  c.data.prepare.num_images = 200_000
  cosine_epochs(c, batch_size=64, steps_per_epoch=2500, epochs=200, learning_rate=1e-3)  # 500k steps
  c.optimizer.grad_clip_norm = 1.0


TASKS = {"listops": listops, "text": text, "retrieval": retrieval, "image": image, "pathfinder": pathfinder,
         "pathx": pathx}


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  if task not in TASKS:
    raise ValueError(f"protocol 'lra' has no config for task {task!r}; it has: {', '.join(sorted(TASKS))}")
  c = base_config()
  c.task = task
  TASKS[task](c)
  return c
