"""The S4 recipe (state-spaces/s4 ``configs/experiment/lra/s4-{listops,imdb,aan,cifar,pathfinder,pathx}.yaml``
with ``configs/model/s4.yaml`` and ``configs/model/layer/s4.yaml``), run with the diagonal ``s4d`` mixer
(S4D-LegS: the LRU paper's Table 3 row; S4 v1/v2 used the DPLR kernel, which this harness does not have).

Six bidirectional S4D layers with BatchNorm, GELU then GLU, no FFN, mean pooling, a linear decoder (an MLP
with GELU on the [u, v, u·v, u−v] features of Retrieval); no input dropout; AdamW (wd 0.05, none on biases,
norms and the embedding) with a linear warm-up over 10 % of the steps then a cosine to 0; the layer's
parameters at the rates the yamls give them (below). docs/protocol_differences.md lists what still differs.

  lra-bench data prepare listops --protocol s4
  lra-bench train --protocol s4 --task listops --workdir runs/s4_listops          # s4d by default
"""

from __future__ import annotations

import ml_collections

from configs import _sequence_models as seq
from configs import lra

MIXER = "s4d"
# task: (H d_model, N d_state, prenorm, batch, lr, steps, dropout, tied dropout, n_ssm)
# From s4-*.yaml at state-spaces/s4 HEAD (e757cef; the same values at 62a14bb but Path-X's lr, 0.002 there).
RECIPE = {
    "listops": (256, 4, False, 32, 0.01, 120_000, 0.0, False, 1),     # 40 epochs; seed 3333 in the yaml
    "text": (256, 4, True, 16, 0.01, 50_000, 0.0, False, 1),
    "retrieval": (256, 4, True, 64, 0.01, 50_000, 0.0, False, 1),     # 20 epochs
    "image": (512, 64, False, 50, 0.01, 180_000, 0.1, True, 1),       # 200 epochs, grayscale, tie_dropout
    "pathfinder": (256, 64, True, 64, 0.004, 500_000, 0.0, False, None),  # 200 epochs; n_ssm: null
    "pathx": (256, 64, True, 16, 0.001, 500_000, 0.0, False, None),       # 50 epochs, dt_min 1e-4
}
# The layer's own rates (``kernel.py`` ``register(name, tensor, lr, wd)``; parameters without one take the
# optimizer's lr and weight decay):
# - ListOps, IMDB, AAN: ``layer.lr: {dt: null, A: 0.001, B: 0.001}`` — A and B at 1e-3, Δ (``dt: null``) at
#   the main rate, all three without weight decay (``layer.wd: 0.0``); C (registered with wd None) and D at the
#   main rate and weight decay;
# - CIFAR, Pathfinder, Path-X: ``layer.lr: 0.001`` — every registered tensor at 1e-3, C included (it keeps the
#   main weight decay: ``register("C", ..., lr, None)``), Δ, A, B without weight decay.
SSM_LR = 0.001
LAYER_LR_DICT = ("listops", "text", "retrieval")   # the yamls with lr: {dt: null, A, B}
# configs/config.yaml ``train.optimizer_param_grouping`` (bias_weight_decay False, normalization_weight_decay
# False) -> src/utils/optim_groups.py ``add_optimizer_hooks``: no weight decay on biases, norms, nn.Embedding.
NO_DECAY = "bias=main/0, norm=main/0, embedding=main/0"
PARAM_GROUPS = {True: f"ssm_inv_dt=main/0, {NO_DECAY}",    # Δ at the main rate (dt: null)
                False: f"C=ssm/main, {NO_DECAY}"}           # C at the layer's 1e-3
WEIGHT_DECAY = 0.05
WARMUP_FRACTION = 0.1       # num_warmup_steps = num_training_steps / 10 (12000 of 120000; 18000 of 180000)
# s4-imdb.yaml ``dataset.l_max: 4096`` (the IMDB loader's default, src/dataloaders/lra.py)
TEXT_LENGTH = 4096

PUBLISHED_DIFFERENCES = {
    "s4d": ("S4D-LegS row of the LRU paper (Table 3) under the S4 repository's LRA recipe: the diagonal "
            "kernel in place of S4's DPLR (the yamls' layer mode nplr); IMDB as LRA's bytes (S4: characters "
            "with a min_freq-15 vocabulary and an EOS token), AAN and ListOps as LRA's tokens; BatchNorm "
            "statistics over real positions only (the original includes padding)"),
}


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  task = config.task
  n, tied, n_ssm = RECIPE[task][1], RECIPE[task][7], RECIPE[task][8]
  kwargs = {"d_state": n, "init": "legs", "bidirectional": True, "dt_min": 1e-4 if task == "pathx" else 1e-3,
            "dt_max": 0.1, "postact": "glu", "tie_dropout": tied,
            # SSMKernelDiag trains B (lr B 1e-3, wd 0), initialised from HiPPO-LegS (dplr.ssm -> hippo.nplr)
            "B_init": "legs", "trainable_B": True, "n_ssm": n_ssm,
            "dt_transform": "softplus"}             # configs/model/layer/s4.yaml dt_transform: softplus
  if config.model.attention != MIXER:
    return {}
  settings = seq.kwargs_for(config, MIXER, kwargs)
  settings["optimizer.param_groups"] = PARAM_GROUPS[task in LAYER_LR_DICT]
  return settings


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  # float32 as the original: state-spaces/s4 configs/trainer/default.yaml sets no `precision` (Lightning's
  # default 32) and the LRA experiment yamls do not change it; kept on every backend to match its runs
  c.precision = "float32"
  c.protocol = "s4"
  h, _, prenorm, batch, lr, total, dropout, tied, _ = RECIPE[task]
  seq.mixer_model(c, task, mixer=MIXER, layers=6, width=h, norm="batch", prenorm=prenorm, dropout=dropout,
                  tied=tied, head="mlp" if task == "retrieval" else "linear")
  seq.text_length(c, task, TEXT_LENGTH)
  c.model.embed_dropout_rate = 0.0      # model/base.yaml: SequenceModel's dropinp 0 (the residual keeps dropout)
  c.optimizer.param_groups = NO_DECAY   # every layer; the s4d preset adds its own rates (attention_settings)
  if task == "retrieval":
    c.model.head_activation = "gelu"    # pipeline/aan.yaml decoder: retrieval, activation gelu, d_model = H
  seq.cosine_schedule(c, learning_rate=lr, total_steps=total, warmup_steps=int(total * WARMUP_FRACTION),
                      weight_decay=WEIGHT_DECAY, batch_size=batch)
  c.optimizer.ssm_learning_rate = SSM_LR
  c.optimizer.ssm_weight_decay = 0.0
  seq.evaluation(c, task, batch)
  return c
