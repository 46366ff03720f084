"""Causal self-pretraining (next-token prediction, for causal models; ``_pretraining`` has what both SPT
objectives share): the label of position t is the token (float pixels: the value) at t + 1, for every t whose
next position is real; the inputs are unchanged. The model's layer must run causal
(``model.attention_kwargs.causal=True``) and it pools without a CLS vector (the first position, which a causal
model tells nothing of the sequence).

Difference from the paper's code: for causal pixels the last position has no label (theirs is trained to
predict 0 there).

BatchNorm (``model.norm=batch``: the s4, s5, lru and mega-image recipes) is not causal in training mode: its
batch statistics average every position of every example, so position t's output depends on the tokens after
t, each with weight about 1/(B·L) (B·L real positions in the batch), and a next-token objective can draw on
that. Evaluation uses the running averages, which see no future token; to train without the leak, pretrain with
``--set model.norm=layer``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

import attention_zoo
import tasks as tasks_lib
from lra_bench.errors import ConfigError
from lra_bench.training import models
from lra_bench.training.objectives.base import register
from lra_bench.training.objectives._pretraining import Pretraining
from lra_bench.training.values import fail


def next_targets(x: jax.Array, pixels: bool) -> tuple[jax.Array, jax.Array]:
  """(targets, weights) of next-token prediction: position t predicts x[t + 1] where that is a real
  position (tokens: not padding; the last position never)."""
  following = jnp.concatenate([x[:, 1:], jnp.zeros_like(x[:, :1])], axis=1)
  real = jnp.concatenate([jnp.ones_like(x[:, 1:], bool) if pixels else x[:, 1:] > 0,
                          jnp.zeros_like(x[:, :1], bool)], axis=1)
  if pixels:
    return following.astype(jnp.float32), real.astype(jnp.float32)
  return jnp.where(real, following, tasks_lib.base.IGNORE), real


@register
class CausalPretraining(Pretraining):
  name = "causal"

  def transform_input(self, batch, name, j, count, key, mask_id):
    x = batch[name]
    targets, weights = next_targets(x, self.pixels)
    return {name: x}, targets, weights

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """No mask rate; a layer that runs causal (set so), pooled without CLS."""
    super().validate(config)
    if "mask_rate" in config.pretrain:
      fail("pretrain.mask_rate", config.pretrain.mask_rate, "no value: causal pretraining masks nothing")
    name = config.model.attention
    if config.model.attention_kwargs.get("causal") is not True:
      problem = _causal_form_problem(config, force=True)
      if problem:
        raise ConfigError(f"{name!r} has no causal form, so it cannot do causal SPT ({problem}); use "
                          "--pretrain masked")
      fail("model.attention_kwargs.causal", config.model.attention_kwargs.get("causal"),
           "True: causal SPT trains a causal model (add --set model.attention_kwargs.causal=True), or use "
           "--pretrain masked")
    problem = _causal_form_problem(config)
    if problem:
      raise ConfigError(f"{name!r} has no causal form, so it cannot do causal SPT ({problem}); use "
                        "--pretrain masked")
    if config.model.pooling == "CLS":
      fail("model.pooling", "CLS", "MEAN, SUM or MAX with causal SPT: the CLS vector is the first position, "
           "so a causal model gives it nothing of the sequence")


def _causal_form_problem(config: ml_collections.ConfigDict, force: bool = False) -> str | None:
  """Why the config's layer cannot run causal (None if it can); ``force``: as if it were set causal."""
  if force:
    config = ml_collections.ConfigDict(config.to_dict())
    try:
      attention_zoo.layer_config(config.model.attention, **{**config.model.attention_kwargs.to_dict(),
                                                            "causal": True})
    except (TypeError, ValueError) as err:
      return str(err).splitlines()[0]
    config.model.attention_kwargs.causal = True
  return models.causal_form_problem(config)
