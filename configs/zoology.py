"""Zoology's MQAR protocol (Arora et al., ICLR 2024, Fig. 2): multi-query associative recall.

Every value is the one of HazyResearch/zoology's ``zoology/experiments/paper_configs/iclr24_zoology_figure2/
configs.py`` with the defaults of ``zoology/config.py`` (``ModelConfig``, ``TrainConfig``) and the MQAR
generator ``zoology/data/multiquery_ar.py`` (docs/generators.md, "Recall tasks"):

- data: vocabulary 8192, (length, kv pairs) in {(64, 4), (128, 8), (256, 16)} (the figure's (512, 64) is
  commented out in the configs at HEAD), 100 000 training and 3 000 test examples, fillers left 0
  (``random_non_queries=False``), power-law gaps with a = 0.01; batch 512 up to length 128, 256 at 256;
- model: 2 layers, pre-LN, no MLP (``state_mixer`` = Identity in every paper config) — but Zoology's block
  still adds ``norm2(residual)`` to the residual stream after the sequence mixer (``zoology/model.py``
  ``TransformerBlock.forward``: ``hidden = state_mixer(norm2(residual))`` becomes the next block's, or
  ``LMBackbone.forward``'s final, ``residual = dropout(hidden) + residual``): ``model.identity_state_mixer``;
  one attention head with attention dropout 0.1, learned absolute positions, embedding dropout 0.1,
  residual dropout 0, tied input/output embedding, N(0, 0.02) embedding init;
- training: 64 epochs, AdamW (weight decay 0.1; PyTorch's betas and eps), cosine annealing to 0, no
  warm-up; learning rate swept over logspace(-4, -2, 4) and the best final accuracy reported per
  (attention, width, length);
- the width (``d_model``) is swept over 64, 128, 256, 512.

The sweep (``sweep`` below) is part of the protocol: ``lra-bench suite --protocol zoology`` runs every
point (3 lengths x 4 widths x 4 learning rates = 48 cells per attention); narrow it with
``--set model.emb_dim=64 --set model.qkv_dim=64`` (a fixed key is not swept) or ``--sweep``.

Differences from the original (documented, on purpose):
- Token ids are the original's + 1 (0 stays the padding id); the vocabulary is 8193.
- A validation split of its own (3 000 examples, another seed) picks the reported checkpoint; Zoology
  validated on its test set and reported the last epoch's accuracy (its early stop at > 0.99 accuracy
  is not implemented here: runs go to the end, which can only help them).
- The cosine schedule is per step (Zoology stepped it per epoch).
- Initialisation as Zoology's ``_init_weights`` (``zoology/model.py``, the same at 66f4918 and at HEAD):
  every ``nn.Linear`` N(0, 0.02) with zero bias, ``out_proj`` (and ``fc2``) N(0, 0.02 / sqrt(2 n_layers))
  (``model.dense_init_std``, ``model.residual_init_rescale``), and the MHA's ``Wqkv`` and ``out_proj``
  carry biases (``model.attention_bias``). The CPU-sized ``recall_cpu`` protocol keeps the LRA encoder's
  initialisation (xavier-uniform, no biases) so that its committed cells stay comparable.
- Non-attention mixers: the figure's gated convolutions had 4 layers (commit 66f4918), later 2; this
  harness's attention rows use 2 as every version of the configs.

  lra-bench data prepare mqar --protocol zoology
  lra-bench suite --protocol zoology --tasks mqar --attentions vanilla --set model.emb_dim=64 \\
      --set model.qkv_dim=64 --results_dir results/zoology
"""

from __future__ import annotations

import ml_collections

from configs import lra

VOCAB = 8192
TRAIN, TEST = 100_000, 3_000
EPOCHS = 64
LENGTHS = ((64, 4, 512), (128, 8, 512), (256, 16, 256))  # (length, kv pairs, batch size)
WIDTHS = (64, 128, 256, 512)
LEARNING_RATES = (1e-4, 4.64e-4, 2.15e-3, 1e-2)  # numpy.logspace(-4, -2, 4), rounded as in the configs


def recall_model(c: ml_collections.ConfigDict, *, width: int, layers: int, heads: int, mlp: bool,
                 mlp_dim: int | None = None) -> None:
  """The causal language model of the recall protocols (zoology's and safari's ``SimpleLM``)."""
  c.model.attention_kwargs.causal = True
  c.model.num_layers = layers
  c.model.num_heads = heads
  c.model.emb_dim = width
  c.model.qkv_dim = width
  c.model.mlp = mlp
  c.model.mlp_dim = mlp_dim or 4 * width   # unused without an MLP
  c.model.dropout_rate = 0.0               # resid_dropout
  c.model.embed_dropout_rate = 0.1         # embed_dropout
  c.model.attention_dropout_rate = 0.1     # MHA dropout
  c.model.positions = "learned"            # max_position_embeddings = the length
  c.model.pooling = "MEAN"                 # unused: a next-token model reads its label positions
  c.model.tie_embeddings = True
  c.model.embed_init_std = 0.02            # initializer_range


def adamw(c: ml_collections.ConfigDict, learning_rate: float, weight_decay: float) -> None:
  """torch.optim.AdamW as the originals used it (betas (0.9, 0.999), eps 1e-8)."""
  c.optimizer.learning_rate = learning_rate
  c.optimizer.weight_decay = weight_decay
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-8


def mqar_name(length: int, kv: int, prefix: str = "") -> str:
  """The data files' name of an MQAR setting (``<data_dir>/recall/mqar-<name>_*.npz``)."""
  return f"{prefix}L{length}_kv{kv}"


def recall_data(c: ml_collections.ConfigDict, *, vocab: int, length: int, train: int, test: int,
                name: str, model_length: int) -> None:
  """A recall task's data: the generator's options (validation as large as the test split) and the
  model's input length ``model_length`` (``tasks/recall.py``: MQAR's ``length``; assoc_recall's
  2 (length // 2) + 2 tokens, the pairs, ``=>`` and the query key; induction_head's length + 1)."""
  c.data.options.name = name
  c.data.prepare.name = name
  c.data.prepare.num_train = train
  c.data.prepare.num_val = test
  c.data.prepare.num_test = test
  c.data.prepare.vocab_size = vocab
  c.data.prepare.seq_len = length
  c.data.max_length = model_length


def mqar_data(c: ml_collections.ConfigDict, length: int, kv: int, train: int, test: int, *,
              random_non_queries: bool = False, vocab: int = VOCAB, name: str | None = None) -> None:
  recall_data(c, vocab=vocab, length=length, train=train, test=test, name=name or mqar_name(length, kv),
              model_length=length)
  c.data.prepare.num_kv_pairs = kv
  c.data.prepare.power_a = 0.01
  c.data.prepare.random_non_queries = random_non_queries


def epochs_to_steps(c: ml_collections.ConfigDict, examples: int, epochs: int) -> None:
  steps_per_epoch = -(-examples // c.batch_size)
  c.num_train_steps = steps_per_epoch * epochs
  c.eval_every = steps_per_epoch           # validation once per epoch, as Lightning
  c.log_every = min(steps_per_epoch, 50)
  c.checkpoint_every = steps_per_epoch


def mqar(c: ml_collections.ConfigDict) -> None:
  length, kv, batch = LENGTHS[0]
  mqar_data(c, length, kv, TRAIN, TEST)
  c.batch_size = batch
  recall_model(c, width=WIDTHS[0], layers=2, heads=1, mlp=False)
  c.model.identity_state_mixer = True    # TransformerBlock with state_mixer Identity: x + norm2(x) (docstring)
  c.model.dense_init_std = 0.02          # _init_weights: every nn.Linear N(0, initializer_range), bias 0
  c.model.residual_init_rescale = True   # ... out_proj N(0, initializer_range / sqrt(2 n_layers))
  c.model.attention_bias = True          # MHA: Wqkv and out_proj are nn.Linear with bias
  adamw(c, LEARNING_RATES[2], 0.1)
  c.optimizer.schedule = "constant * cosine_decay"
  c.optimizer.warmup_steps = 0
  epochs_to_steps(c, TRAIN, EPOCHS)
  c.optimizer.steps_per_cycle = c.num_train_steps  # 0.5 (1 + cos(pi step / T)): from lr to ~0 at the end


TASKS = {"mqar": mqar}


def _length_point(length: int, kv: int, batch: int) -> dict:
  name = mqar_name(length, kv)
  steps_per_epoch = -(-TRAIN // batch)
  return {"data.prepare.seq_len": length, "data.prepare.num_kv_pairs": kv, "data.max_length": length,
          "data.options.name": name, "data.prepare.name": name, "batch_size": batch,
          "num_train_steps": steps_per_epoch * EPOCHS, "eval_every": steps_per_epoch,
          "checkpoint_every": steps_per_epoch, "optimizer.steps_per_cycle": steps_per_epoch * EPOCHS}


def sweep(task: str) -> dict[str, list[dict]]:
  """Fig. 2's grid: length (with its kv pairs and batch size) x width x learning rate."""
  if task != "mqar":
    return {}
  return {"L": [_length_point(*point) for point in LENGTHS],
          "d": [{"model.emb_dim": w, "model.qkv_dim": w, "model.mlp_dim": 4 * w} for w in WIDTHS],
          "lr": [{"optimizer.learning_rate": lr} for lr in LEARNING_RATES]}


def protocol_config(protocol: str, tasks: dict, task: str) -> ml_collections.ConfigDict:
  """``tasks[task]`` applied to the LRA base config under ``protocol`` (the recall protocols' get_config)."""
  if task not in tasks:
    raise ValueError(f"protocol {protocol!r} has no config for task {task!r}; it has: {', '.join(sorted(tasks))}")
  c = lra.base_config()
  c.protocol = protocol
  c.task = task
  tasks[task](c)
  return c


def get_config(task: str = "mqar") -> ml_collections.ConfigDict:
  c = protocol_config("zoology", TASKS, task)
  # float32 as the original: HazyResearch/zoology zoology/train.py trains without autocast (float32 PyTorch);
  # kept on every backend to match its runs (recall_cpu keeps it too)
  c.precision = "float32"
  return c
