"""The commands that read no data run where TensorFlow is not installed (accelerator images ship jax
without it): ``list``, ``bench``, ``report``, ``viz``, ``check``, the attention cores and their tests.

Each case runs in a subprocess whose ``sitecustomize`` puts a finder first on ``sys.meta_path`` that
refuses ``tensorflow`` and ``tensorflow_datasets`` (as if they were not installed) and writes every
attempt to a log, so an import that some code catches and works around is caught here too: the log of
every case must stay empty. Reading data without TensorFlow fails with one line naming the extra.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A one-layer, 16-wide version of the Table 2 model (as tests/test_bench.py): seconds to compile.
TINY = ["model.num_layers=1", "model.emb_dim=16", "model.qkv_dim=16", "model.mlp_dim=32", "model.num_heads=2"]

BLOCKER = '''
import importlib.abc
import json
import os
import sys
import traceback

HIDDEN = ("tensorflow", "tensorflow_datasets")


class NoTensorFlow(importlib.abc.MetaPathFinder):
  """Refuses TensorFlow and TFDS as if they were not installed, and logs who asked."""

  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] not in HIDDEN:
      return None
    with open(os.environ["NO_TF_LOG"], "a") as log:
      log.write(f"import {name}\\n{''.join(traceback.format_stack(limit=8)[:-1])}\\n")
    raise ModuleNotFoundError(f"No module named {name!r} (hidden by tests/test_no_tensorflow.py)", name=name)


for _name in [m for m in sys.modules if m.split(".")[0] in HIDDEN]:
  del sys.modules[_name]
if os.environ.get("NO_TF_ABSENT"):
  # As if not installed for lookups too: importlib.util.find_spec answers None (the finder above raises,
  # which etils' "is TensorFlow installed?" lookup in orbax does not expect); attempts are not logged.
  for _name in HIDDEN:
    sys.modules[_name] = None
else:
  sys.meta_path.insert(0, NoTensorFlow())
'''


@pytest.fixture
def no_tf(tmp_path):
  """``run(args, ...)``: runs ``python args`` with TensorFlow hidden; (process, attempted imports)."""
  site = tmp_path / "no_tf_site"
  site.mkdir()
  (site / "sitecustomize.py").write_text(BLOCKER)
  log = tmp_path / "tf_imports.log"

  def run(args, timeout=600, **env):
    log.write_text("")
    environ = dict(os.environ, NO_TF_LOG=str(log), JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1",
                   PYTHONPATH=os.pathsep.join([str(site), ROOT]), **env)
    # Without the test run's compilation cache (conftest; an empty value turns it off, also for a pytest
    # started here): JAX opens a cache folder through etils, which asks importlib whether TensorFlow
    # exists (a lookup, not an import, but this blocker logs both).
    environ["JAX_COMPILATION_CACHE_DIR"] = ""
    proc = subprocess.run([sys.executable, *args], cwd=str(tmp_path), env=environ, capture_output=True,
                          text=True, timeout=timeout)
    return proc, log.read_text()

  return run


def cli(*words):
  return ["-m", "lra_bench", *words]


def _ok(proc, attempts):
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert attempts == "", f"TensorFlow was imported:\n{attempts[:3000]}"


@pytest.mark.timeout(120)
def test_the_blocker_hides_tensorflow(no_tf):
  """Without this the other cases could pass for the wrong reason."""
  proc, attempts = no_tf(["-c", "import tensorflow"])
  assert proc.returncode != 0 and "hidden by tests/test_no_tensorflow.py" in proc.stderr
  assert attempts.startswith("import tensorflow")


@pytest.mark.timeout(300)
def test_list_without_tensorflow(no_tf):
  proc, attempts = no_tf(cli("list"))
  _ok(proc, attempts)
  assert "vanilla" in proc.stdout and "listops" in proc.stdout


@pytest.mark.timeout(600)
def test_bench_and_report_without_tensorflow(no_tf, tmp_path):
  results_dir, out = str(tmp_path / "bench"), str(tmp_path / "report")
  sets = [word for item in TINY for word in ("--set", item)]
  proc, attempts = no_tf(cli("bench", "--lengths", "32", "--attentions", "vanilla", "--batch_size", "1",
                             "--repeats", "1", "--warmup_steps", "0", "--noisolate", "--results_dir", results_dir,
                             *sets))
  _ok(proc, attempts)
  assert "1 ok" in proc.stdout
  # The report as `lra-bench report` writes it, but probing one core's pattern instead of all of them
  # (minutes on CPU; the cores themselves are covered below).
  proc, attempts = no_tf(["-c", "import sys; from lra_bench.report import index; "
                          "index.write_report(sys.argv[1], sys.argv[2], attention_length=16, "
                          "attention_names=['vanilla'])", results_dir, out])
  _ok(proc, attempts)
  with open(os.path.join(out, "index.md")) as f:
    assert "vanilla" in f.read()


@pytest.mark.timeout(300)
def test_viz_without_tensorflow(no_tf, tmp_path):
  out = str(tmp_path / "vanilla.png")
  proc, attempts = no_tf(cli("viz", "attention", "vanilla", "--length", "16", "--out", out))
  _ok(proc, attempts)
  assert os.path.getsize(out) > 0


CORES = """
import jax.numpy as jnp
import attention_zoo
from lra_bench.testing import init_and_apply

names = attention_zoo.list_attentions()
for name in names:  # every core's module is imported and its module built
  attention_zoo.create_attention(name)
q = k = v = jnp.ones((1, 16, 2, 8))
out, _ = init_and_apply(attention_zoo.create_attention("vanilla"), q, k, v)
assert out.shape == (1, 16, 2, 8)
print(len(names), "cores")
"""


@pytest.mark.timeout(300)
def test_every_core_imports_and_one_applies_without_tensorflow(no_tf):
  proc, attempts = no_tf(["-c", CORES])
  _ok(proc, attempts)
  assert int(proc.stdout.split()[-2]) >= 2


def _core_test_files() -> list[str]:
  """The attention cores' own tests: named after a module of attention_zoo (``test_x.py`` for a helper
  ``_x.py``), plus the registry-wide ones."""
  modules = {name[:-3].removeprefix("_") for name in os.listdir(os.path.join(ROOT, "attention_zoo"))
             if name.endswith(".py")}
  tests = sorted(name for name in os.listdir(os.path.join(ROOT, "tests"))
                 if name.startswith("test_") and name.endswith(".py") and name[5:-3] in modules)
  registry_wide = [name for name in ("test_attention_registry.py", "test_attention_kernels.py", "test_combiner.py")
                   if os.path.exists(os.path.join(ROOT, "tests", name))]
  return [os.path.join(ROOT, "tests", name) for name in registry_wide + tests]


@pytest.mark.timeout(600)
def test_core_tests_import_and_run_without_tensorflow(no_tf):
  """Every core test module imports without TensorFlow (collection), and vanilla's tests pass."""
  files = _core_test_files()
  assert len(files) > 3
  pytest_args = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--rootdir", ROOT]
  proc, attempts = no_tf([*pytest_args, "--collect-only", *files])
  _ok(proc, attempts)
  proc, attempts = no_tf([*pytest_args, os.path.join(ROOT, "tests", "test_vanilla.py")])
  _ok(proc, attempts)
  assert " passed" in proc.stdout


@pytest.mark.timeout(300)
def test_reading_data_without_tensorflow_names_the_extra(no_tf, tmp_path):
  """ListOps generation is plain Python; reading data through tf.data needs the ``data`` extra, and the
  message says so (for generated data it also names the numpy pipeline)."""
  data_dir = str(tmp_path / "data")
  proc, attempts = no_tf(cli("data", "prepare", "listops", "--num_train", "4", "--num_val", "2", "--num_test", "2",
                             "--min_length", "10", "--max_expression_length", "40", "--data_dir", data_dir))
  _ok(proc, attempts)
  proc, _ = no_tf(cli("data", "prepare", "text", "--data_dir", data_dir))
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert "lra-bench[data]" in proc.stderr and "Traceback" not in proc.stderr
  # training on generated data: the message also names the pipeline that needs no TensorFlow
  proc, _ = no_tf(cli("train", "--task", "listops", "--protocol", "smoke", "--workdir", str(tmp_path / "run"),
                      "--data_dir", data_dir, "--set", "data.max_length=48", "--set", "data.options.name=basic"),
                  NO_TF_ABSENT="1")
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert proc.stderr.strip().splitlines()[-1].endswith(
      "lra-bench[data]' (tensorflow-cpu, tensorflow-datasets); or read the listops data without TensorFlow: "
      "--set data.pipeline=numpy"), proc.stderr[-3000:]


@pytest.mark.timeout(600)
def test_check_without_tensorflow(no_tf, tmp_path):
  proc, attempts = no_tf(cli("check", "vanilla", "--quick", "--lengths", "32,64", "--out", str(tmp_path / "check")))
  _ok(proc, attempts)


@pytest.mark.timeout(600)
def test_training_with_the_numpy_pipeline_without_tensorflow(no_tf, tmp_path):
  """ListOps generated and trained where TensorFlow is not installed (an accelerator image): the numpy
  input pipeline, and TensorBoard events written by the tensorboard package alone, read back as the
  record's validation curve. TensorFlow is absent here as an uninstalled package is (``NO_TF_ABSENT``):
  orbax asks whether it is installed, and the tensorboard package falls back to its own stub."""
  data_dir, results = str(tmp_path / "data"), str(tmp_path / "results")
  proc, attempts = no_tf(cli("data", "prepare", "listops", "--name", "tiny", "--num_train", "40", "--num_val", "8",
                             "--num_test", "8", "--min_length", "10", "--max_expression_length", "40",
                             "--data_dir", data_dir))
  _ok(proc, attempts)
  sets = ["data.pipeline=numpy", "data.options.name=tiny", "data.max_length=48", "batch_size=4",
          "num_train_steps=8", "eval_every=4", "checkpoint_every=4", "log_every=4", "model.num_layers=1",
          "model.emb_dim=16", "model.qkv_dim=16", "model.mlp_dim=32"]
  proc, _ = no_tf(["-c", "import tensorflow"], NO_TF_ABSENT="1")
  assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr   # the blocker works in this mode
  proc, _ = no_tf(cli("train", "--task", "listops", "--protocol", "smoke", "--workdir", str(tmp_path / "run"),
                      "--data_dir", data_dir, "--results_dir", results, *[f"--set={s}" for s in sets]),
                  NO_TF_ABSENT="1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(results, "results.jsonl")) as f:
    record = json.loads(f.readline())
  assert record["status"] == "ok" and record["config"]["data"]["pipeline"] == "numpy"
  assert [step for step, _ in record["val_curve"]] == [4, 8]
