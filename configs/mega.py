"""The Mega recipe (Ma et al. 2023, Table 8; facebookresearch/mega ``examples/mega/README.lra.md``), run
with the ``mega`` mixer (``mega_chunk``: the same with chunks of 128 tokens, 4096 on Path-X).

Mega blocks (gated EMA attention, then a SiLU FFN without hidden dropout, N(0, 0.02) weights), post-norm
LayerNorm / ScaleNorm on the text tasks and pre-norm BatchNorm on the image tasks, token embeddings
N(0, d^-1/2), mean pooling, a classifier Linear → dropout → GELU → Linear (Retrieval: on [u, v]); Adam
β = (0.9, 0.98), gradient clipping at 1, the README's warm-up then linear decay; every parameter alike (no SSM
learning rate). docs/protocol_differences.md lists what still differs.

  lra-bench train --protocol mega --task listops --workdir runs/mega_listops      # mega by default
  lra-bench train --protocol mega --task listops --attention mega_chunk --workdir runs/mega_chunk_listops
"""

from __future__ import annotations

import ml_collections

from configs import _sequence_models as seq
from configs import lra

MIXER = "mega"
# task: (depth, d, FFN, z, v, attention fn, norm, prenorm, batch, lr, dropout, wd, epochs) from Table 8.
RECIPE = {
    "listops": (6, 80, 160, 64, 160, "softmax", "layer", False, 64, 1e-3, 0.1, 0.01, 60),
    "text": (4, 128, 256, 64, 256, "softmax", "scale", False, 50, 4e-3, 0.1, 0.01, 50),
    "retrieval": (6, 128, 256, 64, 256, "softmax", "scale", False, 64, 3e-3, 0.1, 0.04, 40),
    "image": (8, 160, 320, 96, 320, "laplace", "batch", True, 50, 0.01, 0.0, 0.02, 200),
    "pathfinder": (6, 128, 256, 64, 256, "laplace", "batch", True, 128, 0.01, 0.0, 0.01, 200),
    "pathx": (4, 64, 128, 32, 128, "laplace", "batch", True, 128, 0.01, 0.0, 0.01, 100),
}
CHUNK = {"pathx": 4096}     # Mega-chunk: c = 128, 4096 on Path-X
# examples/mega/README.lra.md --warmup-updates (linear from --warmup-init-lr 1e-7, here from 0), then
# linear_decay to 0 at --max-update (= the epochs below: 90000 / 25000 / 91960 / 180000 / 250000 / 125000).
WARMUP = {"listops": 3_000, "text": 10_000, "retrieval": 10_000, "image": 9_000, "pathfinder": 50_000,
          "pathx": 25_000}
# fairseq/models/lra/model.py mega_lra_imdb / mega_lra_aan: max_positions 4002; the IMDB data at 4000 tokens.
TEXT_LENGTH = 4000

PUBLISHED_DIFFERENCES = {
    "mega": ("the EMA kernels run the full length (the recipe truncates them, at 1024 tokens, 4096 on "
             "Path-X); padding masked in the EMA and in BatchNorm; warm-up from 0 (the README: from 1e-7; "
             "Path-X's --warmup-power 2 not reproduced); the pixel embedding is a Dense layer (Mega's "
             "RealNumberEmbedding: weight N(0, 1), bias N(0, 0.1)); no positional encoding (the relative "
             "bias orders the tokens, as in the original)"),
    "mega_chunk": ("as mega, with chunks of 128 tokens (4096 on Path-X)"),
}


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  if config.model.attention not in ("mega", "mega_chunk"):
    return {}
  _, _, _, z, v, fn, *_ = RECIPE[config.task]
  kwargs = {"z_dim": z, "hidden_dim": v, "ema_dim": 16, "attention_fn": fn, "bidirectional": True,
            "max_positions": config.data.max_length,
            # README.lra.md: --attention-dropout 0.0 --act-dropout 0.0 on every task (act_dropout is the
            # encoder's hidden_dropout: fairseq/models/lra/model.py LRAEncoder)
            "attention_dropout_rate": 0.0, "hidden_dropout_rate": 0.0}
  if config.model.attention == "mega_chunk":
    kwargs["chunk_size"] = CHUNK.get(config.task, 128)
  return {f"model.attention_kwargs.{k}": val for k, val in kwargs.items()}


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  # float32 as the original: facebookresearch/mega examples/mega/README.lra.md runs fairseq's train.py without
  # --fp16/--bf16; kept on every backend to match its runs
  c.precision = "float32"
  c.protocol = "mega"
  depth, d, ffn, _, _, _, norm, prenorm, batch, lr, dropout, wd, epochs = RECIPE[task]
  seq.mixer_model(c, task, mixer=MIXER, layers=depth, width=d, norm=norm, prenorm=prenorm, dropout=dropout,
                  mlp=ffn, head="mlp", mlp_activation="silu")
  seq.text_length(c, task, TEXT_LENGTH)
  # fairseq/modules/normalized_feedforward_network.py: fc1, fc2 N(0, 0.02), zero biases; hidden_dropout =
  # --act-dropout 0 (the output keeps --dropout before the residual add)
  c.model.dense_init_std = 0.02
  c.model.mlp_hidden_dropout_rate = 0.0
  # fairseq/models/lra/mega_lra_encoder.py Embedding: N(0, embedding_dim^-1/2) (token tasks)
  c.model.embed_init_std = d ** -0.5
  # fairseq/models/lra/model.py LRAModel: classifier Linear(in, classifier_out_dim) then dropout (--dropout),
  # then the GELU (classifier_activation_fn); classifier_out_dim = the FFN width in every mega_lra_* arch
  c.model.head_activation = "gelu"
  c.model.head_dropout_rate = dropout
  if task == "retrieval":
    c.model.dual_features = "concat"    # classifier_in_dim = 2 d: the two documents' features, concatenated
  total = seq.steps(task, batch, epochs)
  c.batch_size = batch
  c.num_train_steps = total
  c.optimizer.learning_rate = lr
  c.optimizer.schedule = "constant * linear_warmup * linear_decay"
  c.optimizer.warmup_steps = WARMUP[task]
  c.optimizer.steps_per_cycle = total
  c.optimizer.weight_decay = wd
  c.optimizer.b1, c.optimizer.b2 = 0.9, 0.98
  c.optimizer.eps = 1e-8
  c.optimizer.grad_clip_norm = 1.0
  seq.evaluation(c, task, batch)
  return c
