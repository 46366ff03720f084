"""Self-pretraining (SPT) as two runs: the encoder first learns the task's own training inputs, then the
classifier is fine-tuned from it (Amos, Berant & Gupta, ICLR 2024). What the pretraining trains (its model, its
batches, its loss, its config section) is its objective's (``training.objectives``: ``masked_pretraining``,
``causal_pretraining``); this module holds what joins the two runs.

A run whose config has a ``pretrain`` section trains in two stages, each a run of its own
(``lra_bench.experiments.cell``): the pretraining run (``pretrain_config``: the same config with
``pretrain.num_train_steps`` steps and ``pretrain.stage``; trained with ``objectives.select(pre_config,
objectives.PRETRAIN)``), then the classifier, whose encoder starts from the pretraining's best-validation
parameters (``initializer`` reads them, ``transfer`` takes them) and whose head starts fresh.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lra_bench.errors import ConfigError
from lra_bench.training import objectives, steps


def pretrain_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The pretraining run's config: ``config`` with ``num_train_steps = pretrain.num_train_steps`` (so
  fine-tuning settings that the pretraining does not read, its length above all, leave the pretraining
  and its hash unchanged, and one pretraining serves them all) and ``pretrain.stage = "pretrain"``."""
  pre = ml_collections.ConfigDict(config.to_dict())
  pre.num_train_steps = config.pretrain.num_train_steps
  pre.pretrain.stage = "pretrain"  # its hash is never a fine-tuning's, even where every other key agrees
  pre.lock()
  return pre


def transfer(pretrained: Any, fresh: Any) -> tuple[Any, list[str], list[str]]:
  """(``fresh`` with every leaf that the pretrained tree has at the same path taken from it, the paths
  taken, the paths left fresh). The pretraining embedding's extra row (the mask id) is dropped; a leaf
  whose shape differs otherwise stays fresh (listed)."""
  flat_pre = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(pretrained)[0]}
  taken, kept = [], []

  def pick(path, leaf):
    key = jax.tree_util.keystr(path)
    old = flat_pre.get(key)
    if old is not None and old.shape == leaf.shape:
      taken.append(key)
      return jnp.asarray(old, leaf.dtype)
    if (old is not None and old.ndim == 2 and leaf.ndim == 2 and old.shape[1] == leaf.shape[1]
        and old.shape[0] == leaf.shape[0] + 1 and "embed" in key):
      taken.append(key)
      return jnp.asarray(old[:leaf.shape[0]], leaf.dtype)
    kept.append(key)
    return leaf

  return jax.tree_util.tree_map_with_path(pick, fresh), taken, kept


def initializer(pre_config: ml_collections.ConfigDict, pre_workdir: str, best_step: int):
  """``init_from(run)`` for ``loop.Run``: the pretraining's best parameters, read with the run's data
  shapes (``load_pretrained``)."""
  def init_from(run) -> dict[str, Any]:
    example = steps.example_batch(run.data.train.element_spec, 2)
    return load_pretrained(pre_config, pre_workdir, best_step, run.data.examples["train"].vocab_size, example)
  return init_from


def load_pretrained(pre_config: ml_collections.ConfigDict, pre_workdir: str, best_step: int,
                    vocab_size: int | None, example: dict[str, np.ndarray]) -> dict[str, Any]:
  """The pretraining run's best-validation ``{params, model_state}`` (host arrays), read from its
  checkpoints (``CheckpointError`` naming the directory if they cannot be read). ``example``: a batch of
  the task (only its shapes are used)."""
  from lra_bench.training import optim
  from lra_bench.training.checkpoints import Checkpoints

  objective = objectives.select(pre_config, objectives.PRETRAIN)
  if objective.indexed:
    example = {**example, "index": np.zeros([len(next(iter(example.values())))], np.int32)}
  model = objective.create_model(vocab_size)
  prepared = jax.tree.map(np.asarray, jax.jit(objective.batch_transform(vocab_size))(example, objective.eval_key()))
  abstract = jax.eval_shape(steps.state_initializer(pre_config, model, optim.make_optimizer(pre_config.optimizer),
                                                    prepared))
  checkpoints = Checkpoints(pre_workdir, pre_config)
  restored = checkpoints.restore_best(abstract, best_step)
  if restored is None:
    raise ConfigError(f"the pretraining run in {pre_workdir} saved no best checkpoint (step {best_step}); rerun "
                      "it with --force")
  logging.info("loaded the pretrained parameters of step %d from %s", best_step, checkpoints.root)
  return restored
