"""The Mega recipe (Ma et al. 2023, Table 8; facebookresearch/mega ``examples/mega/README.lra.md``), run
with the ``mega`` mixer (``mega_chunk``: the same with chunks of 128 tokens, 4096 on Path-X).

Mega blocks (gated EMA attention, then a SiLU FFN), post-norm LayerNorm / ScaleNorm on the text tasks
and pre-norm BatchNorm on the image tasks, mean pooling; Adam β = (0.9, 0.98), gradient clipping at 1,
linear decay; every parameter alike (no SSM learning rate).

  lra-bench train --protocol mega --task listops --workdir runs/mega_listops      # mega by default
  lra-bench train --protocol mega --task listops --attention mega_chunk --workdir runs/mega_chunk_listops
"""

from __future__ import annotations

import ml_collections

from configs import _sequence_models as seq
from configs import lra

MIXER = "mega"
# task: (depth, d, FFN, z, v, attention fn, norm, prenorm, batch, lr, dropout, wd, epochs) from Table 8.
RECIPE = {
    "listops": (6, 80, 160, 64, 160, "softmax", "layer", False, 64, 1e-3, 0.1, 0.01, 60),
    "text": (4, 128, 256, 64, 256, "softmax", "scale", False, 50, 4e-3, 0.1, 0.01, 50),
    "retrieval": (6, 128, 256, 64, 256, "softmax", "scale", False, 64, 3e-3, 0.1, 0.04, 40),
    "image": (8, 160, 320, 96, 320, "laplace", "batch", True, 50, 0.01, 0.0, 0.02, 200),
    "pathfinder": (6, 128, 256, 64, 256, "laplace", "batch", True, 128, 0.01, 0.0, 0.01, 200),
    "pathx": (4, 64, 128, 32, 128, "laplace", "batch", True, 128, 0.01, 0.0, 0.01, 100),
}
CHUNK = {"pathx": 4096}     # Mega-chunk: c = 128, 4096 on Path-X
# Warm-up: not in the notes this preset was built from; 10 % of the steps, linear, then linear decay.
WARMUP_FRACTION = 0.1

PUBLISHED_DIFFERENCES = {
    "mega": ("warm-up (10 % of the steps) and the positional encoding (none; the relative bias orders "
             "the tokens) are this preset's choices; the EMA kernels run the full length (the recipe "
             "truncates them, at 1024 tokens, 4096 on Path-X); padding masked in the EMA and in BatchNorm"),
    "mega_chunk": ("as mega, with chunks of 128 tokens (4096 on Path-X)"),
}


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  if config.model.attention not in ("mega", "mega_chunk"):
    return {}
  _, _, _, z, v, fn, *_ = RECIPE[config.task]
  kwargs = {"z_dim": z, "hidden_dim": v, "ema_dim": 16, "attention_fn": fn, "bidirectional": True,
            "max_positions": config.data.max_length,
            "attention_dropout_rate": 0.0 if config.task in seq.PIXEL_TASKS else 0.1,
            "hidden_dropout_rate": 0.0 if config.task in seq.PIXEL_TASKS else 0.1}
  if config.model.attention == "mega_chunk":
    kwargs["chunk_size"] = CHUNK.get(config.task, 128)
  return {f"model.attention_kwargs.{k}": val for k, val in kwargs.items()}


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  c.protocol = "mega"
  depth, d, ffn, _, _, _, norm, prenorm, batch, lr, dropout, wd, epochs = RECIPE[task]
  seq.mixer_model(c, task, mixer=MIXER, layers=depth, width=d, norm=norm, prenorm=prenorm, dropout=dropout,
                  mlp=ffn, head="mlp", mlp_activation="silu")
  total = seq.steps(task, batch, epochs)
  c.batch_size = batch
  c.num_train_steps = total
  c.optimizer.learning_rate = lr
  c.optimizer.schedule = "constant * linear_warmup * linear_decay"
  c.optimizer.warmup_steps = int(total * WARMUP_FRACTION)
  c.optimizer.steps_per_cycle = total
  c.optimizer.weight_decay = wd
  c.optimizer.b1, c.optimizer.b2 = 0.9, 0.98
  c.optimizer.eps = 1e-8
  c.optimizer.grad_clip_norm = 1.0
  seq.evaluation(c, task, batch)
  return c
