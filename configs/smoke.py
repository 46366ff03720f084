"""The smoke protocol: the LRA configs shrunk until a run takes about a minute on 2 CPU cores.

It proves the plumbing (data -> model -> train -> eval -> record); its accuracies are not LRA results.

  lra-bench data prepare listops --protocol smoke
  lra-bench train --task listops --attention vanilla --protocol smoke --workdir runs/smoke_listops
"""

from __future__ import annotations

import ml_collections

from configs import lra


def shrink(c: ml_collections.ConfigDict) -> None:
  """Tiny model and schedule shared by every task."""
  c.protocol = "smoke"
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.emb_dim = 32
  c.model.qkv_dim = 32
  c.model.mlp_dim = 64
  c.batch_size = 16
  # run_all.sh trains every attention on every task with data in ~20 min on 2 CPU cores: compiling
  # (init, train and eval steps) dominates a cell, so the steps are few.
  c.num_train_steps = 100
  c.optimizer.warmup_steps = 25
  c.eval_every = 50
  c.log_every = 20
  c.checkpoint_every = 50


def listops(c: ml_collections.ConfigDict) -> None:
  # Short expressions (11..127 tokens) in their own files next to the real ones.
  c.data.max_length = 128
  c.data.options.name = "smoke"
  c.data.prepare.name = "smoke"
  c.data.prepare.num_train = 2000
  c.data.prepare.num_val = 200
  c.data.prepare.num_test = 200
  c.data.prepare.min_length = 10
  c.data.prepare.max_length = 128


TASKS = {"listops": listops}


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  shrink(c)
  if task in TASKS:
    TASKS[task](c)
  return c
