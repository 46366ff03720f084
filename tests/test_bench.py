"""The efficiency benchmark: two tiny lengths end to end (subprocess per point), resume, compile-only
points, OOM and timeouts as data points."""

import dataclasses

import flax.linen as nn
import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench.experiments import bench, results

# A one-layer, 16-wide version of the Table 2 model: same code path, seconds to compile.
TINY = ["model.num_layers=1", "model.emb_dim=16", "model.qkv_dim=16", "model.mlp_dim=32", "model.num_heads=2"]


@pytest.mark.timeout(600)  # subprocess(es)
def test_two_lengths_end_to_end_and_resume(tmp_path, fast_compile):
  results_dir = str(tmp_path)
  summary = bench.run_bench([32, 64], "vanilla", results_dir=results_dir, batch_size=2, repeats=3,
                            warmup_steps=1, compile_only_from=64, overrides=TINY, progress=False)
  assert summary.counts == {"ok": 2}
  timed, compiled = sorted(results.load_records(results_dir), key=lambda r: r["max_length"])
  for r in (timed, compiled):
    assert r["kind"] == "bench" and r["mode"] == "train" and r["status"] == "ok"
    assert r["flops_per_step"] > 0 and r["compiled_memory_bytes"] > 0 and r["num_params"] > 0
    assert r["config"]["model"]["num_layers"] == 1 and r["batch_size"] == 2
  assert len(timed["step_seconds"]) == 3
  # The median of the recorded times (the times themselves: tests/test_timers.py, against a known cost).
  assert timed["step_seconds_median"] == pytest.approx(float(np.median(timed["step_seconds"])))
  assert compiled["compile_only"] and compiled["steps_per_second"] is None
  assert compiled["flops_per_step"] > timed["flops_per_step"]
  # A rerun measures nothing again.
  again = bench.run_bench([32, 64], "vanilla", results_dir=results_dir, batch_size=2, repeats=3,
                          warmup_steps=1, compile_only_from=64, overrides=TINY, progress=False)
  assert again.done_before == 2 and again.counts == {}
  assert len(results.load_records(results_dir)) == 2


@dataclasses.dataclass(frozen=True)
class FakeConfig(attention_zoo.AttentionConfig):
  pass


class OomAbove40(nn.Module):
  """Identity attention up to 40 tokens; beyond, the 'device' runs out of memory while tracing."""

  config: FakeConfig

  def __call__(self, query, key, value, mask=None, deterministic=True):
    if query.shape[1] > 40:
      raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0TiB (injected)")
    return value


def test_oom_is_a_data_point_in_process_inference(tmp_path, fast_compile):
  with registry.temporary({"test_oom_above_40": (OomAbove40, FakeConfig)}):
    summary = bench.run_bench([32, 64, 128], "test_oom_above_40", results_dir=str(tmp_path), batch_size=1,
                              mode="inference", repeats=2, warmup_steps=1, isolate=False, overrides=TINY,
                              progress=False)
  by_length = {r["max_length"]: r for r in summary.records}
  assert by_length[32]["status"] == "ok" and by_length[32]["mode"] == "inference"
  assert by_length[32]["steps_per_second"] > 0 and by_length[32]["flops_per_step"] > 0
  assert by_length[64]["status"] == "oom" and "RESOURCE_EXHAUSTED" in by_length[64]["error"]
  assert by_length[128]["status"] == "oom" and "not run" in by_length[128]["error"]


@pytest.mark.timeout(120)  # subprocess(es)
def test_timeout_is_a_failed_point(tmp_path):
  config = bench.bench_config("vanilla", 32, batch_size=1, overrides=TINY)
  out = bench.run_point(config, isolate=True, timeout_s=0.01)
  assert out["status"] == "failed" and "timeout" in out["error"]


def test_bad_mode_and_config_fail_clearly():
  with pytest.raises(ValueError, match="unknown mode"):
    bench.bench_config("vanilla", 32, mode="backward")
  with pytest.raises(ValueError, match="unknown config key"):
    bench.bench_config("vanilla", 32, overrides=["model.nope=1"])


def test_core_flops_script_slopes(fast_compile):
  """scripts/core_flops.py: vanilla's core FLOPs grow as L^2, axial's as L^1.5 (grid m = sqrt(L))."""
  import importlib.util
  import os

  import numpy as np

  path = os.path.join(os.path.dirname(__file__), os.pardir, "scripts", "core_flops.py")
  spec = importlib.util.spec_from_file_location("core_flops", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  lengths = [256, 1024]
  for name, expected in (("vanilla", 2.0), ("axial", 1.5)):
    flops = [module.core_flops(name, n) for n in lengths]
    slope = np.polyfit(np.log(lengths), np.log(flops), 1)[0]
    assert abs(slope - expected) < 0.1, (name, slope)


def test_device_peak_is_only_this_points():
  """The process-wide peak counter cannot be reset: a point gets it only if the point raised it."""
  assert bench.device_peak(None, None) is None          # CPU: the backend reports nothing
  assert bench.device_peak(0, 5_000) == 5_000            # a fresh process (isolated point)
  assert bench.device_peak(8_000, 8_000) is None         # in-process, below an earlier point's peak
  assert bench.device_peak(8_000, 9_000) == 9_000        # in-process, this point set the new peak


def test_memory_fields_in_process(tmp_path, fast_compile, monkeypatch):
  """Every point has XLA's compiled estimate; the measured peak comes from the device counter, and a
  point that did not raise it records None (never the previous point's number)."""
  from lra_bench.training import xla_stats

  readings = iter([0, 6_000, 6_000, 6_000])  # before/after point 1, before/after point 2
  monkeypatch.setattr(xla_stats, "peak_memory_bytes", lambda: next(readings))
  summary = bench.run_bench([32, 48], "vanilla", results_dir=str(tmp_path), batch_size=1, repeats=1,
                            warmup_steps=0, isolate=False, overrides=TINY, progress=False)
  first, second = sorted(summary.records, key=lambda r: r["max_length"])
  assert first["compiled_memory_bytes"] > 0 and second["compiled_memory_bytes"] > first["compiled_memory_bytes"]
  assert first["peak_memory_bytes"] == 6_000 and second["peak_memory_bytes"] is None
  assert first["peak_rss_bytes"] is None  # in-process: the host peak is the whole process's


# ----------------------------------------------------------------------------------------------------
# mode "core": the attention core alone, forward + backward


def _core_config(name, length, **kwargs):
  return bench.bench_config(name, length, mode="core", batch_size=1, **kwargs)


def test_core_mode_flops_scale_with_the_core(fast_compile):
  """XLA FLOPs of the core's forward + backward: vanilla's grow as L^2, the linear transformer's as L (4 heads
  of 64, as the LRA Text model gives them); compile-only points allocate nothing and time nothing."""
  lengths = [128, 256]
  for name, expected in (("vanilla", 2.0), ("linear_transformer", 1.0)):
    points = [bench.measure(_core_config(name, n, compile_only=True)) for n in lengths]
    assert all(p["compiled_memory_bytes"] > 0 and "step_seconds" not in p for p in points)
    slope = np.log(points[1]["flops_per_step"] / points[0]["flops_per_step"]) / np.log(lengths[1] / lengths[0])
    assert abs(slope - expected) < 0.1, (name, slope)


def test_core_step_is_the_gradient_of_the_core(fast_compile):
  """``core_step`` jitted = d sum(out * cotangent) / d(params, q, k, v): for vanilla without attention
  dropout, the value gradient is P^T @ cotangent per head (P the softmax weights, computed here by hand);
  with the protocol's attention dropout (0.1 on Text) it is not, as in training; a core with parameters
  gets a gradient of each, shaped as the parameter."""
  import jax

  rng = np.random.default_rng(0)
  q, k, v, ct = (rng.standard_normal((2, 16, 4, 64)).astype(np.float32) for _ in range(4))
  mask = np.ones((2, 16), bool)
  rngs = {"dropout": jax.random.key(1), "attention": jax.random.key(2)}
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(64)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  expected = np.einsum("bhqk,bqhd->bkhd", weights, ct)
  grad_v = {}
  for rate in (0.0, None):
    config = _core_config("vanilla", 16, overrides=[] if rate is None else [f"model.attention_dropout_rate={rate}"])
    (grad_params, grad_q, grad_k, grad_v[rate]), state = jax.jit(bench.core_step(bench.create_core(config)))(
        {}, q, k, v, {}, mask, ct, rngs)
    assert grad_params == {} and state == {}
    assert grad_q.shape == grad_k.shape == grad_v[rate].shape == (2, 16, 4, 64)
  assert _core_config("vanilla", 16).model.attention_dropout_rate > 0
  np.testing.assert_allclose(grad_v[0.0], expected, rtol=2e-4, atol=2e-4)
  assert np.abs(grad_v[None] - expected).max() > 1e-2  # dropout on: some weights dropped, the rest scaled

  core = bench.create_core(_core_config("linformer", 32))
  q, k, v, ct = (rng.standard_normal((1, 32, 4, 64)).astype(np.float32) for _ in range(4))
  variables = core.init({"params": jax.random.key(0), **rngs}, q, k, v, mask=np.ones((1, 32), bool))
  (grad_params, *_), _ = jax.jit(bench.core_step(core))(variables["params"], q, k, v, {}, np.ones((1, 32), bool),
                                                        ct, rngs)
  shapes = jax.tree.map(lambda x: x.shape, variables["params"])
  assert shapes and jax.tree.map(lambda x: x.shape, grad_params) == shapes


def test_core_sweep_records_and_resume(tmp_path, fast_compile):
  """``run_bench(mode="core")`` in-process: one ``bench`` record per point with mode ``core``, the timed
  steps, the core's own parameter count (linformer: its length projections, which grow with L); a rerun
  measures nothing again."""
  kwargs = dict(results_dir=str(tmp_path), batch_size=1, mode="core", repeats=2, warmup_steps=1, isolate=False,
                overrides=TINY, progress=False)
  summary = bench.run_bench([32, 64], "vanilla,linformer", **kwargs)
  assert summary.counts == {"ok": 4}
  by_point = {(r["attention"], r["max_length"]): r for r in results.load_records(str(tmp_path))}
  for r in by_point.values():
    assert r["kind"] == "bench" and r["mode"] == "core" and r["status"] == "ok" and r["batch_size"] == 1
    assert len(r["step_seconds"]) == 2 and r["flops_per_step"] > 0 and r["compiled_memory_bytes"] > 0
  assert by_point[("vanilla", 32)]["num_params"] == 0
  assert 0 < by_point[("linformer", 32)]["num_params"] < by_point[("linformer", 64)]["num_params"]
  assert by_point[("vanilla", 64)]["flops_per_step"] > 3 * by_point[("vanilla", 32)]["flops_per_step"]
  again = bench.run_bench([32, 64], "vanilla,linformer", **kwargs)
  assert again.done_before == 4 and again.counts == {}


def test_core_forward_mode_on_the_command_line(tmp_path, fast_compile, capsys):
  """``lra-bench bench --mode core_forward``: the core's forward alone (vanilla; lru, a sequence mixer timed
  whole), one record per point beside the core mode's (another config hash), timed, with fewer XLA FLOPs
  than the same point's forward + backward (a property of the two compiled programs, not of a clock)."""
  from lra_bench import cli

  for mode in ("core_forward", "core"):
    args = cli.parse(["lra-bench", "bench", f"--mode={mode}", "--attentions=vanilla,lru", "--lengths=64",
                      "--batch_size=1", "--repeats=2", "--warmup_steps=1", "--noisolate",
                      f"--results_dir={tmp_path}", *[f"--set={item}" for item in TINY]])
    assert cli.main(args) == 0
    assert "2 ok" in capsys.readouterr().out
  by_point = {(r["attention"], r["mode"]): r for r in results.load_records(str(tmp_path))}
  assert len(by_point) == 4
  for name in ("vanilla", "lru"):
    forward, both = by_point[(name, "core_forward")], by_point[(name, "core")]
    assert forward["kind"] == "bench" and forward["status"] == "ok" and forward["max_length"] == 64
    assert len(forward["step_seconds"]) == 2 and forward["step_seconds_median"] > 0
    assert forward["config_hash"] != both["config_hash"]
    assert forward["num_params"] == both["num_params"]  # the same core, the same variables
    assert forward["attention_dropout"] == both["attention_dropout"]  # deterministic=False in both modes
    assert 0 < forward["flops_per_step"] < both["flops_per_step"], name
    assert 0 < forward["compiled_memory_bytes"]


def test_flash_on_a_fused_kernel_device_runs_without_dropout_in_both_core_modes(monkeypatch):
  """Both core modes call the core with deterministic=False, so on a device with a fused kernel flash is timed
  without attention dropout in each (the same flash forward and forward + backward); inference keeps the rate
  (it runs none)."""
  monkeypatch.setattr(bench, "fused_kernel_device", lambda: True)
  rate = {mode: bench.bench_config("flash", 64, mode=mode).model.attention_dropout_rate for mode in bench.MODES}
  assert rate["core"] == rate["core_forward"] == rate["train"] == 0.0 and rate["inference"] > 0


def test_kwargs_of_times_each_layer_in_the_form_its_protocol_trains(tmp_path, fast_compile):
  """``kwargs_of="cpu"``: a layer of ``configs/cpu.py`` RECURRENT_ON_CPU is timed in its token-by-token form
  (a point of its own, labelled "(recurrent)" in the report), any other layer as without it; the side-by-side
  workers are given the flag; an unknown protocol is one clear error."""
  from lra_bench.report import efficiency

  assert bench.bench_config("mamba", 64, mode="core", kwargs_of="cpu").model.attention_kwargs.mode == "recurrent"
  assert "mode" not in bench.bench_config("mamba", 64, mode="core").model.attention_kwargs
  for name in ("vanilla", "lru", "mlstm"):  # not recurrent on the cpu: the encoder settings only
    assert (bench.bench_config(name, 64, kwargs_of="cpu").model.attention_kwargs.to_dict()
            == bench.bench_config(name, 64).model.attention_kwargs.to_dict()), name
  with pytest.raises(ValueError, match="--kwargs_of 'nope': no such protocol"):
    bench.bench_config("vanilla", 64, kwargs_of="nope")
  argv = dict(lengths=[32], batch_size=1, mode="core", warmup_steps=1, repeats=1, compile_only=False,
              compile_only_from=None, timeout_s=None, isolate=False, overrides=(), results_dir=str(tmp_path))
  assert "--kwargs_of=cpu" in bench.worker_command(["mamba"], **argv, kwargs_of="cpu")
  assert not any(a.startswith("--kwargs_of") for a in bench.worker_command(["mamba"], **argv))

  kwargs = dict(results_dir=str(tmp_path), batch_size=1, mode="core", repeats=1, warmup_steps=0, isolate=False,
                overrides=TINY, progress=False)
  assert bench.run_bench([32], "rg_lru", kwargs_of="cpu", **kwargs).counts == {"ok": 1}
  assert bench.run_bench([32], "rg_lru", **kwargs).counts == {"ok": 1}  # the other form: another point
  labels = sorted(efficiency.point_label(r) for r in results.load_records(str(tmp_path)))
  assert labels == ["rg_lru", "rg_lru (recurrent)"]


def test_core_variables_are_initialised_once_per_core(fast_compile, monkeypatch):
  """A core whose variables keep their shapes across lengths (rfa: learned feature scales) is initialised
  once for the sweep; one whose variables grow with L (linformer) again at each length."""
  calls = []
  original = bench._core_variables

  def counting(core, key, abstract, init):
    return original(core, key, abstract, lambda: calls.append(key) or init())

  monkeypatch.setattr(bench, "_core_variables", counting)
  bench._INIT_CACHE.clear()
  for name in ("rfa", "linformer"):
    for length in (32, 64):
      bench.measure(_core_config(name, length, repeats=1, warmup_steps=0, overrides=TINY))
  assert [key[0].split("(")[0] for key in calls] == ["RFAConfig", "LinformerConfig", "LinformerConfig"]


def test_every_builtin_core_declares_a_family():
  """Each built-in core names its family (the report's panels); a core that declares none, as a plugin
  may, is "other", and so is a name that is not registered."""
  from attention_zoo.registry import FAMILIES, attention_family

  for name in attention_zoo.list_attentions():
    if attention_zoo.defining_module(name).startswith("attention_zoo."):
      assert attention_family(name) in FAMILIES and attention_family(name) != "other", name
  with registry.temporary({"test_no_family": (OomAbove40, FakeConfig)}):
    assert attention_family("test_no_family") == "other"
  assert attention_family("not_registered_anywhere") == "other"
  assert attention_family("vanilla") == attention_family("flash") == "exact"
