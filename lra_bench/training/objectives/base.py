"""The objective interface (``Objective``), the table of objectives (``register``, ``objective_class``,
``names``) and the loss terms most objectives share (``per_label``). The package (``training.objectives``)
picks one; the objective modules derive from ``Objective`` here (they import this module, never the package,
so the package can import them).
"""

from __future__ import annotations

from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
import optax

import tasks as tasks_lib

TRAIN, PRETRAIN = "train", "pretrain"  # the phases (the package docstring)
Terms = tuple[jax.Array, jax.Array, jax.Array]  # (loss, correct, weight), each shaped like the label slots


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def labelled(targets: jax.Array) -> jax.Array:
  """float32 1 where ``targets`` holds a label: every example of a classification batch ([B]); the
  slots ``>= 0`` of a next-token batch ([B, Q]; ``tasks.base.IGNORE`` marks an unused slot)."""
  return (targets >= 0).astype(jnp.float32)


def per_label(logits: jax.Array, targets: jax.Array) -> Terms:
  """(cross-entropy, correct, weight) per label slot, shaped like ``targets``; unused slots weigh 0
  (their target is replaced by 0 so the cross-entropy stays finite, then weighted out)."""
  weight = labelled(targets)
  safe = jnp.where(targets >= 0, targets, 0)
  correct = (jnp.argmax(logits, -1) == safe).astype(jnp.float32)
  return cross_entropy(logits, safe), correct, weight


class Objective:
  """One objective of one phase for a config and its task (the package docstring). A subclass sets ``name`` and
  ``phase``, builds its model and, where the defaults do not fit, transforms batches, scores outputs, counts
  classes and checks its config."""

  name: ClassVar[str]
  phase: ClassVar[str]
  indexed: ClassVar[bool] = False  # its batches carry ``index``, each example's position in its split

  def __init__(self, config: ml_collections.ConfigDict, task: tasks_lib.Task):
    self.config, self.task = config, task

  def create_model(self, vocab_size: int | None = None):
    """The model; ``vocab_size`` is the data's (``Examples.vocab_size``) where the data decides it, else
    the task's."""
    raise NotImplementedError

  def batch_transform(self, vocab_size: int | None = None) -> Callable[[dict, jax.Array], dict] | None:
    """``prepare(batch, key) -> batch`` (pure, jittable), or None: the task's batches as they are."""
    return None

  def eval_key(self) -> jax.Array | None:
    """The key every evaluation's ``prepare`` draws from (None without a transform)."""
    return None

  def terms(self, outputs: jax.Array, batch: dict[str, jax.Array]) -> Terms:
    """(loss, correct, weight) per label slot of ``batch``: by default the cross-entropy of ``outputs``
    (logits) at the labels of ``batch["targets"]`` (``per_label``)."""
    return per_label(outputs, batch["targets"])

  def macro_classes(self, vocab_size: int | None = None) -> int:
    """The classes the evaluation counts one by one (``steps.eval_step``'s ``num_classes``) when the task's
    metric is ``macro``; 0: the task's metric needs no per-class counts."""
    return 0

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """Raises ``ConfigError`` (one line) unless ``config`` can train this objective."""

  @classmethod
  def complete(cls, config: ml_collections.ConfigDict) -> None:
    """Fills in the defaults of this objective's keys in its config section (unlocked by the caller)."""


_OBJECTIVES: dict[tuple[str, str], type[Objective]] = {}


def register(cls: type[Objective]) -> type[Objective]:
  """Class decorator: ``cls`` is the objective ``cls.name`` of phase ``cls.phase``."""
  _OBJECTIVES[(cls.phase, cls.name)] = cls
  return cls


def names(phase: str) -> tuple[str, ...]:
  """The objectives of ``phase``, in the order the package imports their modules."""
  return tuple(name for p, name in _OBJECTIVES if p == phase)


def objective_class(phase: str, name: str) -> type[Objective] | None:
  return _OBJECTIVES.get((phase, name))
