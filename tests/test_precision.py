"""Precision as users run it: ``precision="auto"`` (bfloat16 compute on GPU/TPU, float32 on the CPU), each
protocol's choice against what its original ran, the records' ``compute_dtype`` / ``matmul_precision`` /
``attention_implementation``, and a bfloat16 ListOps run that learns like the float32 one."""

from __future__ import annotations

import importlib
import inspect

import jax
import jax.numpy as jnp
import pytest

import attention_zoo
import configs
from attention_zoo import flash
from lra_bench.errors import ConfigError
from lra_bench.experiments import bench, cell, results
from lra_bench.training import config as config_lib
from lra_bench.training import models, steps
from tests.test_learning import cpu_listops, learned, majority_rate  # noqa: F401 - the fixture, by name
from tests.test_train import tiny_config

# protocol: (its preset's precision, the module that sets it, the original's file that comment names). "auto" where
# the original ran mixed / low precision (or on a TPU at its default matmul precision), "float32" where matching
# the paper needs it (docs/protocols.md, "Precision").
PRESETS = {
    "lra": ("auto", "lra", "lra_benchmarks/models/transformer/transformer.py"),
    "combiner": ("auto", "lra", "lra_benchmarks/models/transformer/transformer.py"),  # LRA's config, LRA's code
    "xiong": ("auto", "xiong", "LRA/code/run_tasks.py"),                 # float16 autocast
    "mad": ("auto", "mad", "mad/configs.py"),                            # MADConfig precision 'bf16'
    "s4": ("float32", "s4", "configs/trainer/default.yaml"),             # Lightning's default 32
    "s5": ("float32", "s5", "run_train.py"),
    "lru": ("float32", "lru", "NicolasZucchet/minimal-LRU"),
    "mega": ("float32", "mega", "examples/mega/README.lra.md"),          # fairseq without --fp16
    "zoology": ("float32", "zoology", "zoology/train.py"),               # no autocast
    "recall_cpu": ("float32", "recall_cpu", "configs/zoology.py"),       # CPU study, as zoology
    "seq_icl": ("float32", "seq_icl", "configs/trainer/default.yaml"),   # Lightning's default 32
    "smoke": ("float32", "smoke", "tests/test_learning.py"),             # CPU plumbing, float32 calibration
    "cpu": ("float32", "smoke", "docs/cpu_protocol.md"),                 # inherits smoke's
}


@pytest.mark.parametrize("platform, want", [("cpu", "float32"), ("gpu", "bfloat16"), ("tpu", "bfloat16"),
                                            ("metal", "float32")])
def test_auto_resolves_by_backend(monkeypatch, platform, want):
  monkeypatch.setattr(steps, "backend", lambda: platform)
  config = config_lib.load_config("lra", "listops")
  assert config.precision == "auto"
  assert steps.compute_dtype(config) == jnp.dtype(want)
  assert steps.precision_fields(config)["compute_dtype"] == want
  forced = config_lib.load_config("lra", "listops", ["precision=float32"])
  assert steps.compute_dtype(forced) == jnp.float32  # --set precision=float32 wins on every backend


def test_every_preset_states_its_precision_against_its_original():
  """A new protocol must be added to ``PRESETS``: its value, and the original's file named where it is set."""
  assert set(configs.list_protocols()) == set(PRESETS)
  for protocol, (value, module, original) in PRESETS.items():
    assert importlib.import_module(f"configs.{protocol}").get_config().precision == value, protocol
    source = inspect.getsource(importlib.import_module(f"configs.{module}"))
    assert original in source, f"configs/{module}.py does not name {original} ({protocol})"
    assert f'c.precision = "{value}"' in source, f"configs/{module}.py does not set precision {value!r}"


def test_a_bad_precision_is_one_config_error_line():
  with pytest.raises(ConfigError) as err:
    config_lib.load_config("smoke", "listops", ["precision=float16"])
  assert str(err.value) == "unknown precision 'float16'; expected one of auto, float32, bfloat16"


def test_matmul_precision_vocabulary(monkeypatch):
  assert steps.matmul_precision() == "default (cpu: float32)"
  with jax.default_matmul_precision("highest"):
    assert steps.matmul_precision() == "highest"
  assert steps.matmul_precision("tpu") == "default (tpu: bfloat16 passes)"


def test_flash_implementation_is_named_and_cudnn_is_checked(monkeypatch):
  model = tiny_config(**{"model.attention": "flash", "model.attention_dropout_rate": 0.1}).model
  dtype = jnp.float32
  assert models.attention_implementation(tiny_config().model, dtype, training=True) is None  # not flash
  # training with attention dropout: the explicit path, whatever the backend; evaluation: the dropout-free answer
  assert models.attention_implementation(model, dtype, training=True) == "explicit (training dropout)"
  evaluation = models.attention_implementation(model, dtype, training=False)
  if hasattr(flash, "resolve_implementation"):
    core = attention_zoo.layer_config("flash", dropout_rate=0.0)
    assert evaluation == flash.resolve_implementation(core, dtype) != "explicit (training dropout)"
  else:
    assert evaluation == "xla"  # the configured implementation (None: JAX 0.10's XLA path)
  monkeypatch.setattr(flash, "resolve_implementation", lambda core, dtype, backend=None: "cudnn", raising=False)
  assert models.attention_implementation(model, dtype, training=False, compiled_text="fusion") == \
      models.CUDNN_NOT_FOUND
  text = 'custom-call(...), custom_call_target="__cudnn$fmhaSoftmax"'
  assert models.attention_implementation(model, dtype, training=False, compiled_text=text) == "cudnn"


def test_bench_record_names_what_ran():
  config = bench.bench_config("flash", 32, batch_size=2, compile_only=True)
  record = results.bench_record(config, **bench.run_point(config, isolate=False))
  assert record["status"] == "ok", record["error"]
  assert (record["compute_dtype"], record["matmul_precision"]) == ("float32", "default (cpu: float32)")
  # the CPU has no fused kernel: flash trains with LRA's attention dropout, through the explicit path
  assert record["attention_dropout"] == 0.1
  assert record["attention_implementation"] == "explicit (training dropout)"


def test_bench_times_flash_without_attention_dropout_on_a_fused_kernel_device(monkeypatch):
  monkeypatch.setattr(steps, "backend", lambda: "gpu")
  train = bench.bench_config("flash", 32, batch_size=2, compile_only=True)
  assert train.model.attention_dropout_rate == 0.0 and results.attention_dropout(train) == 0.0
  assert bench.bench_config("vanilla", 32, batch_size=2).model.attention_dropout_rate == 0.1


def test_training_and_pretraining_records_name_what_ran(listops_dir, tmp_path):
  """A self-pretrained cell: the pretraining's record and the classifier's, both with flash's training dropout."""
  config = tiny_config(**{"model.attention": "flash", "model.attention_dropout_rate": 0.1, "precision": "auto",
                          "pretrain.objective": "masked", "pretrain.num_train_steps": 8})
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir, str(tmp_path / "results"))
  assert record["status"] == "ok", record["error"]
  written = results.load_records(str(tmp_path / "results"))
  assert [r.get("kind") for r in written] == ["pretrain", None] and written[-1] == record
  for each in written:
    assert (each["precision"], each["compute_dtype"]) == ("auto", "float32")
    assert each["matmul_precision"] == "default (cpu: float32)"
    assert each["attention_implementation"] == "explicit (training dropout)"


# The learning test: the `cpu` protocol's ListOps run (tests/test_learning.py: vanilla, 100 steps of batch 32,
# 2000 test examples) in float32 and in bfloat16, same seed and data. The tolerance: 5 points of accuracy, the
# difference the cpu protocol's 2000 test examples resolve (Wilson 95 % half-width <= 2.2 points, configs/cpu.py);
# bfloat16's 8-bit mantissa perturbs every step, so the two runs are two nearby trajectories, not one.
TOLERANCE = 0.05


def test_bfloat16_listops_learns_like_float32(cpu_listops, tmp_path):  # noqa: F811 - the fixture
  majority = majority_rate(cpu_listops)
  runs = {}
  for precision in ("float32", "bfloat16"):
    config = config_lib.load_config("cpu", "listops", [f"precision={precision}"], attention="vanilla")
    record = cell.train_cell(config, str(tmp_path / precision), cpu_listops)
    assert record["status"] == "ok", record["error"]
    assert record["compute_dtype"] == precision and record["test_examples"] == 2000
    runs[precision] = record
  f32, bf16 = runs["float32"]["test_accuracy"], runs["bfloat16"]["test_accuracy"]
  assert abs(bf16 - f32) <= TOLERANCE, (bf16, f32)
  ok, why = learned(runs["bfloat16"], majority)  # clearly above chance: the learning regression's own criterion
  assert ok, why
