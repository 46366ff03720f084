"""The recall tasks sized for a laptop CPU: minutes per cell, with the settings where the published
results separate exact attention from bounded-state mixers.

``mqar``: Zoology's MQAR generator and model (``configs/zoology.py``: vocabulary 8192, 2 attention-only
layers, one head, tied embeddings, AdamW with weight decay 0.1, cosine schedule) at its cheapest width,
d_model 64, and its two shortest settings, (L, kv) = (64, 4) and (128, 8) — the settings where Zoology's
Fig. 2 puts attention at 100 % and the gated convolutions at 18-77 % — with fewer examples and steps
(the calibration below) and two learning rates of the paper's four (the two the attention runs needed).

Calibration (this project's 2-core CPU): see docs/recall.md; the numbers there are measured with the
commands it lists.

  lra-bench data prepare mqar --protocol recall_cpu
  lra-bench suite --protocol recall_cpu --tasks mqar --attentions vanilla,local --results_dir results/recall_cpu
"""

from __future__ import annotations

import ml_collections

from configs import lra
from configs.zoology import VOCAB, adamw, mqar_data, recall_model

TRAIN, TEST = 20_000, 1_000
BATCH = 64
STEPS = 1_500
LENGTHS = ((64, 4), (128, 8))
LEARNING_RATES = (2.15e-3, 1e-2)  # Zoology's two largest (logspace(-4, -2, 4))


def mqar(c: ml_collections.ConfigDict) -> None:
  length, kv = LENGTHS[0]
  mqar_data(c, length, kv, TRAIN, TEST, vocab=VOCAB)
  c.batch_size = BATCH
  recall_model(c, width=64, layers=2, heads=1, mlp=False)
  adamw(c, LEARNING_RATES[0], 0.1)
  c.optimizer.schedule = "constant * cosine_decay"
  c.optimizer.warmup_steps = 0
  c.num_train_steps = STEPS
  c.optimizer.steps_per_cycle = STEPS
  c.eval_every = STEPS // 3
  c.checkpoint_every = STEPS // 3
  c.log_every = 100


TASKS = {"mqar": mqar}


def sweep(task: str) -> dict[str, list[dict]]:
  if task != "mqar":
    return {}
  points = []
  for length, kv in LENGTHS:
    name = f"L{length}_kv{kv}_n{TRAIN}"
    points.append({"data.prepare.seq_len": length, "data.prepare.num_kv_pairs": kv, "data.max_length": length,
                   "data.options.name": name, "data.prepare.name": name})
  return {"L": points, "lr": [{"optimizer.learning_rate": lr} for lr in LEARNING_RATES]}


def get_config(task: str = "mqar") -> ml_collections.ConfigDict:
  if task not in TASKS:
    raise ValueError(f"protocol 'recall_cpu' has no config for task {task!r}; it has: "
                     f"{', '.join(sorted(TASKS))}")
  c = lra.base_config()
  c.protocol = "recall_cpu"
  c.task = task
  TASKS[task](c)
  return c
