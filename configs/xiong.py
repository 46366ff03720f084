"""The Xiong et al. protocol (Nyströmformer; reused by Skyformer and xformers): one small model for
every task — 2 layers, 64-dim, 2 heads of 32, FFN 128, mean pooling, learned positions, AdamW at 1e-4
with linear warm-up and linear decay, no weight decay.

Source: mlpen/Nystromformer ``LRA/code/lra_config.py`` (its model and training blocks, read 2026;
summarised in docs/lra_protocol.md §6). Path-X is not in that protocol; it gets the Pathfinder training
settings at 16K here.
Evaluation covers the full validation split (the original ran a fixed number of eval batches), and the
data keep the task lengths (the original padded max_seq_len up to a power of 2: 2048, 4096).

  lra-bench train --task text --attention vanilla --protocol xiong --workdir runs/text_xiong
"""

from __future__ import annotations

import ml_collections

from configs import lra

LINEAR = "constant * linear_warmup * linear_decay"   # torch OneCycleLR(anneal_strategy="linear")

# task: (max_length, batch_size, warmup, num_train_steps, eval_every) from lra_config.py
TRAINING = {
    "listops": (2000, 32, 1000, 5000, 50),
    "text": (4000, 32, 8000, 20_000, 500),
    "retrieval": (4000, 32, 800, 30_000, 300),
    "image": (1024, 256, 175, 35_000, 175),
    "pathfinder": (1024, 256, 312, 62_400, 312),
    "pathx": (128 * 128, 256, 312, 62_400, 312),   # not in the protocol: Pathfinder's settings
}


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  c.protocol = "xiong"
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.emb_dim = 64
  c.model.qkv_dim = 64                  # 2 heads x head_dim 32
  c.model.mlp_dim = 128
  c.model.dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.pooling = "MEAN"
  c.model.positions = "learned"         # learn_pos_emb=True
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
  return c
