"""Classification, the LRA tasks' objective: one label per example (``targets`` int32 [B] in
``[0, num_classes)``); the encoder's outputs are pooled and classified by ``models.Classifier`` (two-input
tasks: one encoder, the head over [u, v, u·v, u − v]). The loss is the cross-entropy of the logits at the
label, the metric the share of examples classified right (``Objective.terms``)."""

from __future__ import annotations

from lra_bench.training import models, steps
from lra_bench.training.objectives.base import TRAIN, Objective, register


@register
class Classification(Objective):
  name, phase = "classification", TRAIN

  def create_model(self, vocab_size: int | None = None):
    return models.Classifier(self.config.model, vocab_size or self.task.vocab_size, self.task.num_classes,
                             self.task.dual_input, dtype=steps.compute_dtype(self.config))

  def macro_classes(self, vocab_size: int | None = None) -> int:
    """A macro metric averages over the classifier's classes."""
    return self.task.num_classes if self.task.metric == "macro" else 0
