"""What a run trains for: one module per objective, each owning its model head, the transform of its batches,
its loss and metric terms and the checks of its config (docs/ARCHITECTURE.md, "Objectives").

A run trains one objective in one phase. Phase ``train``: the task's own objective (``Task.objective``):
``classification`` (the LRA tasks) or ``next_token`` (the recall tasks). Phase ``pretrain``: the
self-pretraining run that comes before a classifier is fine-tuned (``training.pretrain``), ``masked`` or
``causal`` (the config's ``pretrain.objective``). ``select(config, phase)`` is the one place that picks it; the
loop asks the objective, never the model, what to build and what to minimise:

- ``create_model(vocab_size)``: the model (``Classifier``, ``LanguageModel`` or ``Pretrainer``);
- ``batch_transform(vocab_size)``: ``prepare(batch, key) -> batch`` applied by both steps before the model sees
  a batch (the pretraining masks or the next-token shift; None: the task's batches as they are), and
  ``eval_key()``, the fixed key every evaluation transforms with;
- ``terms(outputs, batch)``: (loss, correct, weight) per label slot, which the train and eval steps sum
  (``steps.train_step`` / ``eval_step`` take them: no loss is chosen by looking at the model);
- ``macro_classes(vocab_size)``: the classes the evaluation counts one by one for a macro-metric task (0: none);
- ``indexed``: whether its batches must carry each example's index in its split (``loop.Data.load``).

Config: ``validate(config)`` runs the checks of every objective the config runs (``training.config.validate``
calls it); the optional sections the objectives own (``SECTIONS``: ``pretrain``) are filled in by ``complete``,
so ``training.config`` parses their keys without knowing them.

The interface and the table of objectives are ``objectives.base``; a new objective is one module here, a
subclass of ``Objective`` registered with ``@register``, and one import line below.
"""

from __future__ import annotations

import ml_collections

import tasks as tasks_lib
from lra_bench.training.objectives import _pretraining
from lra_bench.training.objectives.base import (PRETRAIN, TRAIN, Objective, Terms, cross_entropy, labelled, names,
                                                objective_class, per_label, register)

# The objectives, in the order messages and reports list them (each module registers its objective).
from lra_bench.training.objectives import classification, next_token  # noqa: F401
from lra_bench.training.objectives import masked_pretraining, causal_pretraining  # noqa: F401

__all__ = ["PRETRAIN", "PRETRAIN_OBJECTIVES", "SECTIONS", "TRAIN", "Objective", "Terms", "complete", "cross_entropy",
           "labelled", "names", "objective_class", "per_label", "register", "select", "validate"]

# The optional config sections the objectives own: section -> {key: type} (``training.config`` parses ``--set``s
# of their keys by these types).
SECTIONS: dict[str, dict[str, type]] = {_pretraining.SECTION: _pretraining.KEYS}
PRETRAIN_OBJECTIVES = names(PRETRAIN)  # ("masked", "causal"): the suite's --pretrain values, the report's order


def select(config: ml_collections.ConfigDict, phase: str = TRAIN) -> Objective:
  """The objective ``config`` trains in ``phase``: the task's own (``train``) or its ``pretrain.objective``
  (``pretrain``)."""
  task = tasks_lib.get_task(config.task)
  name = task.objective if phase == TRAIN else config.pretrain.objective
  cls = objective_class(phase, name)
  if cls is None:
    raise ValueError(f"no {phase} objective {name!r}; known: {', '.join(names(phase))}")
  return cls(config, task)


def validate(config: ml_collections.ConfigDict) -> None:
  """The checks of every objective ``config`` runs: the task's, then the pretraining's (with a ``pretrain``
  section)."""
  select(config, TRAIN).validate(config)
  if _pretraining.SECTION in config:
    _pretraining.validate(config)


def complete(config: ml_collections.ConfigDict) -> None:
  """Fills in the defaults of the sections ``SECTIONS`` an override added (``training.config`` calls it before
  ``validate``)."""
  if _pretraining.SECTION in config:
    _pretraining.complete(config)
