"""The CPU study protocol: what `./run_all.sh` runs by default on a laptop (2 cores, every registered
attention, 15 min 37 s with the scaling benchmark on a fresh clone, measured before the twelve modern layers;
27 min on a slower host; docs/cpu_protocol.md).
Unlike ``smoke`` (the plumbing check: a minute per cell, accuracies that mean nothing), its accuracies
are meant to be read: on ListOps the exact Transformer ends well above the majority class and far above
a model that cannot use token order.

Calibration (measured on this project's 2-core CPU, seed 0, 2000 test examples, majority class 16.2 %;
docs/cpu_protocol.md has the commands and the curves):

- ``vanilla`` 32.0 % [30.0, 34.1] after 100 steps of batch 32 (0.4 epochs of 8000 expressions; majority
  class 15.25 %), 10-15 steps/s, about 25 s per cell with compilation; with 200 steps it reached 36.0 %,
  but 46 cells of 200 steps took twice the suite's share of the 20-minute budget (the slowest cores at
  L = 128 are the ones with 256 features or landmarks: skyformer 0.7 steps/s, performer 4.9);
- a broken core that returns the mean of the values at every query (a bag of tokens: it cannot see the
  order) 21.6 % [19.9, 23.5] with the same budget: the learning-regression test
  (tests/test_learning.py) sits between the two (the Wilson lower bound must clear majority + 10
  points, the issue's bar).

Pathfinder is not in this protocol: on this CPU no faithful Pathfinder variant left chance within the
budget (measured learning curves in docs/cpu_protocol.md): 32x32 contour-6 images with batch 32 stay at
50 % after 250 steps (0.5 steps/s), and 16x16 (the 32x32 images max-pooled) after 1500 steps. A
Pathfinder cell here would cost 46 cells of budget to print chance. ``smoke`` keeps its Pathfinder
plumbing cell. Text, Retrieval and Image run at the ``smoke`` sizes where their data exist.

  lra-bench data prepare listops --protocol cpu
  lra-bench train --task listops --attention vanilla --protocol cpu --workdir runs/cpu_listops
"""

from __future__ import annotations

import ml_collections

from configs import _sequence_models

from configs import smoke

TEST_EXAMPLES = 2000   # Wilson 95 % half-width <= 2.2 points: a 5-point difference is visible


def listops(c: ml_collections.ConfigDict) -> None:
  """smoke's ListOps (max_length 128), more data and steps."""
  # Expressions of 11..127 tokens (the LRA generator, shorter bound) in their own files
  # (<data_dir>/listops-1000/cpu_*.tsv): 8000 train, 500 validation, 2000 test, 8 s to make.
  c.data.options.name = "cpu"
  c.data.prepare.name = "cpu"
  c.data.prepare.num_train = 8000
  c.data.prepare.num_val = 500
  c.data.prepare.num_test = TEST_EXAMPLES
  c.batch_size = 32
  c.num_train_steps = 100
  c.optimizer.warmup_steps = 20        # peak rate 0.05 / sqrt(20) = 0.011 (rsqrt schedule of LRA ListOps)
  # One validation (the full 500) and one checkpoint, at the end: the test split is then evaluated once,
  # with the last parameters (an earlier validation picked an earlier step for a third of the cores and
  # cost a second test pass: seconds per cell of a 20-minute budget for 46 cells).
  c.eval_every = 100
  c.log_every = 50
  c.checkpoint_every = 100


TASKS = {"listops": listops, "text": smoke.text, "retrieval": smoke.retrieval, "image": smoke.image}
EXCLUDED = {
    "pathfinder": "no faithful Pathfinder variant learns within a CPU cell's budget (docs/cpu_protocol.md); "
                  "use --protocol smoke for the plumbing cell or lra on an accelerator",
    "pathx": "Path-X has 16K tokens per example: too long for a CPU cell",
}


# The modern layers that train faster on a CPU in their token-by-token form (``mode="recurrent"``, a
# ``lax.scan``; the same function as the default chunked form, which is the one for accelerators: 4-28x
# faster than the scan on an H200, reports/gpu_nvidia-h200/modern_layers). Chosen by the ListOps cell of this
# protocol, both forms back to back on this project's 2-core CPU, idle, one XLA thread (2026-12-04,
# `lra-bench suite --protocol cpu --tasks listops --attentions mamba2,gated_deltanet,retnet --set
# model.attention_kwargs.mode=chunk`, then `=recurrent`): cell wall time chunk / recurrent retnet 27 / 13 s,
# gated_deltanet 46 / 34 s, mamba2 31 / 67 s (so mamba2 keeps its chunked form). The layer alone, forward +
# backward at this protocol's shape (batch 32, 128 tokens, width 32, bidirectional; `lra-bench bench --mode
# core --lengths 128 --batch_size 32 --set model.emb_dim=32 --set model.qkv_dim=32 --set model.num_heads=2
# --set model.attention_kwargs.mode=...`), chunk / recurrent time, measured 2026-12-05 with XLA's YNNPACK
# fusions off (attention_zoo/_xla_cpu.py; beside two niced trainings, one run): deltanet 9.1x, mamba 4.4x,
# retnet 3.4x, gla 2.6x, kda 2.4x, rwkv7 2.3x, rg_lru 1.54x, gated_deltanet 1.11x; the chunked form faster:
# mlstm 0.91x, rwkv6 0.88x, hgrn2 0.71x, mamba2 0.24x. (With the fusions on, 2026-12-04, idle: deltanet 14.7x,
# gla 4.9x, kda 3.7x, mamba 3.5x, retnet 3.2x, rwkv7 2.9x, hgrn2 1.85x, rg_lru 1.34x, rwkv6 1.18x,
# gated_deltanet 1.10x, mlstm 0.83x, mamba2 0.32x: hgrn2 and rwkv6 ran token by token until then.)
RECURRENT_ON_CPU = frozenset({"gated_deltanet", "gla", "deltanet", "rwkv7", "mamba", "rg_lru", "kda", "retnet"})


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  """A sequence mixer whose default runs one way (``lru``) runs bidirectional here, as every attention
  of this encoder sees the whole sequence (and the CLS vector, the first position, needs it); the modern
  layers of ``RECURRENT_ON_CPU`` run their token-by-token form, the faster one on a CPU."""
  settings = _sequence_models.encoder_settings(config)
  if config.model.attention in RECURRENT_ON_CPU:
    settings["model.attention_kwargs.mode"] = "recurrent"
  return settings


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  if task in EXCLUDED:
    raise ValueError(f"protocol 'cpu' has no config for task {task!r}: {EXCLUDED[task]}")
  c = smoke.get_config(task)
  c.protocol = "cpu"
  TASKS[task](c)
  return c
