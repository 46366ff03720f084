"""The suite runner: skip of done cells, resume after an interruption, failures and missing data as
records, the per-cell claim, and two concurrent suites on one results dir."""

import dataclasses
import os
import threading
import time

import flax.linen as nn
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench.experiments import grid, results, suite
from tests.conftest import tiny_overrides

BEHAVIOUR = {"test_interrupt": KeyboardInterrupt}


@dataclasses.dataclass(frozen=True)
class FakeConfig(attention_zoo.AttentionConfig):
  pass


class Failing(nn.Module):
  """A core that fails as soon as it is traced."""

  config: FakeConfig

  def __call__(self, query, key, value, mask=None, deterministic=True):
    raise RuntimeError("test_failing: injected failure")


class Interrupting(nn.Module):
  """A core that raises ``BEHAVIOUR["test_interrupt"]`` when traced (a Ctrl-C by default)."""

  config: FakeConfig

  def __call__(self, query, key, value, mask=None, deterministic=True):
    raise BEHAVIOUR["test_interrupt"]("test_interrupt: injected failure")


@pytest.fixture
def fake_attentions():
  with registry.temporary({"test_interrupt": (Interrupting, FakeConfig),
                           "test_failing": (Failing, FakeConfig)}) as names:
    yield names


def _by_attention(results_dir):
  return {r["attention"]: r for r in results.latest_records(results.load_records(results_dir))}


def test_skip_resume_and_failures_become_records(listops_dir, fake_attentions, tmp_path, fast_compile):
  results_dir = str(tmp_path / "results")
  kwargs = dict(tasks="listops", attentions="vanilla,test_interrupt,test_failing", seeds="0",
                results_dir=results_dir, progress=False,
                overrides=tiny_overrides(num_train_steps=8, eval_every=8, checkpoint_every=8))

  # 1. No data yet: every cell is a no_data record naming the fix.
  summary = suite.run_suite("smoke", data_dir=str(tmp_path / "empty"), **kwargs)
  assert len(summary.ran["no_data"]) == 3
  assert "lra-bench data prepare listops" in _by_attention(results_dir)["vanilla"]["error"]

  # 2. With data, no_data cells are retried; the suite is interrupted in its second cell.
  with pytest.raises(KeyboardInterrupt):
    suite.run_suite("smoke", data_dir=listops_dir, **kwargs)
  assert _by_attention(results_dir)["vanilla"]["status"] == "ok"
  assert _by_attention(results_dir)["test_interrupt"]["status"] == "no_data"

  # 3. Rerun: the finished cell is skipped, the suite goes on where it stopped, failures are recorded.
  BEHAVIOUR["test_interrupt"] = ValueError
  try:
    summary = suite.run_suite("smoke", data_dir=listops_dir, **kwargs)
  finally:
    BEHAVIOUR["test_interrupt"] = KeyboardInterrupt
  assert summary.done_before == ["listops/vanilla/seed0"]
  assert sorted(summary.ran["failed"]) == ["listops/test_failing/seed0", "listops/test_interrupt/seed0"]
  latest = _by_attention(results_dir)
  assert latest["test_failing"]["status"] == "failed"
  assert "test_failing: injected failure" in latest["test_failing"]["error"]
  assert "ValueError" in latest["test_interrupt"]["error"]

  # 4. Without retry_failed nothing runs; nothing is ever recorded twice for the ok cell.
  summary = suite.run_suite("smoke", data_dir=listops_dir, retry_failed=False, **kwargs)
  assert summary.ran == {} and len(summary.done_before) == 3
  records = results.load_records(results_dir)
  assert [r["status"] for r in records if r["attention"] == "vanilla"] == ["no_data", "ok"]
  assert len(records) == 3 + 1 + 2
  workdir = latest["vanilla"]["workdir"]
  assert os.path.relpath(workdir, results_dir).startswith(os.path.join("runs", "smoke", "listops", "vanilla",
                                                                       "seed0_"))
  assert os.path.exists(os.path.join(workdir, "train.log"))


def test_claimed_cell_is_left_to_the_other_suite(listops_dir, tmp_path):
  results_dir = str(tmp_path / "results")
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], results_dir, tiny_overrides())
  with suite.claim(results_dir, cells[0]) as mine:
    assert mine
    summary = suite.run_suite("smoke", "listops", "vanilla", "0", results_dir=results_dir,
                              data_dir=listops_dir, overrides=tiny_overrides(), progress=False)
  assert summary.claimed_elsewhere == ["listops/vanilla/seed0"] and summary.ran == {}
  assert results.load_records(results_dir) == []


def test_unknown_names_and_tasks_without_config(tmp_path):
  with pytest.raises(ValueError, match="unknown attention 'nope'"):
    suite.run_suite("smoke", attentions="nope", results_dir=str(tmp_path), data_dir=str(tmp_path))
  assert grid.parse_ints("0, 1,2") == [0, 1, 2]


class OutOfMemory(nn.Module):
  """A core that takes a moment, then runs out of memory (a terminal outcome: never retried)."""

  config: FakeConfig

  def __call__(self, query, key, value, mask=None, deterministic=True):
    time.sleep(0.2)
    raise RuntimeError("RESOURCE_EXHAUSTED: test_oom: injected out of memory")


@pytest.mark.timeout(600)  # threads that must not wait forever
def test_two_concurrent_suites_never_duplicate(listops_dir, tmp_path):
  """Two suites (threads: flock treats each open() as its own lock holder, like two processes) on one
  results dir and one grid: every cell is run and recorded exactly once."""
  results_dir = str(tmp_path / "results")
  summaries, errors = [], []

  def one_suite():
    try:
      summaries.append(suite.run_suite("smoke", "listops", "test_oom", "0,1,2,3", results_dir=results_dir,
                                       data_dir=listops_dir, overrides=tiny_overrides(), progress=False))
    except BaseException as err:  # noqa: BLE001
      errors.append(err)

  with registry.temporary({"test_oom": (OutOfMemory, FakeConfig)}):
    threads = [threading.Thread(target=one_suite) for _ in range(2)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=300)
  assert not errors, errors
  records = results.load_records(results_dir)
  assert sorted(r["seed"] for r in records) == [0, 1, 2, 3]
  assert {r["status"] for r in records} == {"oom"}
  ran = [name for s in summaries for names in s.ran.values() for name in names]
  assert sorted(ran) == sorted(set(ran)) and len(ran) == 4
  assert len(ran) + sum(len(s.claimed_elsewhere) + len(s.done_before) for s in summaries) == 8
