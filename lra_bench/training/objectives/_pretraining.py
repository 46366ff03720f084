"""What the two self-pretraining objectives share (``masked_pretraining``, ``causal_pretraining``): the
``pretrain`` config section, the ``Pretrainer`` model, the transform's frame and the L1 terms of float pixels.

Self-pretraining (SPT; Amos, Berant & Gupta, "Never Train from Scratch: Fair Comparison of Long-Sequence Models
Requires Data-Driven Priors", ICLR 2024; their code: IdoAmos/not-from-scratch) trains the encoder on the task's
own training inputs before the classifier is fine-tuned from it (the two runs: ``training.pretrain``).

The section (``--pretrain masked`` is ``--set pretrain.objective=masked``; ``complete`` fills in what is not
given, ``validate`` checks it, each objective its own keys):

- ``objective``: ``masked`` (denoising, for bidirectional models) or ``causal`` (next-token prediction, for
  causal models); ``none`` removes the section (a run from scratch, whose config is the preset's);
- ``mask_rate`` (masked only, ``masked_pretraining.MASK_RATES``);
- ``num_train_steps``: the pretraining's steps (default: the fine-tuning's ``num_train_steps``).

What a pretraining batch holds (the classification label never enters it: the transform replaces
``targets``): the inputs as the objective changes them, ``targets`` [B, T·n] over the n inputs' positions
(token ids with ``tasks.base.IGNORE`` where there is no label; float pixel values, with ``target_weights``, for
``model.input_kind=pixels``), and the batch's ``weights`` if it had them. Tokens are scored by their
cross-entropy over the task's vocabulary, float pixels by the L1 error of the predicted value (the paper's
default ``lm_loss: l1``), "correct" within half an intensity level.

Every evaluation transforms an example the same way (its key is folded from ``seed`` and the example's index in
its split), and a training step's from its step key, so a resumed run is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

import tasks as tasks_lib
from lra_bench.errors import ConfigError
from lra_bench.training import models, steps
from lra_bench.training.objectives.base import PRETRAIN, Objective, Terms, names, objective_class, per_label
from lra_bench.training.values import INT, check_number, fail

SECTION = "pretrain"
KEYS = {"objective": str, "mask_rate": float, "num_train_steps": int}  # each key's type (``--set`` parses by it)
DEFAULT_OBJECTIVE = "masked"
EVAL_STREAM = 1 << 21  # fold_in of PRNGKey(seed) that evaluation's transforms draw from


def input_names(task: tasks_lib.Task) -> tuple[str, ...]:
  return ("inputs1", "inputs2") if task.dual_input else ("inputs",)


def pixel_tolerance(config: ml_collections.ConfigDict, task: tasks_lib.Task) -> float:
  """Half an intensity level in the float-pixel input's units (0 for token inputs: no regression)."""
  if config.model.get("input_kind", "tokens") != "pixels":
    return 0.0
  return 0.5 / float(task.pixel_std)


def regression_terms(predictions: jax.Array, batch: dict[str, jax.Array], tolerance: float) -> Terms:
  """(L1 error, correct, weight) per slot of a regression batch: ``targets`` float values,
  ``target_weights`` 1 where a slot is labelled; correct: within ``tolerance`` (half an intensity level in the
  model's input units)."""
  error = jnp.abs(predictions.astype(jnp.float32) - batch["targets"])
  return error, (error < tolerance).astype(jnp.float32), batch["target_weights"]


class Pretraining(Objective):
  """A self-pretraining objective: the ``Pretrainer`` model (the classifier's encoder with a prediction head
  at every position) on batches whose targets are the inputs' own tokens or pixels (module docstring). A
  subclass says what one input becomes (``transform_input``)."""

  phase = PRETRAIN
  indexed = True  # the masked objective keys each example's masks by its index (both read the same batches)

  def __init__(self, config: ml_collections.ConfigDict, task: tasks_lib.Task):
    super().__init__(config, task)
    self.pixels = config.model.get("input_kind", "tokens") == "pixels"

  def create_model(self, vocab_size: int | None = None):
    return models.Pretrainer(self.config.model, vocab_size or self.task.vocab_size, self.task.dual_input,
                             dtype=steps.compute_dtype(self.config))

  def eval_key(self) -> jax.Array:
    return jax.random.fold_in(jax.random.PRNGKey(self.config.seed), EVAL_STREAM)

  def batch_transform(self, vocab_size: int | None = None):
    """``prepare(batch, key) -> batch``: each input through ``transform_input``, the targets of all inputs
    concatenated along the length. The batch needs ``index`` [B] (``loop.Data.load`` adds it)."""
    names = input_names(self.task)
    mask_id = vocab_size or self.task.vocab_size

    def prepare(batch, key):
      out = {k: v for k, v in batch.items() if k == "weights"}
      targets, weights = [], []
      for j, name in enumerate(names):
        inputs, t, w = self.transform_input(batch, name, j, len(names), key, mask_id)
        out.update(inputs)
        targets.append(t)
        weights.append(w)
      out["targets"] = jnp.concatenate(targets, axis=1)
      if self.pixels:
        out["target_weights"] = jnp.concatenate(weights, axis=1).astype(jnp.float32)
      return out

    return prepare

  def transform_input(self, batch: dict[str, jax.Array], name: str, j: int, count: int, key: jax.Array,
                      mask_id: int) -> tuple[dict[str, jax.Array], jax.Array, jax.Array]:
    """({batch key: the model's input}, targets, weights) of input ``name``, the ``j``-th of ``count``."""
    raise NotImplementedError

  def terms(self, outputs: jax.Array, batch: dict[str, jax.Array]) -> Terms:
    """Cross-entropy over the vocabulary at the labelled positions; for float pixels, ``regression_terms``."""
    if self.pixels:
      return regression_terms(outputs, batch, pixel_tolerance(self.config, self.task))
    return per_label(outputs, batch["targets"])

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """What every pretraining needs: a classification task (a classifier to fine-tune) and its length."""
    if tasks_lib.get_task(config.task).objective != "classification":
      fail("pretrain.objective", config.pretrain.objective, f"none: task {config.task!r} is itself next-token "
           "prediction, there is no classifier to fine-tune")
    check_number("pretrain.num_train_steps", config.pretrain.num_train_steps, INT, 1, None, ">= 1")


def complete(config: ml_collections.ConfigDict) -> None:
  """Fills in the section's defaults (the objective's own keys by its ``complete``); removes the section for
  objective ``none``."""
  section = config[SECTION]
  objective = section.get("objective", DEFAULT_OBJECTIVE)
  with config.unlocked():
    if objective == "none":
      given = sorted(set(section.keys()) - {"objective"})
      if given:
        raise ConfigError(f"pretrain.objective='none' (from scratch) takes no other pretrain key; got "
                          f"pretrain.{given[0]}")
      del config[SECTION]
      return
  with section.unlocked():
    section.objective = objective
    cls = objective_class(PRETRAIN, objective)
    if cls is not None:
      cls.complete(config)
    if "num_train_steps" not in section:
      section.num_train_steps = config.num_train_steps


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError (one line: the key, the value, what is allowed) unless the section can run: its
  objective is one of ``names(PRETRAIN)``, whose checks pass."""
  objective = config[SECTION].objective
  cls = objective_class(PRETRAIN, objective)
  if cls is None:
    fail("pretrain.objective", objective, f"one of none, {', '.join(names(PRETRAIN))}")
  cls.validate(config)
