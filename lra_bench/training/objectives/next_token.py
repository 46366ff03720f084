"""Next-token prediction, the recall tasks' objective (``tasks.base``: ``"next_token"``): labels at chosen
positions of one causal sequence (``positions`` / ``targets`` int32 [B, Q], ``tasks.base.IGNORE`` in an unused
slot). ``models.LanguageModel`` evaluates its vocabulary layer at those positions only; the loss and the accuracy
are over the labelled slots (Zoology's token-level mean, ``Objective.terms``). The vocabulary is the data's
(``Examples.vocab_size``), and a task whose metric is ``macro`` (MAD's recall) counts each token class."""

from __future__ import annotations

import ml_collections

from lra_bench.training import models, steps
from lra_bench.training.objectives.base import TRAIN, Objective, register
from lra_bench.training.values import fail


@register
class NextToken(Objective):
  name, phase = "next_token", TRAIN

  def create_model(self, vocab_size: int | None = None):
    return models.LanguageModel(self.config.model, vocab_size or self.task.vocab_size,
                                dtype=steps.compute_dtype(self.config))

  def macro_classes(self, vocab_size: int | None = None) -> int:
    """A macro metric averages over the model's outputs, the vocabulary."""
    return (vocab_size or self.task.vocab_size) if self.task.metric == "macro" else 0

  @classmethod
  def validate(cls, config: ml_collections.ConfigDict) -> None:
    """A causal model over token inputs without a prepended CLS vector (the label positions index the
    inputs)."""
    if config.model.attention_kwargs.get("causal") is not True:
      fail("model.attention_kwargs.causal", config.model.attention_kwargs.get("causal"),
           f"True: task {config.task!r} predicts the next token, so the attention must be causal")
    if config.model.pooling == "CLS":
      fail("model.pooling", "CLS", f"MEAN, SUM or MAX (unused): task {config.task!r} reads the outputs at its "
           "label positions, and a prepended CLS vector would shift them")
    if config.model.input_kind != "tokens":
      fail("model.input_kind", config.model.input_kind, f"'tokens' for task {config.task!r}")
