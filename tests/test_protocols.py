"""Protocol presets for every task: LRA values (the repo configs, see configs/lra.py), combiner, xiong, smoke; the
linear-decay schedule of the xiong protocol; `data prepare` of a task without data is one clear line."""

import os
import subprocess
import sys

import numpy as np
import pytest

import tasks
from lra_bench.training import config as config_lib
from lra_bench.training import optim

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("protocol", ["lra", "combiner", "xiong", "smoke"])
@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image", "pathfinder", "pathx"])
def test_every_protocol_has_every_task(protocol, task):
  if protocol == "smoke" and task == "pathx":
    with pytest.raises(config_lib.ConfigError, match="16K tokens"):
      config_lib.load_config(protocol, task)
    return
  c = config_lib.load_config(protocol, task)
  assert c.task == task and c.protocol == protocol
  assert c.model.qkv_dim % c.model.num_heads == 0


# The published settings, from google-research/long-range-arena lra_benchmarks/<task>/configs/
# base_*_config.py (+ the model configs; image/cifar10 and pathfinder32/128 transformer configs): a typo
# in configs/lra.py would silently change every `lra` result.
@pytest.mark.parametrize("task, values", [
    ("text", dict(layers=4, heads=4, emb=256, mlp=1024, length=1000, batch=32, steps=20_000, lr=0.05, warmup=8000)),
    ("retrieval", dict(layers=4, heads=4, emb=128, mlp=512, length=4000, batch=32, steps=5000, lr=0.05, warmup=8000)),
    ("image", dict(layers=1, heads=8, emb=128, mlp=128, length=1024, batch=256, steps=35_000, lr=5e-4, warmup=175)),
    ("pathfinder", dict(layers=4, heads=4, emb=32, mlp=32, length=1024, batch=512, steps=62_400, lr=1e-3, warmup=312)),
    ("pathx", dict(layers=1, heads=2, emb=32, mlp=32, length=16384, batch=64, steps=500_000, lr=1e-3, warmup=2500)),
])
def test_lra_values(task, values):
  c = config_lib.load_config("lra", task)
  got = dict(layers=c.model.num_layers, heads=c.model.num_heads, emb=c.model.emb_dim, mlp=c.model.mlp_dim,
             length=c.data.max_length, batch=c.batch_size, steps=c.num_train_steps,
             lr=c.optimizer.learning_rate, warmup=c.optimizer.warmup_steps)
  assert got == values


def test_combiner_and_xiong():
  assert config_lib.load_config("combiner", "pathfinder").data.options.contour_length == 9
  assert config_lib.load_config("combiner", "pathfinder").data.prepare.contour_length == 9
  assert config_lib.load_config("lra", "pathfinder").data.options.contour_length == 14
  c = config_lib.load_config("xiong", "retrieval")
  assert (c.model.num_layers, c.model.emb_dim, c.model.mlp_dim, c.model.pooling) == (2, 64, 128, "MEAN")
  assert (c.model.positions, c.model.embed_init_std) == ("learned", 0.02)   # model.py: both N(0, 0.02)
  assert (c.optimizer.learning_rate, c.optimizer.warmup_steps, c.num_train_steps) == (1e-4, 800, 30_000)
  schedule = optim.learning_rate_schedule(c.optimizer)
  lr = [float(schedule(s)) for s in (0, 400, 800, 15_400, 30_000)]
  np.testing.assert_allclose(lr, [0.0, 5e-5, 1e-4, 5e-5, 0.0], atol=1e-9)


@pytest.mark.timeout(300)  # subprocess(es)
def test_data_prepare_without_data_is_one_line(tmp_path):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TFDS_DATA_DIR=str(tmp_path / "none"))
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "data", "prepare", "text",
                         f"--data_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, env=env,
                        timeout=600)
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "no data" in errors[0] and "tfds build imdb_reviews" in errors[0]


def test_every_task_is_registered():
  assert tasks.list_tasks() == ["assoc_recall", "image", "in_context_recall", "induction_head", "listops", "mqar",
                                "noisy_in_context_recall", "pathfinder", "pathx", "retrieval", "text"]
