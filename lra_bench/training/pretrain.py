"""Self-pretraining (SPT): the encoder first learns the task's own training inputs, then the classifier
is fine-tuned from it (Amos, Berant & Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence
Models Requires Data-Driven Priors", ICLR 2024; their code: IdoAmos/not-from-scratch).

A run whose config has a ``pretrain`` section (``--pretrain masked`` is ``--set pretrain.objective=masked``)
trains in two stages, each a run of its own (``lra_bench.experiments.cell``): the pretraining run
(``pretrain_config``: the same config with ``pretrain.num_train_steps`` steps and ``pretrain.stage``; the
``Pretrainer`` model and the batch transform ``batch_preparer``), then the classifier, whose encoder starts
from the pretraining's best-validation parameters (``transfer``) and whose head starts fresh.

The section (``training.config`` owns it: ``complete_optional_sections`` fills in what is not given,
``validate`` checks it):

- ``objective``: ``masked`` (denoising, for bidirectional models) or ``causal`` (next-token prediction,
  for causal models: the layer must run causal, ``model.attention_kwargs.causal=True``); ``none`` removes
  the section (a run from scratch).
- ``mask_rate`` (masked only): the probability of masking each position, i.i.d. Bernoulli; the paper's
  rates by default: ListOps 10 %, Text and Retrieval 15 %, Image, Pathfinder and Path-X 50 %
  (``MASK_RATES``).
- ``num_train_steps``: the pretraining's steps (default: the fine-tuning's ``num_train_steps``).

What each objective trains on (the classification label never enters the pretraining batch: ``prepare``
replaces ``targets``):

- masked, token inputs: each real (non-padding) position is chosen with probability ``mask_rate``; its
  token is replaced by the mask id (``vocab_size``, a row the classifier's embedding does not have) and
  it is the only kind of position with a label (cross-entropy over the task's vocabulary);
- masked, float pixels (``model.input_kind=pixels``): a chosen pixel's value becomes 0 and a learned mask
  vector is added to its projection (``models.Encoder``), the paper's [x·(1 − m), m] input; the loss is
  the L1 error of the predicted value on the chosen pixels (the paper's default ``lm_loss: l1``);
- causal: the label of position t is the token (pixel value) at t + 1, for every t whose next position
  is real.

Every evaluation masks an example the same way (its key is folded from ``seed`` and the example's index
in its split), and a training step's masks come from its step key, so a resumed run is exact.

Differences from the paper's code (``src/dataloaders/base.py`` ``MaskedSequenceDatasetWrapper.mask``,
``lra.py`` ``MaskedListOps``, ``configs/experiment/lra/*-mlm.yaml``):

- the mask id: theirs multiplies a masked token id by 0, i.e. replaces it by id 0, ``<pad>`` (their
  Transformer does not mask padding out of attention, so it still sees the position); our encoder masks
  id 0 out of every attention (padding), so a masked token gets its own id instead;
- pixel tasks with token inputs (LRA's default, intensity tokens 1..256): masked as tokens (the paper's
  ``lm_loss: ce`` option, 256-way cross-entropy) rather than L1;
- causal pixels: the last position has no label (theirs is trained to predict 0 there);
- the pretraining's learning rate, schedule and batch are the protocol's (theirs were tuned per task on a
  small grid: lr 1e-3, 5e-4, 1e-4 × batch 8, 32, 128) and its length is ``num_train_steps`` rather than
  up to 200 epochs or 24 hours;
- the checkpoint kept is the best masked-position accuracy on the validation split (theirs: the best of
  ``val/accuracy_ignore_m100``, the same quantity); span masking and nesting-level tags (unused in the
  paper's LRA results) are not implemented.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import tasks as tasks_lib
from lra_bench.errors import ConfigError
from lra_bench.training import config as config_lib
from lra_bench.training import models, steps

OBJECTIVES = config_lib.PRETRAIN_OBJECTIVES
MASK_RATES = config_lib.MASK_RATES
EVAL_STREAM = 1 << 21     # fold_in of PRNGKey(seed) that evaluation masks come from


def objective(config: ml_collections.ConfigDict) -> str:
  """``none`` (from scratch), ``masked`` or ``causal``."""
  return config.pretrain.objective if "pretrain" in config else "none"


def pretrain_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The pretraining run's config: ``config`` with ``num_train_steps = pretrain.num_train_steps`` (so
  fine-tuning settings that the pretraining does not read, its length above all, leave the pretraining
  and its hash unchanged, and one pretraining serves them all) and ``pretrain.stage = "pretrain"``."""
  pre = ml_collections.ConfigDict(config.to_dict())
  pre.num_train_steps = config.pretrain.num_train_steps
  pre.pretrain.stage = "pretrain"  # its hash is never a fine-tuning's, even where every other key agrees
  pre.lock()
  return pre


def pixel_tolerance(config: ml_collections.ConfigDict, task: tasks_lib.Task) -> float:
  """Half an intensity level in the float-pixel input's units (0 for token inputs: no regression)."""
  if config.model.get("input_kind", "tokens") != "pixels":
    return 0.0
  return 0.5 / float(task.pixel_std)


def create_model(config: ml_collections.ConfigDict, task: tasks_lib.Task, vocab_size: int | None = None):
  """The pretraining model (``models.Pretrainer``) of ``task`` under ``config``."""
  return models.Pretrainer(config.model, vocab_size or task.vocab_size, task.dual_input,
                           pixel_tolerance(config, task), dtype=steps.compute_dtype(config))


def input_names(task: tasks_lib.Task) -> tuple[str, ...]:
  return ("inputs1", "inputs2") if task.dual_input else ("inputs",)


def batch_preparer(config: ml_collections.ConfigDict, task: tasks_lib.Task, vocab_size: int | None = None):
  """``prepare(batch, key) -> batch`` (pure, jittable): the pretraining batch of a task batch.

  The batch needs ``index`` [B] (the example's index in its split: ``Data.load`` adds it); each row's
  masks come from fold_in(key, index) (two-input tasks: fold_in(key, 2·index + j)). The result holds the
  masked inputs, ``targets`` [B, T·n] (token ids, or pixel values with ``target_weights``) and the batch's
  ``weights`` if it had them; the class label is dropped.
  """
  kind = objective(config)
  pixels = config.model.get("input_kind", "tokens") == "pixels"
  rate = float(config.pretrain.get("mask_rate", 0.0))
  mask_id = vocab_size or task.vocab_size
  names = input_names(task)

  def row_keys(key, index, j):
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(index.astype(jnp.uint32) * len(names) + j)

  def prepare(batch, key):
    out = {k: v for k, v in batch.items() if k == "weights"}
    targets, weights = [], []
    for j, name in enumerate(names):
      x = batch[name]
      if kind == "causal":
        t, w = next_targets(x, pixels)
        out[name] = x
      else:
        chosen = jax.vmap(lambda k, row: jax.random.bernoulli(k, rate, row.shape))(
            row_keys(key, batch["index"], j), x)
        if pixels:
          out[name], out[f"{name}_pixel_mask"] = jnp.where(chosen, 0.0, x).astype(x.dtype), chosen
          t, w = x.astype(jnp.float32), chosen.astype(jnp.float32)
        else:
          chosen = chosen & (x > 0)  # padding is never masked nor predicted
          out[name] = jnp.where(chosen, mask_id, x).astype(x.dtype)
          t, w = jnp.where(chosen, x, tasks_lib.base.IGNORE), chosen
      targets.append(t)
      weights.append(w)
    out["targets"] = jnp.concatenate(targets, axis=1)
    if pixels:
      out["target_weights"] = jnp.concatenate(weights, axis=1).astype(jnp.float32)
    return out

  return prepare


def next_targets(x: jax.Array, pixels: bool) -> tuple[jax.Array, jax.Array]:
  """(targets, weights) of next-token prediction: position t predicts x[t + 1] where that is a real
  position (tokens: not padding; the last position never)."""
  following = jnp.concatenate([x[:, 1:], jnp.zeros_like(x[:, :1])], axis=1)
  real = jnp.concatenate([jnp.ones_like(x[:, 1:], bool) if pixels else x[:, 1:] > 0,
                          jnp.zeros_like(x[:, :1], bool)], axis=1)
  if pixels:
    return following.astype(jnp.float32), real.astype(jnp.float32)
  return jnp.where(real, following, tasks_lib.base.IGNORE), real


def eval_key(config: ml_collections.ConfigDict) -> jax.Array:
  """The key every evaluation of the pretraining masks with (fixed: the same masks each time)."""
  return jax.random.fold_in(jax.random.PRNGKey(config.seed), EVAL_STREAM)


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
    example["index"] = np.zeros([2], np.int32)
    task = tasks_lib.get_task(pre_config.task)
    return load_pretrained(pre_config, pre_workdir, best_step, task, run.data.examples["train"].vocab_size,
                           example)
  return init_from


def load_pretrained(pre_config: ml_collections.ConfigDict, pre_workdir: str, best_step: int, task, vocab_size,
                    example: dict[str, np.ndarray]) -> dict[str, Any]:
  """The pretraining run's best-validation ``{params, model_state}`` (host arrays), read from its
  checkpoints (``CheckpointError`` naming the directory if they cannot be read). ``example``: a batch of
  the task with ``index`` (only its shapes are used)."""
  from lra_bench.training import optim
  from lra_bench.training.checkpoints import Checkpoints

  model = create_model(pre_config, task, vocab_size)
  prepared = jax.tree.map(np.asarray, jax.jit(batch_preparer(pre_config, task, vocab_size))(
      example, eval_key(pre_config)))
  abstract = jax.eval_shape(steps.state_initializer(pre_config, model, optim.make_optimizer(pre_config.optimizer),
                                                    prepared))
  checkpoints = Checkpoints(pre_workdir, pre_config)
  restored = checkpoints.restore_best(abstract, best_step)
  if restored is None:
    raise ConfigError(f"the pretraining run in {pre_workdir} saved no best checkpoint (step {best_step}); rerun "
                      "it with --force")
  logging.info("loaded the pretrained parameters of step %d from %s", best_step, checkpoints.root)
  return restored
