"""A learning regression is caught: `vanilla` trained under the `cpu` protocol on its ListOps (the run
`./run_all.sh` makes) must end significantly above what a model that cannot use token order reaches.

The criterion: the Wilson 95 % lower bound of the test accuracy (2000 examples) clears the majority
class rate by ``MARGIN`` (10 points, issue 23's bar). Measured (configs/cpu.py, seed 0): vanilla 32.0 %
[30.0, 34.1] against a majority of 15.25 %, so its lower bound clears majority + 10 by ~4.7 points; a
broken copy that returns the mean of the values at every query (a bag of tokens, everything else intact)
reaches 21.6 % [19.9, 23.5] and misses it by ~5 points. The second test trains that broken core and checks
the criterion rejects it, so the first one cannot pass for a model that stopped using attention.
"""

from __future__ import annotations

import collections
import dataclasses
import os

import jax.numpy as jnp
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench.experiments import cell
from lra_bench.report.accuracy import wilson_interval
from lra_bench.training import config as config_lib
from tasks import get_task

MARGIN = 0.10
BROKEN = "broken_mean_values"


@pytest.fixture(scope="module")
def cpu_listops(tmp_path_factory):
  """The `cpu` protocol's ListOps, generated as `lra-bench data prepare listops --protocol cpu` does."""
  root = str(tmp_path_factory.mktemp("lra_data"))
  prepare = dict(config_lib.load_config("cpu", "listops").data.prepare)
  get_task("listops").prepare(root, progress=False, **prepare)
  return root


def majority_rate(data_dir: str) -> float:
  with open(os.path.join(data_dir, "listops-1000", "cpu_test.tsv")) as f:
    labels = [line.rstrip("\n").split("\t")[-1] for line in f][1:]
  return max(collections.Counter(labels).values()) / len(labels)


def learned(record: dict, majority: float) -> tuple[bool, str]:
  low, high = wilson_interval(record["test_accuracy"], record["test_examples"])
  verdict = low >= majority + MARGIN
  return verdict, (f"{record['attention']}: test accuracy {record['test_accuracy']:.3f} [{low:.3f}, {high:.3f}] "
                   f"on {record['test_examples']} examples; majority {majority:.3f}, needed lower bound "
                   f">= {majority + MARGIN:.3f}")


def train(attention: str, data_dir: str, workdir: str) -> dict:
  config = config_lib.load_config("cpu", "listops", attention=attention)
  record = cell.train_cell(config, workdir, data_dir)
  assert record["status"] == "ok", record["error"]
  assert record["train_steps"] == config.num_train_steps == 100
  assert record["test_examples"] == 2000
  return record


def test_vanilla_learns_listops_under_the_cpu_protocol(cpu_listops, tmp_path):
  majority = majority_rate(cpu_listops)
  assert 0.10 < majority < 0.25, majority  # ten classes, MAX/MIN/MED/SM skew towards 0 and 9
  ok, why = learned(train("vanilla", cpu_listops, str(tmp_path / "vanilla")), majority)
  assert ok, why


@dataclasses.dataclass(frozen=True)
class _BrokenConfig(registry.AttentionConfig):
  pass


def _mean_of_values(query, key, value, mask, *, config):
  """Every query gets the mean of the real positions' values: no query-key interaction at all."""
  del query, key, config
  weights = mask[:, :, None, None].astype(value.dtype)
  mean = jnp.sum(value * weights, 1, keepdims=True) / jnp.maximum(jnp.sum(weights, 1, keepdims=True), 1.0)
  return jnp.broadcast_to(mean, value.shape).astype(value.dtype)


@pytest.fixture
def broken_core():
  registry.register_attention(BROKEN, _BrokenConfig)(_mean_of_values)
  yield BROKEN
  registry._REGISTRY.pop(BROKEN)
  assert BROKEN not in attention_zoo.list_attentions()


def test_the_criterion_rejects_a_core_that_stopped_attending(cpu_listops, tmp_path, broken_core):
  majority = majority_rate(cpu_listops)
  record = train(broken_core, cpu_listops, str(tmp_path / "broken"))
  ok, why = learned(record, majority)
  assert not ok, "a bag-of-tokens core passed the learning criterion: " + why
  assert record["test_accuracy"] > majority  # it does learn something (token counts): not a crash
