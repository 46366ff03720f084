"""MAD's two recall tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures",
athms/mad-lab): in-context recall and noisy in-context recall, at MAD's baseline settings.

Values read from athms/mad-lab (``mad/configs.py`` ``MADConfig`` / ``MADModelConfig``,
``configs/tasks/{in-context-recall,noisy-in-context-recall}.yml``, ``configs/layers/{mh-attention,mlp}.yml``,
``mad/model/layers/mlp.py``, ``mad/metrics.py``, ``mad/data/instances.py``):

- data: in-context recall: vocabulary 16, length 128, 12 800 training and 1 280 test sequences,
  multi-query; noisy: vocabulary 32 of which the top 16 are noise tokens, noise fraction 0.2
  (docs/generators.md, "MAD recall", has the construction);
- model: width 128, two blocks of [attention, MLP], pre-norm residual; the attention is MAD's
  ``mh-attention`` (16 heads of 8, causal, dropout 0); no embedding dropout;
- training: batch 128, 200 epochs (100 steps each: 20 000 steps), AdamW lr 5e-4, weight decay 0, cosine
  annealing to ``min_lr`` 1e-6 over the run;
- the benchmark sweeps lr {1e-4, 5e-4, 1e-3} x weight decay {0, 0.1} (``make_benchmark_mad_configs``;
  ``sweep`` below) and keeps the best run per setting;
- metric: torchmetrics' ``MulticlassAccuracy`` with its default ``average="macro"``, over the values of
  keys seen before (the test labels): the mean over value tokens of each one's accuracy, not the share
  of correct labels (``lra_bench.training.loop.macro_accuracy``; records carry both, ``test_accuracy``
  macro and ``test_accuracy_micro``).

Differences from the original (on purpose, or because the harness has no such layer):
- Token ids are the original's + 1 (0 stays the padding id); the vocabulary is 17 (33 noisy).
- The model is this harness's causal language model: learned absolute positions instead of MAD's rotary
  embedding (``rotary_emb_dim`` 8) and no positions; a GELU MLP of 4 x 128 (MAD's plain ``Mlp`` width)
  instead of MAD's default SwiGLU (inner width 352, no biases); a final LayerNorm and tied embeddings as
  the other recall protocols.
- A validation split of its own (1 280 sequences, another seed) picks the best checkpoint, and
  ``test_accuracy`` is that checkpoint's; MAD reports the last epoch's test accuracy, which is our
  ``test_accuracy_last``. MAD's early stop at test accuracy >= 0.999 is not implemented (runs go to the
  end).
- The cosine schedule is per step and decays to 0, not per epoch to 1e-6; bfloat16 compute on a GPU or TPU as
  MAD's ``precision='bf16'`` (``precision="auto"``), float32 on the CPU.
- No split repeats a sequence of an earlier one (MAD only warns when test sequences occur in training).
- The noisy generator guarantees one key-value pair among the context slots; MAD's guarantee could land
  on the final query slot, and a sequence of noise only then crashed its generator (docs/generators.md).

Cost on this project's 2-core CPU: 1.6 steps/s at batch 32 (two other runs beside it), so a run of 20 000
steps of batch 128 is many hours: shorten it with ``--set num_train_steps=N`` (the schedule follows) and
say so beside the number.

  lra-bench data prepare in_context_recall --protocol mad
  lra-bench train --protocol mad --task in_context_recall --attention vanilla --workdir runs/mad_icr
"""

from __future__ import annotations

import ml_collections

from configs.zoology import adamw, epochs_to_steps, protocol_config, recall_model

TRAIN, TEST = 12_800, 1_280
EPOCHS = 200
LEARNING_RATES = (1e-4, 5e-4, 1e-3)
WEIGHT_DECAYS = (0.0, 0.1)


def _common(c: ml_collections.ConfigDict, vocab: int, noise: int, frac: float) -> None:
  c.data.options.name = "mad"
  c.data.prepare.name = "mad"
  c.data.prepare.num_train = TRAIN
  c.data.prepare.num_val = TEST
  c.data.prepare.num_test = TEST
  c.data.prepare.vocab_size = vocab
  c.data.prepare.seq_len = 128
  c.data.prepare.noise_vocab_size = noise
  c.data.prepare.frac_noise = frac
  c.data.max_length = 127                    # the model reads all but the last token
  recall_model(c, width=128, layers=2, heads=16, mlp=True, mlp_dim=4 * 128)
  c.model.embed_dropout_rate = 0.0           # MADModelConfig.embed_drop_rate
  c.model.attention_dropout_rate = 0.0       # mh-attention.yml dropout
  adamw(c, 5e-4, 0.0)
  c.batch_size = 128
  epochs_to_steps(c, TRAIN, EPOCHS)
  c.optimizer.schedule = "constant * cosine_decay"
  c.optimizer.warmup_steps = 0
  c.optimizer.steps_per_cycle = c.num_train_steps


def in_context_recall(c: ml_collections.ConfigDict) -> None:
  _common(c, vocab=16, noise=0, frac=0.0)


def noisy_in_context_recall(c: ml_collections.ConfigDict) -> None:
  _common(c, vocab=32, noise=16, frac=0.2)


TASKS = {"in_context_recall": in_context_recall, "noisy_in_context_recall": noisy_in_context_recall}


def sweep(task: str) -> dict[str, list[dict]]:
  """MAD's optimizer grid of every setting: 3 learning rates x 2 weight decays."""
  if task not in TASKS:
    return {}
  return {"lr": [{"optimizer.learning_rate": lr} for lr in LEARNING_RATES],
          "wd": [{"optimizer.weight_decay": wd} for wd in WEIGHT_DECAYS]}


def get_config(task: str = "in_context_recall") -> ml_collections.ConfigDict:
  c = protocol_config("mad", TASKS, task)
  # athms/mad-lab mad/configs.py MADConfig: precision 'bf16' (Lightning's bfloat16 mixed precision): "auto" is
  # bfloat16 on GPU/TPU, float32 on the CPU
  c.precision = "auto"
  return c
