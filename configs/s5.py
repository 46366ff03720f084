"""The S5 recipe (lindermanlab/S5 ``bin/run_experiments/run_lra_{listops,imdb,aan,cifar,pathfinder,pathx}.sh``
with the defaults of ``run_train.py``), run with the ``s5`` mixer.

A Dense layer on one-hot tokens (``s5/seq_model.py`` ``StackedEncoderModel.encoder``), BatchNorm before each
layer (prenorm), bidirectional S5 with conjugate symmetry and ZOH, the layer's GELU + GLU variant of the
script, the layer's output added to the residual as it is (``s5/layers.py`` ``SequenceLayer``), no FFN, no
final norm, mean pooling, a linear decoder (Retrieval: ``RetrievalDecoder``, Dense → GELU → Dense on
[u, v, u·v, u−v]); one warm-up epoch then a cosine to 0; Λ, B̃ and Δ at ``ssm_lr`` without weight decay,
everything else at lr = lr_factor × ssm_lr with the script's weight decay, but where the script's
``opt_config`` / ``dt_global`` moves B or Δ (below); dropout shared over time (S5 broadcasts its masks along
the sequence). docs/protocol_differences.md lists what still differs.

  lra-bench train --protocol s5 --task listops --workdir runs/s5_listops          # s5 by default
"""

from __future__ import annotations

import ml_collections

from configs import _sequence_models as seq
from configs import lra

MIXER = "s5"
# task: (layers, H, P, J blocks, batch, epochs, ssm_lr, lr_factor, weight decay, dropout, activation, extra)
# From the six run_lra_*.sh scripts (d_state, blocks, C_init, activation, clip_eigs, dt_min re-read there;
# a script that names no activation runs run_train.py's half_glu1).
RECIPE = {
    "listops": (8, 128, 16, 8, 50, 40, 1e-3, 3.0, 0.04, 0.0, "half_glu2", {"C_init": "lecun_normal"}),
    "text": (6, 256, 192, 12, 50, 35, 1e-3, 4.0, 0.07, 0.1, "half_glu2", {"C_init": "lecun_normal"}),
    "retrieval": (6, 128, 256, 16, 32, 20, 1e-3, 2.0, 0.05, 0.0, "half_glu1", {}),
    "image": (6, 512, 384, 3, 50, 250, 1e-3, 4.5, 0.07, 0.1, "half_glu1",
              {"clip_eigs": True, "C_init": "lecun_normal"}),
    "pathfinder": (6, 192, 256, 8, 64, 200, 9e-4, 5.0, 0.03, 0.05, "half_glu1", {}),
    "pathx": (6, 128, 256, 16, 32, 75, 6e-4, 3.0, 0.06, 0.0, "half_glu1",
              {"dt_min": 1e-4, "C_init": "complex_normal"}),
}
# The scripts' optimizer variants (s5/train_helpers.py ``create_train_state``; "standard" is the default split:
# B, Λ, log_step at ssm_lr without weight decay, the rest at lr with it):
# - ``--opt_config=BfastandCdecay`` (ListOps, CIFAR): B joins the "regular" group (lr, weight decay);
# - ``--opt_config=BandCdecay`` (Path-X): B in an AdamW at ssm_lr with the weight decay;
# - ``--dt_global=True`` (IMDB, AAN): log_step joins the "regular" group (lr, weight decay).
PARAM_GROUPS = {"listops": "ssm_B=main/main", "image": "ssm_B=main/main", "pathx": "ssm_B=ssm/main",
                "text": "ssm_log_step=main/main", "retrieval": "ssm_log_step=main/main"}
# --warmup_end (epochs of linear warm-up): 1 in every script but IMDB's 0.
WARMUP_EPOCHS = {"text": 0}
# --bn_momentum: run_train.py's 0.95, 0.9 in the Pathfinder and Path-X scripts (flax's momentum, as ours).
BN_MOMENTUM = {"pathfinder": 0.9, "pathx": 0.9}
# IMDB at s5/dataloaders/lra.py's l_max 4096 (the S4 loader's default).
TEXT_LENGTH = 4096

PUBLISHED_DIFFERENCES = {
    "s5": ("BatchNorm statistics over real positions only and the scan masked at padding (the original "
           "runs the padded tail through the scan); IMDB as LRA's bytes (S5: characters with a min_freq-15 "
           "vocabulary and an EOS token), AAN and ListOps as LRA's tokens; the options of the scripts that "
           "configs/s5.py does not list run at this harness's defaults (e.g. the evaluation cadence: once an "
           "epoch here; no early stopping or plateau schedule, both off in the scripts)"),
}


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  _, _, p, j, *_, activation, extra = RECIPE[config.task]
  kwargs = {"d_state": p, "blocks": j, "conj_sym": True, "bidirectional": True, "activation": activation,
            **extra}
  settings = seq.kwargs_for(config, MIXER, kwargs)
  if settings and config.task in PARAM_GROUPS:
    settings["optimizer.param_groups"] = PARAM_GROUPS[config.task]
  return settings


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  # float32 as the original: lindermanlab/S5 run_train.py and bin/run_experiments/run_lra_*.sh set no dtype
  # (JAX's float32); kept on every backend to match its runs
  c.precision = "float32"
  c.protocol = "s5"
  layers, h, _, _, batch, epochs, ssm_lr, factor, wd, dropout, _, _ = RECIPE[task]
  seq.mixer_model(c, task, mixer=MIXER, layers=layers, width=h, norm="batch", prenorm=True, dropout=dropout,
                  tied=True, head="mlp" if task == "retrieval" else "linear")
  seq.text_length(c, task, TEXT_LENGTH)
  c.model.embed_dropout_rate = 0.0        # StackedEncoderModel: no dropout on the encoder's output
  c.model.residual_dropout = False        # SequenceLayer: x = skip + x (its layer ends in its own dropout)
  c.model.final_norm = False              # StackedEncoderModel ends with the last SequenceLayer
  c.model.token_embedding = "onehot_dense"  # run_train.py one-hot inputs -> encoder nn.Dense(d_model)
  c.model.batch_norm_momentum = BN_MOMENTUM.get(task, 0.95)
  if task == "retrieval":
    c.model.head_activation = "gelu"      # s5/seq_model.py RetrievalDecoder: Dense(H) -> gelu -> Dense
  warmup = seq.steps(task, batch, WARMUP_EPOCHS.get(task, 1))
  seq.cosine_schedule(c, learning_rate=ssm_lr * factor, total_steps=seq.steps(task, batch, epochs),
                      warmup_steps=warmup, weight_decay=wd, batch_size=batch)
  if warmup == 0:                         # --warmup_end=0: the cosine from the first step
    c.optimizer.schedule = "constant * cosine_decay"
  c.optimizer.ssm_learning_rate = ssm_lr
  c.optimizer.ssm_weight_decay = 0.0
  seq.evaluation(c, task, batch)
  return c
