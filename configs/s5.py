"""The S5 recipe (lindermanlab/S5 ``bin/run_experiments/run_lra_{listops,imdb,aan,cifar,pathfinder,pathx}.sh``
with the defaults of ``run_train.py``), run with the ``s5`` mixer.

BatchNorm before each layer (prenorm), bidirectional S5 with conjugate symmetry and ZOH, the layer's
GELU + GLU variant of the script, no FFN, mean pooling, a linear decoder; one warm-up epoch then a
cosine to 0; Λ, B̃ and Δ at ``ssm_lr`` without weight decay, everything else at lr = lr_factor × ssm_lr
with the script's weight decay; dropout shared over time (S5 broadcasts its masks along the sequence).

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

PUBLISHED_DIFFERENCES = {
    "s5": ("BatchNorm statistics over real positions only and the scan masked at padding (the original "
           "runs the padded tail through the scan); the options of the scripts that configs/s5.py does "
           "not list run at this harness's defaults (e.g. the evaluation cadence: once an epoch here)"),
}


def attention_settings(config: ml_collections.ConfigDict) -> dict:
  _, _, p, j, *_, activation, extra = RECIPE[config.task]
  kwargs = {"d_state": p, "blocks": j, "conj_sym": True, "bidirectional": True, "activation": activation,
            **extra}
  return seq.kwargs_for(config, MIXER, kwargs)


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  c.protocol = "s5"
  layers, h, _, _, batch, epochs, ssm_lr, factor, wd, dropout, _, _ = RECIPE[task]
  seq.mixer_model(c, task, mixer=MIXER, layers=layers, width=h, norm="batch", prenorm=True, dropout=dropout,
                  tied=True, head="mlp" if task == "retrieval" else "linear")
  seq.cosine_schedule(c, learning_rate=ssm_lr * factor, total_steps=seq.steps(task, batch, epochs),
                      warmup_steps=seq.steps(task, batch, 1), weight_decay=wd, batch_size=batch)
  c.optimizer.ssm_learning_rate = ssm_lr
  c.optimizer.ssm_weight_decay = 0.0
  seq.evaluation(c, task, batch)
  return c
