"""Shared pieces of the sequence-model protocols (``s4``, ``s5``, ``lru``, ``mega``): the encoder
options of their recipes and epoch arithmetic. Not a protocol itself (the underscore keeps it out of
``lra-bench list protocols``)."""

from __future__ import annotations

import math

import ml_collections

from configs import lra

# Training examples per task, to turn a recipe's epochs into steps: ListOps 96k (the release), IMDB 25k,
# AAN 147,086 pairs, CIFAR-10 45k (the 50k training images less the 5k the SSM recipes hold out),
# Pathfinder / Path-X 160k (80 % of 200k, the SSM repositories' split).
TRAIN_EXAMPLES = {"listops": 96_000, "text": 25_000, "retrieval": 147_086, "image": 45_000,
                  "pathfinder": 160_000, "pathx": 160_000}
PIXEL_TASKS = ("image", "pathfinder", "pathx")
COSINE = lra.COSINE


def steps(task: str, batch_size: int, epochs: float) -> int:
  """``epochs`` passes over the task's training split at ``batch_size`` (the last batch partial)."""
  return int(round(epochs * math.ceil(TRAIN_EXAMPLES[task] / batch_size)))


def mixer_model(c: ml_collections.ConfigDict, task: str, *, mixer: str, layers: int, width: int,
                norm: str, prenorm: bool, dropout: float, tied: bool = False, mlp: int | None = None,
                head: str = "linear", mlp_activation: str | None = None) -> None:
  """An encoder of ``layers`` mixer blocks of ``width`` as the recipes build it: no positional encoding
  (the mixer orders the sequence), mean pooling, no CLS, pixels through a linear projection on the
  image tasks, ``norm`` before (``prenorm``) or after each residual, and an FFN only when ``mlp`` is given."""
  c.model.attention = mixer              # the default layer; its recipe's kwargs: the protocol's attention_settings
  c.model.num_layers = layers
  c.model.emb_dim = width
  c.model.num_heads = 1                 # unused by a mixer (validated: qkv_dim % num_heads)
  c.model.qkv_dim = width
  c.model.mlp_dim = mlp or width        # the FFN width (mlp=True), and the hidden layer of an mlp head
  c.model.mlp = mlp is not None
  c.model.dropout_rate = dropout
  c.model.attention_dropout_rate = 0.0  # unused by a mixer
  c.model.pooling = "MEAN"
  c.model.positions = "none"
  c.model.norm = norm
  c.model.norm_position = "pre" if prenorm else "post"
  c.model.head = head
  c.model.dropout_broadcast_time = tied
  if mlp_activation:
    c.model.mlp_activation = mlp_activation
  if task in PIXEL_TASKS:
    c.model.input_kind = "pixels"


def text_length(c: ml_collections.ConfigDict, task: str, length: int) -> None:
  """The recipe's IMDB length (LRA's code config, inherited from configs/lra.py, runs 1 000 bytes)."""
  if task == "text":
    c.data.max_length = length


def cosine_schedule(c: ml_collections.ConfigDict, *, learning_rate: float, total_steps: int, warmup_steps: int,
                    weight_decay: float, batch_size: int) -> None:
  """Linear warm-up to ``learning_rate`` then one cosine cycle to 0 at ``total_steps`` (the recipes'
  ``cosine_warmup``), AdamW with decoupled ``weight_decay``."""
  c.batch_size = batch_size
  c.num_train_steps = total_steps
  c.optimizer.learning_rate = learning_rate
  c.optimizer.schedule = COSINE
  c.optimizer.warmup_steps = warmup_steps
  c.optimizer.steps_per_cycle = max(1, total_steps - warmup_steps)
  c.optimizer.weight_decay = weight_decay
  c.optimizer.b2 = 0.999                # torch / optax AdamW defaults (the recipes set no betas)
  c.optimizer.eps = 1e-8
  c.optimizer.grad_clip_norm = 0.0


def evaluation(c: ml_collections.ConfigDict, task: str, batch_size: int) -> None:
  """Validate once an epoch (the recipes' checkpoint selection), checkpoint as often."""
  per_epoch = math.ceil(TRAIN_EXAMPLES[task] / batch_size)
  c.eval_every = per_epoch
  c.checkpoint_every = per_epoch
  c.log_every = max(1, min(100, per_epoch))


def kwargs_for(config: ml_collections.ConfigDict, mixer: str, kwargs: dict) -> dict:
  """``attention_settings`` of a recipe: ``kwargs`` as ``model.attention_kwargs.*`` when the chosen
  layer is the recipe's own ``mixer``; nothing for any other (its own defaults run in the recipe's
  encoder)."""
  if config.model.attention != mixer:
    return {}
  return {f"model.attention_kwargs.{k}": v for k, v in kwargs.items()}


def encoder_settings(config: ml_collections.ConfigDict) -> dict:
  """``attention_settings`` of the Transformer protocols (``cpu``, ``smoke``) for a sequence mixer with a
  one-directional default (``lru``): bidirectional, the encoder setting every attention of these protocols
  has, and the one that gives their CLS vector (the first position) the sequence at all."""
  import dataclasses

  import attention_zoo

  if config.model.pooling != "CLS":
    return {}
  try:
    layer = attention_zoo.layer_config(config.model.attention)
  except ValueError:  # an unknown name: validation reports it, with the known ones
    return {}
  fields = {f.name for f in dataclasses.fields(layer)}
  return {"model.attention_kwargs.bidirectional": True} if "bidirectional" in fields else {}
