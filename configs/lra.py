"""The official LRA protocol: the per-task Transformer configs of google-research/long-range-arena.

Values are the repo's ``base_*_config.py`` plus ``transformer_base.py`` (research/lra_official.md §2);
the repo configs are authoritative over the paper appendix (maintainers, LRA issues #17/#21).

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

  c.data = ml_collections.ConfigDict()
  c.data.max_length = 2000
  c.data.shuffle_buffer = 1024          # LRA train pipelines shuffle with a 1024 buffer
  c.data.options = ml_collections.ConfigDict()   # passed to Task.examples (e.g. ListOps file name)
  c.data.prepare = ml_collections.ConfigDict()   # passed to Task.prepare by `data prepare --protocol`

  c.batch_size = 32                     # the global batch: over all devices and accumulation steps
  # Scale-out (lra_bench/parallel.py). Gradient accumulation: the batch is run as this many equal
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


TASKS = {"listops": listops}


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  if task not in TASKS:
    raise ValueError(f"protocol 'lra' has no config for task {task!r}; it has: {', '.join(sorted(TASKS))}")
  c = base_config()
  c.task = task
  TASKS[task](c)
  return c
