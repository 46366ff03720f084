"""What a worker killed without warning (SIGKILL, ``scancel --signal=KILL <job>.0``) leaves in its
checkpoints, and that the resumed run's next commit clears it. Found by the real-SLURM kill test
(tests/test_slurm_real.py): a kill inside the tf.data iterator's write leaves ``iter-<step>_temp/``."""

import os

from lra_bench.training import checkpoints
from lra_bench.training.config import load_config
from tests.conftest import tiny_overrides


def test_commit_clears_an_interrupted_iterator_write(tmp_path):
  ckpt = checkpoints.Checkpoints(str(tmp_path / "run"), load_config("smoke", "listops", tiny_overrides()))
  os.makedirs(os.path.join(ckpt.data_dir, "iter-16_temp"))
  for name in ("iter-16_temp/part-00000-of-00001.data-00000-of-00001.tempstate1", "iter-8.index",
               "iter-8.data-00000-of-00001", "iter-24.index", "iter-24.data-00000-of-00001", "checkpoint"):
    (tmp_path / "run" / "checkpoints" / "data" / name).write_text("")
  ckpt._committed(24, {"best_step": 0})
  assert sorted(os.listdir(ckpt.data_dir)) == ["checkpoint", "iter-24.data-00000-of-00001", "iter-24.index"]
