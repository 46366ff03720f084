"""Issue 30, the report side: the seeds of a cell are grouped by their config without the seed; cells
whose config is not the protocol's preset are marked and get no delta; Fix commands carry the records'
``--plugin`` and ``--set``s; a results line that is JSON but not a record is skipped with its file:line;
``--results_dir`` given a file and a mistyped ``--reference_dir`` are one clear error each.

The records here are built as ``results.train_record`` builds them: the full config and its
``config_hash``, which includes the seed (so every seed has its own hash, as in real results files).
"""

import json
import os
import shlex
import subprocess
import sys

import pandas as pd
import pytest

from lra_bench import cli as cli_lib
from lra_bench.experiments import results, suite
from lra_bench.report import accuracy, reference
from lra_bench.report import index as report_index
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides

REFERENCE, _ = reference.load_reference()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def record(protocol, task, attention, seed, acc, overrides=(), status="ok", error=None, **extra):
  """A record as ``results.train_record`` writes it (config, per-seed config_hash, module, vs_preset)."""
  config = config_lib.load_config(protocol, task, overrides, attention=attention, seed=seed)
  out = {"kind": "train", "task": task, "attention": attention, "protocol": config.protocol, "seed": seed,
         "status": status, "error": error, "test_accuracy": acc, "test_examples": 200,
         "config": config.to_dict(), "config_hash": config_lib.config_hash(config),
         "max_length": config.data.max_length, "attention_module": f"attention_zoo.{attention}"}
  out.update(extra)
  return written(out)


def written(out):
  """``out`` with the ``vs_preset`` that ``results.train_record`` adds (after any change to it here)."""
  out["vs_preset"] = results.vs_preset(out)
  return out


def cell_text(rep, attention, task="ListOps"):
  row = [r for r in rep.ours.rows if r[1] == attention][0]
  return row[rep.ours.columns.index(task)]


def test_seeds_of_a_cell_are_one_group_though_their_hashes_differ():
  records = [record("lra", "listops", "vanilla", s, a) for s, a in ((0, 0.36), (1, 0.37), (2, 0.38))]
  assert len({r["config_hash"] for r in records}) == 3  # as real records: the hash includes the seed
  assert len({results.setting_hash(r) for r in records}) == 1
  rep = accuracy.accuracy_report(records, "lra", REFERENCE)
  assert cell_text(rep, "vanilla").startswith("37.00 ± 1.00")
  row = rep.cells.set_index(["attention", "task"]).loc[("vanilla", "listops")]
  assert row["n"] == 3 and row["seeds"] == "0,1,2" and row["ignored"] == 0
  assert "over seeds (0, 1, 2)" in rep.ours.caption
  assert not any("other configs" in n for n in rep.ours.notes)


def test_another_cadence_is_the_same_setting_and_the_preset():
  """--set log_every / checkpoint_every change no number: the record is its preset's, in its seeds' group."""
  records = [record("smoke", "listops", "vanilla", 0, 0.3, ["checkpoint_every=7", "log_every=3"]),
             record("smoke", "listops", "vanilla", 1, 0.5)]
  assert records[0]["config"]["checkpoint_every"] == 7
  assert len({results.setting_hash(r) for r in records}) == 1
  assert set(records[0]["vs_preset"]["differences"]) == {"checkpoint_every", "log_every"}
  assert records[0]["vs_preset"]["sets"] == ["checkpoint_every=7", "log_every=3"]
  rep = accuracy.accuracy_report(records, "smoke", REFERENCE)
  row = rep.cells.set_index(["attention", "task"]).loc[("vanilla", "listops")]
  assert row["n"] == 2 and row["mean"] == pytest.approx(40.0) and row["ignored"] == 0
  assert not any("other configs" in n for n in rep.ours.notes)


def test_other_overrides_stay_a_separate_group():
  records = [record("smoke", "listops", "vanilla", s, 0.3) for s in (0, 1)]
  records += [record("smoke", "listops", "vanilla", 0, 0.9, ["model.num_layers=1"])]
  rep = accuracy.accuracy_report(records, "smoke", REFERENCE)
  row = rep.cells.set_index(["attention", "task"]).loc[("vanilla", "listops")]
  assert row["n"] == 2 and row["mean"] == pytest.approx(30.0) and row["ignored"] == 1
  assert any("1 record(s) of other configs" in n for n in rep.ours.notes)


@pytest.mark.timeout(600)
def test_multi_seed_suite_then_report_shows_every_seed(listops_dir, tmp_path, fast_compile):
  """The issue's commands: suite --seeds 0,1,2, then report (tiny)."""
  results_dir = str(tmp_path / "results")
  summary = suite.run_suite("smoke", "listops", "vanilla", "0,1,2", results_dir=results_dir,
                            data_dir=listops_dir, progress=False,
                            overrides=tiny_overrides(num_train_steps=4, eval_every=4, checkpoint_every=4))
  assert sorted(summary.ran["ok"]) == [f"listops/vanilla/seed{s}" for s in range(3)]
  records = results.load_records(results_dir)
  accs = [100.0 * r["test_accuracy"] for r in records]
  report_index.write_report(results_dir, str(tmp_path / "report"), attention_names=["vanilla"])
  cells = pd.read_csv(tmp_path / "report" / "accuracy_smoke.csv").set_index(["attention", "task"])
  row = cells.loc[("vanilla", "listops")]
  assert row["n"] == 3 and row["seeds"] == "0,1,2" and row["ignored"] == 0
  assert row["mean"] == pytest.approx(sum(accs) / 3)
  markdown = (tmp_path / "report" / "accuracy_smoke.md").read_text()
  assert "mean ± std over seeds (0, 1, 2)" in markdown and "other configs" not in markdown


def test_cells_off_the_preset_are_marked_and_get_no_delta():
  records = [record("lra", "listops", "vanilla", s, 0.37, ["model.num_layers=1"]) for s in (0, 1)]
  # Only logging / checkpoint cadence changed: still the preset.
  records += [record("lra", "text", "vanilla", 0, 0.65, ["log_every=7", "checkpoint_every=9"])]
  # `train --protocol smoke --set protocol=lra` (older versions accepted it): a smoke run labelled lra.
  relabelled = record("smoke", "listops", "performer", 0, 0.20)
  relabelled["protocol"] = relabelled["config"]["protocol"] = "lra"
  written(relabelled)
  rep = accuracy.accuracy_report(records + [relabelled], "lra", REFERENCE)
  cells = rep.cells.set_index(["attention", "task"])
  assert cell_text(rep, "vanilla").endswith(accuracy.OFF_PRESET) and pd.isna(cells.loc[("vanilla", "listops"), "delta"])
  assert cells.loc[("vanilla", "listops"), "off_preset"] == "model.num_layers=1 (preset 4)"
  assert cell_text(rep, "performer").endswith(accuracy.OFF_PRESET)
  assert "num_train_steps=60 (preset 5000)" in cells.loc[("performer", "listops"), "off_preset"]
  assert pd.isna(cells.loc[("performer", "listops"), "delta"])
  assert cell_text(rep, "vanilla", "Text") == "65.00 [58.2, 71.3]"  # not marked
  assert cells.loc[("vanilla", "text"), "delta"] == pytest.approx(65.0 - 64.27)
  delta_row = [r for r in rep.delta.rows if r[1] == "vanilla"][0]
  assert delta_row[2] == "" and delta_row[3] == "+0.73"
  notes = "\n".join(rep.ours.notes)
  assert f"{accuracy.OFF_PRESET} vanilla / ListOps: model.num_layers=1 (preset 4)" in notes
  assert "ignored keys: log_every, checkpoint_every" in notes
  assert "\\dagger" in rep.ours.to_latex()


def _sets(command: str) -> list[str]:
  words = shlex.split(command)
  return [words[i + 1] for i, w in enumerate(words) if w == "--set"]


def test_fix_commands_carry_the_plugin_and_the_sets():
  tiny = ["model.num_layers=1", "data.options.name=tiny", "optimizer.learning_rate=0.001"]
  ok = record("smoke", "listops", "vanilla", 0, 0.3, tiny)
  # a plugin's core that is not loaded in the report's process (its module is only in the record)
  failed = record("smoke", "listops", "vanilla", 0, None, tiny, status="failed", error="RuntimeError: x",
                  attention_module="my_plugins.sparse")
  failed["attention"] = failed["config"]["model"]["attention"] = "my_sparse"
  written(failed)
  rep = accuracy.accuracy_report([ok, failed], "smoke", REFERENCE, "RES")
  cells = rep.cells.set_index(["attention", "task"])
  fix = cells.loc[("my_sparse", "listops"), "fix"]
  assert fix.startswith("lra-bench suite --plugin my_plugins.sparse --protocol smoke --tasks listops "
                        "--attentions my_sparse --seeds 0 --results_dir RES --set ")
  # the --sets rebuild the failed run's exact config (so the rerun fills this cell, not another one)
  rebuilt = config_lib.load_config("smoke", "listops", _sets(fix), attention="vanilla", seed=0).to_dict()
  rebuilt["model"]["attention"] = "my_sparse"
  assert rebuilt == failed["config"]
  # a cell without records: the --sets its task's records share, no --plugin for the package's cores
  missing = cells.loc[("performer", "listops"), "fix"]
  assert sorted(_sets(missing)) == sorted(tiny) and "--plugin" not in missing


NOT_RECORDS = ['{"a": 1}', '{"kind": "train"}',
               '{"kind": "train", "task": "listops", "attention": "vanilla", "protocol": "smoke", "seed": 0, '
               '"status": "ok", "test_accuracy": "high"}',
               '{"task": "listops", "attention": "vanilla", "protocol": "smoke", "seed": "0", "status": "ok"}',
               '["not", "an", "object"]',
               '{"kind": "bench", "task": "text", "attention": "vanilla", "protocol": "bench", "seed": 0, '
               '"status": "ok"}']


def _results_with_non_records(results_dir) -> str:
  os.makedirs(results_dir, exist_ok=True)
  path = os.path.join(results_dir, results.RESULTS_FILE)
  with open(path, "w") as f:
    f.write(json.dumps(record("smoke", "listops", "vanilla", 0, 0.3)) + "\n")
    f.write("\n".join(NOT_RECORDS) + "\n")
  return path


def test_record_problem_names_what_is_wrong():
  assert results.record_problem(record("smoke", "listops", "vanilla", 0, 0.3)) is None
  problems = [results.record_problem(json.loads(line)) for line in NOT_RECORDS]
  assert problems == ["not a record: no 'task', 'attention', 'protocol', 'seed', 'status'",
                      "not a record: no 'task', 'attention', 'protocol', 'seed', 'status'",
                      "'test_accuracy' is 'high', not a number", "'seed' is '0', not an integer",
                      "not a JSON object", "a bench record without an integer 'max_length' (its length)"]


@pytest.mark.timeout(300)
def test_json_lines_that_are_not_records_are_skipped_by_report_and_suite(tmp_path):
  results_dir = str(tmp_path / "results")
  path = _results_with_non_records(results_dir)
  records, unreadable = results.read_records(results_dir)
  assert len(records) == 1 and [u.split(": ")[0] for u in unreadable] == [f"{path}:{i}" for i in range(2, 8)]
  # report (the command): one warning per line, exit 0, the index lists them
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "report", "--results_dir", results_dir,
                         "--length", "8", "--patterns", "none"], cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr
  warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: ")]
  assert len(warnings) == 6 and f"{path}:3: not a record: no 'task'" in proc.stderr
  assert "Traceback" not in proc.stderr
  index = open(os.path.join(results_dir, "report", "index.md")).read()
  assert f"`{path}:4: 'test_accuracy' is 'high', not a number" in index
  assert "## Effective attention patterns" not in index   # --patterns none
  # suite: plans, checks and records around the lines (no data: a no_data record, quickly)
  summary = suite.run_suite("smoke", "listops", "performer", "0", results_dir=results_dir,
                            data_dir=str(tmp_path / "no_data"), progress=False)
  assert summary.ran == {"no_data": ["listops/performer/seed0"]}


def _report(*flags: str) -> int:
  return cli_lib.main(cli_lib.parse(["lra-bench", "report", *flags]))


def test_report_results_dir_given_a_file(tmp_path, capsys):
  path = _results_with_non_records(str(tmp_path / "results"))
  assert _report("--results_dir", path) == 2
  err = capsys.readouterr().err.strip()
  assert err == (f"error: --results_dir: {path} is a file, not a directory; pass the folder that holds "
                 "results.jsonl")


@pytest.mark.parametrize("where", ["missing", "empty", "file"])
def test_report_mistyped_reference_dir(tmp_path, capsys, where):
  results_dir = str(tmp_path / "results")
  _results_with_non_records(results_dir)
  capsys.readouterr()
  reference_dir = tmp_path / "refrence"
  if where == "empty":
    reference_dir.mkdir()
  elif where == "file":
    reference_dir.write_text("x")
  out = tmp_path / "out"
  assert _report("--results_dir", results_dir, "--reference_dir", str(reference_dir), "--out", str(out)) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: --reference_dir: {reference_dir} ")
  assert "lra_paper_accuracy.csv" in err[0] and "leave --reference_dir out" in err[0]
  assert not out.exists()  # nothing half-written
  assert report_index.reference_problem(reference.DEFAULT_REFERENCE_DIR) is None


def test_report_draws_the_patterns_it_is_asked_for(tmp_path, capsys):
  """``--patterns``: none unless asked (a heatmap belongs to a study about the patterns, not to every
  report); a comma list draws those cores only; an unknown name is one clear error before anything is
  written."""
  results_dir = str(tmp_path / "results")
  _results_with_non_records(results_dir)
  for plain in (tmp_path / "cli", tmp_path / "api"):  # the command and write_report, each by default
    if plain.name == "cli":
      assert _report("--results_dir", results_dir, "--out", str(plain)) == 0
    else:
      report_index.write_report(results_dir, str(plain))
    assert not list(plain.glob("attention_patterns*")), plain
    assert "## Effective attention patterns" not in (plain / "index.md").read_text()
  out = tmp_path / "out"
  assert _report("--results_dir", results_dir, "--out", str(out), "--length", "8",
                 "--patterns", "vanilla,local") == 0
  index = (out / "index.md").read_text()
  assert "## Effective attention patterns" in index and (out / "attention_patterns.png").exists()
  capsys.readouterr()
  bad = tmp_path / "bad"
  assert _report("--results_dir", results_dir, "--out", str(bad), "--patterns", "vanila") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: --patterns: unknown attention 'vanila'")
  assert not bad.exists()
