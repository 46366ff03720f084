"""The benchmark's timer and the train loop's step timer measure the computation, not its dispatch.

A jitted call returns as soon as its work is queued; only ``block_until_ready`` (or reading a result)
waits for it. Each test times a computation of known cost (a chain of 256 x 256 matmuls, ~10-50 ms on
a CPU core, whose cost the test measures itself, synchronised) through the code under test and compares
the ratio, generously: a timer that stops at the dispatch reads ~100x less. No absolute thresholds.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import attention_zoo
from attention_zoo import registry
from lra_bench.experiments import bench, cell
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides
from tests.test_numbers_right import scripted_steps

SIDE, ROUNDS = 256, 120


def _chain(x):
  """ROUNDS dependent 256 x 256 matmuls: a computation of fixed cost."""
  return jax.lax.fori_loop(0, ROUNDS, lambda i, y: jnp.tanh(y @ y * (1.0 / SIDE)), x)


HEAVY = jax.jit(_chain)
START = jnp.full((SIDE, SIDE), 0.5, jnp.float32)


def _synchronised_seconds(fn, *args, repeats: int = 3) -> float:
  """Median seconds of ``fn(*args)`` run to completion (after one warm-up call)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def test_dispatch_alone_is_much_faster_than_the_computation():
  """The premise of the tests below, on this machine: an unsynchronised call returns long before the
  work is done."""
  cost = _synchronised_seconds(HEAVY, START)
  dispatches = []
  for _ in range(3):
    start = time.perf_counter()
    out = HEAVY(START)
    dispatches.append(time.perf_counter() - start)
    jax.block_until_ready(out)
  assert min(dispatches) < 0.2 * cost, (dispatches, cost)


def test_bench_time_steps_times_the_computation(monkeypatch):
  cost = _synchronised_seconds(HEAVY, START)
  step = lambda x: (x, HEAVY(x))
  times = bench.time_steps(step, START, warmup_steps=1, repeats=3)
  assert len(times) == 3 and 0.25 < statistics.median(times) / cost < 4.0, (times, cost)
  # The broken variant: without the synchronisation the same timer reads the dispatch.
  monkeypatch.setattr(jax, "block_until_ready", lambda x: x)
  unsynced = bench.time_steps(step, START, warmup_steps=1, repeats=3)
  assert statistics.median(unsynced) / cost < 0.25, (unsynced, cost)


@dataclasses.dataclass(frozen=True)
class HeavyConfig(attention_zoo.AttentionConfig):
  pass


class HeavyIdentity(nn.Module):
  """Returns the values, after a computation of known cost that the output depends on (in a way XLA
  cannot fold away: the scale is 1 + 1e-30 * sum, exactly 1 in float32)."""

  config: HeavyConfig

  def __call__(self, query, key, value, mask=None, deterministic=True):
    scale = 1.0 + 1e-30 * jnp.sum(_chain(START + jnp.mean(value)))
    return value * scale


def test_bench_point_times_the_computation(tmp_path, fast_compile):
  """``bench.measure`` (what every point runs) on a model whose attention costs at least the chain:
  the median step is at least a good fraction of the chain's own synchronised time."""
  cost = _synchronised_seconds(jax.jit(lambda v: _chain(START + jnp.mean(v))), START)
  overrides = ["model.num_layers=1", "model.emb_dim=16", "model.qkv_dim=16", "model.mlp_dim=32",
               "model.num_heads=2"]
  with registry.temporary({"test_heavy_identity": (HeavyIdentity, HeavyConfig)}):
    config = bench.bench_config("test_heavy_identity", 32, batch_size=1, mode="inference", warmup_steps=1,
                                repeats=3, overrides=overrides)
    out = bench.measure(config)
  assert out["step_seconds_median"] > 0.4 * cost, (out["step_seconds"], cost)


def test_train_loop_step_timer_times_the_computation(listops_dir, tmp_path, monkeypatch):
  """The loop's steps/s with a train step of known cost: its state (the step counter) is the output of
  the chain, its metrics are ready at once, so only waiting for the state makes the timer see the work.
  6 steps, the first untimed: steps/s x cost must be about 1 (dispatch only: ~100)."""
  @jax.jit
  def chained_step(step, x):  # step + 1, once the chain is done
    return step + jnp.where(jnp.isnan(jnp.sum(_chain(x))), 0, 1).astype(step.dtype)

  cost = _synchronised_seconds(chained_step, jnp.asarray(0, jnp.int32), START)

  def make_step(initial):
    def step(state, batch):
      metrics = {"loss": np.float32(1.0), "accuracy": np.float32(0.0), "grad_norm": np.float32(0.0)}
      return state.replace(step=chained_step(state.step, START)), metrics
    return step

  scripted_steps(monkeypatch, make_step)
  config = config_lib.load_config("smoke", "listops", tiny_overrides(
      num_train_steps=6, eval_every=6, checkpoint_every=6, log_every=6))
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir)
  assert record["status"] == "ok", record["error"]
  assert record["train_steps"] == 6
  assert 0.25 < record["steps_per_second"] * cost < 4.0, (record["steps_per_second"], cost)
