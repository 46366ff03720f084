"""The associative-recall and induction-head protocol of berlino/seq_icl (the table of its readme: AR
Transformer 100.0, S4D 32.4, H3 98.2, LRU 11.6; IH Transformer 97.2, S4D 8.8, H3 100.0, LRU 4.8).

Values read from the repository at the commit whose readme holds the table (75d7a96, configs unchanged
at 655c92e), ``configs/experiment/synthetics/{associative_recall,induction_head}/{base,transformer}.yaml``,
``configs/pipeline/{assoc_recall,induction_head}.yaml`` and ``configs/dataset/icl_synthetics.yaml``:

- associative recall: the pipeline overrides the dataset's defaults to vocabulary 40 and input length
  384 (the dataset file's 20 / 40 are the H3 paper's setting, not this table's), 5 000 training and 500
  test examples; Transformer ``lm_simple``: width 128, 8 layers, 2 heads, MLP 4 x 128, embedding
  dropout 0.1, residual dropout 0, attention dropout 0.1, learned positions; AdamW lr 5e-4, weight
  decay 0.1; batch 32; 200 epochs; linear warm-up over 10 % of the steps, then linear decay to 0
  (``linear_warmup`` = transformers' ``get_linear_schedule_with_warmup``);
- induction head: vocabulary 16, length 256, same counts; width 32, 2 layers, 2 heads, MLP 4 x 32;
  batch 8; 400 epochs; timm cosine with 10 % warm-up from 1e-6 and a floor of 0.1 x lr.

The model (safari's ``SimpleLMHeadModel``): pre-LN blocks, final LayerNorm, tied embedding and output,
N(0, 0.02) embeddings and positions. The metric is the accuracy on the labelled positions of the test
split (``accuracy_ignore_index``; docs/generators.md, "Recall tasks", says which positions are
labelled).

Differences from the original (on purpose):
- Token ids are the original's + 1 (0 stays the padding id).
- A validation split of its own (500 examples, another seed); the original validated on its test set.
- The induction-head schedule decays to 0, not to the 0.1 x lr floor, and its warm-up starts at 0, not
  1e-6 (the harness's ``cosine_decay`` factor).
- No GPT-2 re-initialisation of the output projections (0.02 / sqrt(2 n_layers)).

These runs are long on a CPU (AR: 31 400 steps at length 384 with width 128 and 8 layers); the CPU-sized
variant that finishes in minutes is the ``recall_cpu`` protocol.

  lra-bench data prepare assoc_recall --protocol seq_icl
  lra-bench suite --protocol seq_icl --tasks assoc_recall,induction_head --attentions vanilla \\
      --results_dir results/seq_icl
"""

from __future__ import annotations

import ml_collections

from configs.zoology import adamw, epochs_to_steps, protocol_config, recall_data, recall_model

TRAIN, TEST = 5_000, 500


def assoc_recall(c: ml_collections.ConfigDict) -> None:
  recall_data(c, vocab=40, length=384, train=TRAIN, test=TEST, name="seq_icl", model_length=386)
  recall_model(c, width=128, layers=8, heads=2, mlp=True)
  adamw(c, 5e-4, 0.1)
  c.batch_size = 32
  epochs_to_steps(c, TRAIN, 200)
  c.optimizer.schedule = "constant * linear_warmup * linear_decay"
  c.optimizer.warmup_steps = c.num_train_steps // 10
  c.optimizer.steps_per_cycle = c.num_train_steps


def induction_head(c: ml_collections.ConfigDict, epochs: int = 400) -> None:
  """``epochs``: seq_icl's 400; ``seq_icl_cpu`` trains for fewer, the schedule stretched to them."""
  recall_data(c, vocab=16, length=256, train=TRAIN, test=TEST, name="seq_icl", model_length=257)
  recall_model(c, width=32, layers=2, heads=2, mlp=True)
  adamw(c, 5e-4, 0.1)
  c.batch_size = 8
  epochs_to_steps(c, TRAIN, epochs)
  c.optimizer.schedule = "constant * linear_warmup * cosine_decay"
  c.optimizer.warmup_steps = c.num_train_steps // 10
  c.optimizer.steps_per_cycle = c.num_train_steps - c.optimizer.warmup_steps


TASKS = {"assoc_recall": assoc_recall, "induction_head": induction_head}


def get_config(task: str = "assoc_recall") -> ml_collections.ConfigDict:
  return protocol_config("seq_icl", TASKS, task)
