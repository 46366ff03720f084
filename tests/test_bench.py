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
