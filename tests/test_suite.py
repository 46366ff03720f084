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

  # 5. Another logging or checkpoint cadence (--set log_every / checkpoint_every) names the same cells.
  cadence = {**kwargs, "attentions": "vanilla",
             "overrides": [*kwargs["overrides"], "log_every=3", "checkpoint_every=5"]}
  summary = suite.run_suite("smoke", data_dir=listops_dir, **cadence)
  assert summary.ran == {} and summary.done_before == ["listops/vanilla/seed0"]
  assert len(results.load_records(results_dir)) == 3 + 1 + 2


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


# The console: a task without data is one line (run and summary), failed / oom cells are named, lists are cut.

FOUR = "vanilla,local,performer,linformer"


def _output_lines(capsys) -> list[str]:
  return capsys.readouterr().out.splitlines()


def test_missing_data_is_one_line_per_task_in_the_run_and_the_summary(tmp_path, capsys):
  """4 attentions x 2 tasks without data: one line per task as the grid runs, one per task in the
  summary (its cell count and the fix), no cell named anywhere; a resume says the same."""
  kwargs = dict(results_dir=str(tmp_path / "results"), data_dir=str(tmp_path / "empty"), progress=False)
  for attempt in ("first", "resume"):  # the resume reruns the no_data cells and reads their records
    summary = suite.run_suite("smoke", "listops,pathfinder", FOUR, "0", **kwargs)
    run = _output_lines(capsys)
    assert [line.split(":")[0] for line in run] == ["listops", "pathfinder"], (attempt, run)
    assert run[0].startswith("listops: no_data (shown once for the task; the summary counts its cells): ")
    lines = summary.lines()
    assert lines[0].endswith("8 cells: 8 no_data (ran now 8, already done 0)"), lines
    for line, task in zip(lines[1:], ["listops", "pathfinder"], strict=True):
      assert line.startswith(f"no_data: {task} (4 cells): {task.replace('listops', 'ListOps')} data not found")
      assert line.endswith(f"with: lra-bench data prepare {task} --protocol smoke --data_dir {tmp_path / 'empty'}")
    assert not any("/seed0" in line for line in run + lines) and summary.exit_code() == 0


def _fake_run_cell(statuses: dict[str, str]):
  """A ``suite.run_cell`` that trains nothing and records nothing: the record of ``statuses[task]``
  (``failed/oom``: every 7th cell ``oom``, the others ``failed``)."""
  count = []

  def run_cell(cell, data_dir, results_dir, **kwargs):
    count.append(cell.name)
    status = statuses[cell.task]
    if status == "failed/oom":
      status = "oom" if len(count) % 7 == 0 else "failed"
    error = (f"{cell.task} data not found: nothing in {data_dir}.\nPrepare it with:\n  lra-bench data prepare "
             f"{cell.task}" if status == "no_data" else f"RuntimeError: {cell.attention} broke\nline 2")
    return {"task": cell.task, "attention": cell.attention, "seed": cell.seed, "status": status, "error": error}

  return run_cell


def test_failed_cells_keep_their_lines_and_no_data_is_one_line_per_task(tmp_path, monkeypatch):
  """``work`` (every launcher's loop): 14 listops cells failed or oom, one line each naming the cell;
  14 pathfinder cells without data, one line; the summary names the failed cells, the first 10."""
  results_dir = str(tmp_path / "results")
  attentions = attention_zoo.list_attentions()[:14]
  cells, _ = suite.plan("smoke", ["listops", "pathfinder"], attentions, [0], results_dir)
  monkeypatch.setattr(suite, "run_cell", _fake_run_cell({"listops": "failed/oom", "pathfinder": "no_data"}))
  echoed = []
  summary = suite.work(cells, results_dir=results_dir, data_dir=str(tmp_path / "empty"), echo=echoed.append)

  failed = [f"listops/{a}/seed0" for i, a in enumerate(attentions) if (i + 1) % 7]
  oom = [f"listops/{a}/seed0" for i, a in enumerate(attentions) if (i + 1) % 7 == 0]
  assert summary.ran["failed"] == failed and summary.ran["oom"] == oom and len(summary.ran["no_data"]) == 14
  assert echoed == [f"{c.name}: {'oom' if c.name in oom else 'failed'}: RuntimeError: {c.attention} broke"
                    for c in cells[:14]] + [
      "pathfinder: no_data (shown once for the task; the summary counts its cells): pathfinder data not found: "
      f"nothing in {tmp_path / 'empty'}. Prepare it with: lra-bench data prepare pathfinder"]
  assert summary.lines()[1:] == [
      "failed: " + ", ".join(failed[:10]) + ", ... and 2 more",
      "oom: " + ", ".join(oom),
      f"no_data: pathfinder (14 cells): pathfinder data not found: nothing in {tmp_path / 'empty'}. Prepare it "
      "with: lra-bench data prepare pathfinder",
      "exit status 1: cells failed or were left unfinished; rerun the same command to retry them"]
  assert summary.exit_code() == 1


def test_summary_lines_cut_long_lists_and_group_no_data_by_task():
  names = [f"text/a{i}/seed0" for i in range(46)]
  reasons = {n: ("text", "text data not found.\nPrepare it with:\n  lra-bench data prepare text") for n in names}
  reasons["image/a0/seed0"] = ("image", "")  # a record without an error
  summary = suite.Summary(final={"ok": ["listops/a/seed0"], "failed": [f"listops/f{i}/seed0" for i in range(10)],
                                 "no_data": [*names, "image/a0/seed0"]},
                          reasons=reasons, unfinished=[f"listops/u{i}/seed0" for i in range(13)])
  assert summary.lines()[1:] == [
      "failed: " + ", ".join(f"listops/f{i}/seed0" for i in range(10)),  # 10: all of them
      "no_data: text (46 cells): text data not found. Prepare it with: lra-bench data prepare text",
      "no_data: image (1 cell): no reason recorded",
      "unfinished (a worker died; rerun the same command to finish them from their checkpoints): "
      + ", ".join(f"listops/u{i}/seed0" for i in range(10)) + ", ... and 3 more",
      "exit status 1: cells failed or were left unfinished; rerun the same command to retry them"]
  assert suite.Summary(final={"no_data": names}).lines()[1:] == ["no_data: text (46 cells): no reason recorded"]
  assert suite.Summary(final={"no_data": names, "oom": ["x"]}).exit_code() == 0


def test_a_launch_summary_groups_no_data_from_the_records(tmp_path):
  """``settle`` (the submitit launchers): the workers' records give the task and the reason."""
  from lra_bench.experiments import launcher
  from lra_bench.training import config as config_lib

  results_dir = str(tmp_path / "results")
  cells, _ = suite.plan("smoke", ["listops"], FOUR.split(","), [0], results_dir)
  grid = launcher.Grid(cells, results_dir, str(tmp_path), [], False, ("no_data", "failed"),
                       suite.record_counts(cells, []), suite.work)
  for cell, status in zip(cells, ["no_data", "no_data", "failed", "ok"]):
    results.append_record(results_dir, {
        "kind": "train", "task": cell.task, "attention": cell.attention, "protocol": "smoke", "seed": cell.seed,
        "status": status, "error": {"no_data": "no listops.\nPrepare it.", "failed": "boom", "ok": None}[status],
        "config": cell.config.to_dict(), "config_hash": config_lib.config_hash(cell.config),
        "max_length": cell.config.data.max_length})
  lines = suite.settle(grid, []).lines()
  assert lines[1:] == ["failed: listops/performer/seed0", "no_data: listops (2 cells): no listops. Prepare it.",
                       "exit status 1: cells failed or were left unfinished; rerun the same command to retry them"]
