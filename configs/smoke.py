"""The smoke protocol: the LRA configs shrunk until a run takes about a minute on 2 CPU cores.

It proves the plumbing (data -> model -> train -> eval -> record); its accuracies are not LRA results.

  lra-bench data prepare listops --protocol smoke
  lra-bench train --task listops --attention vanilla --protocol smoke --workdir runs/smoke_listops
"""

from __future__ import annotations

import ml_collections

from configs import _sequence_models

from configs import lra


def shrink(c: ml_collections.ConfigDict) -> None:
  """Tiny model and schedule shared by every task."""
  c.protocol = "smoke"
  # float32 on every backend: a plumbing check whose numbers (and the learning tests' bars, tests/test_learning.py)
  # were made in float32 on a CPU; the cpu protocol inherits it (docs/cpu_protocol.md's calibration)
  c.precision = "float32"
  c.model.num_layers = 2
  c.model.num_heads = 2
  c.model.emb_dim = 32
  c.model.qkv_dim = 32
  c.model.mlp_dim = 64
  c.batch_size = 16
  # No dropout: 60 steps cannot overfit, and on a CPU the dropout masks (threefry bits for up to 9
  # sites) doubled the step time and added ~1.5 s of compile to every cell. Each core's dropout path is
  # checked by the conformance kit (`dropout_unbiased`); the `lra` protocol keeps the LRA rates.
  c.model.dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  # run_all.sh trains every registered attention (45) on every task with data within its 20-minute
  # budget on 2 CPU cores: compiling (init, train and eval steps) dominates a cell, so the steps are few
  # (100 steps took the whole run to 22.5 min).
  c.num_train_steps = 60
  c.optimizer.warmup_steps = 15
  c.eval_every = 30
  c.log_every = 20
  c.checkpoint_every = 30


def listops(c: ml_collections.ConfigDict) -> None:
  # Short expressions (11..127 tokens) in their own files next to the real ones.
  c.data.max_length = 128
  c.data.options.name = "smoke"
  c.data.prepare.name = "smoke"
  c.data.prepare.num_train = 2000
  c.data.prepare.num_val = 200
  c.data.prepare.num_test = 200
  c.data.prepare.min_length = 10
  c.data.prepare.max_expression_length = 128


def text(c: ml_collections.ConfigDict) -> None:
  c.data.max_length = 256               # bytes; the first 256 of each review
  c.data.options.limit = 1000           # first 1000 examples of each split (test included)


def retrieval(c: ml_collections.ConfigDict) -> None:
  c.data.max_length = 256               # bytes per document
  c.data.options.limit = 1000


def long_inputs(c: ml_collections.ConfigDict) -> None:
  """1024-token tasks: 1 layer, 2 heads, batch 4, 20 steps keep a cell near 10 s on 2 idle cores
  (the [B, H, T, T] attention matrix dominates vanilla: 4 x 2 x 1024^2 floats)."""
  c.model.num_layers = 1
  c.model.num_heads = 2
  c.batch_size = 4
  c.num_train_steps = 20
  c.optimizer.warmup_steps = 5
  c.optimizer.steps_per_cycle = 20
  c.eval_every = 10
  c.num_eval_batches = 10               # 40 validation examples per evaluation
  c.checkpoint_every = 10
  c.log_every = 10


def image(c: ml_collections.ConfigDict) -> None:
  long_inputs(c)
  c.data.options.limit = 100            # first 100 examples of each split


def pathfinder(c: ml_collections.ConfigDict) -> None:
  long_inputs(c)
  # 2000 generated 32x32 contour-14 images (1600/200/200) in their own folder <data_dir>/smoke/;
  # the first 100 of each split are used.
  c.data.options.limit = 100
  c.data.options.name = "smoke"
  c.data.prepare.name = "smoke"
  c.data.prepare.num_images = 2000
  c.data.prepare.images_per_batch = 250


# Path-X (16K tokens) does not fit a ~20 s CPU cell: no smoke config.
TASKS = {"listops": listops, "text": text, "retrieval": retrieval, "image": image, "pathfinder": pathfinder}
EXCLUDED = {"pathx": "Path-X has 16K tokens per example: too long for the CPU smoke protocol"}


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  """A sequence mixer whose default runs one way (``lru``) runs bidirectional here, as every attention
  of this encoder sees the whole sequence (and the CLS vector, the first position, needs it)."""
  return _sequence_models.encoder_settings(config)


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  if task in EXCLUDED:
    raise ValueError(f"protocol 'smoke' has no config for task {task!r}: {EXCLUDED[task]}")
  c = lra.get_config(task)
  shrink(c)
  TASKS[task](c)
  return c
