"""``lra_bench.check.run_check`` (what ``lra-bench check NAME`` runs): the report, its files, and a
non-zero exit naming the property when a core is broken."""

from __future__ import annotations

import os

import pytest

from attention_zoo.registry import temporary
from lra_bench import check
from lra_bench.training.config import ConfigError
from tests.test_kit import CORES


def _must_not_run(*args, **kwargs):
  raise AssertionError("--quick must not time, draw or train")


def test_vanilla_quick_passes_and_writes_the_report(tmp_path, capsys, monkeypatch):
  """--quick is the conformance table alone: nothing is timed, drawn or trained."""
  from lra_bench.report import viz

  for module, function in ((check, "measure_cost"), (check, "learnability"), (viz, "plot_attention")):
    monkeypatch.setattr(module, function, _must_not_run)
  out = str(tmp_path / "report")
  assert check.run_check("vanilla", quick=True, out=out) == 0
  captured = capsys.readouterr()
  path = os.path.join(out, "check_vanilla.md")
  with open(path) as f:
    text = f.read()
  assert text in captured.out and f"written to {path}" in captured.out
  for check_name in ("config", "causal", "padding_zero_weight", "dropout_unbiased"):
    assert f"| {check_name} | pass |" in text
  assert "| support | n.a. |" in text and "| depends_on_qk | pass |" in text
  assert "Cost of the core" not in text and "Effective attention" not in text and "Learnability" not in text
  assert "Quick check: conformance only" in text and "Verdict: conformant" in text
  assert os.listdir(out) == ["check_vanilla.md"]  # no heatmap, no training run
  assert "[check vanilla] conformance" in captured.err  # progress on stderr


@pytest.mark.parametrize("name, failing", [("fake_peek", "causal"), ("fake_leak", "padding_zero_weight"),
                                           ("fake_uniform", "depends_on_qk")])
def test_a_broken_core_fails_naming_the_property(tmp_path, capsys, name, failing):
  """fake_uniform is the audit's core that does not attend (uniform weights over the real keys, masked,
  causal and dropout right): `lra-bench check` rejects it."""
  with temporary({name: CORES[name]}):
    status = check.run_check(name, quick=True, lengths=(32, 64), out=str(tmp_path))
  out = capsys.readouterr().out
  assert status == 1
  assert f"| {failing} | FAIL |" in out
  verdict = [line for line in out.splitlines() if line.startswith("Verdict: FAIL (")]
  assert len(verdict) == 1 and failing in verdict[0]


def test_a_core_that_raises_still_gets_a_report(tmp_path, capsys):
  with temporary({"fake_crash": CORES["fake_crash"]}):
    status = check.run_check("fake_crash", quick=True, lengths=(32, 64), out=str(tmp_path))
    lines = check.cost_and_heatmap("fake_crash", (32, 64), str(tmp_path), repeats=1)  # the full run's stages
  out = capsys.readouterr().out
  assert status == 1
  assert "| float32 | FAIL | raised | TypeError: boom" in out
  assert "not measured: TypeError: boom: this core is broken on purpose" in lines
  assert "not drawn: TypeError: boom: this core is broken on purpose" in lines
  assert os.path.exists(tmp_path / "check_fake_crash.md")


def test_learnability_generates_missing_data_and_trains_both_cells(tmp_path, capsys):
  """Not quick: cost and heatmap at two lengths, and the smoke ListOps data generated in an empty
  data_dir; 2 steps per cell."""
  with temporary({"fake_ok": CORES["fake_ok"]}):
    status = check.run_check("fake_ok", lengths=(16, 32), out=str(tmp_path / "out"), steps=2,
                             data_dir=str(tmp_path / "data"))
  out = capsys.readouterr().out
  assert status == 0
  assert os.path.exists(tmp_path / "data" / "listops-1000" / "smoke_train.tsv")
  assert "## Learnability (smoke ListOps, 2 steps each; chance 0.1)" in out
  assert "| 16 |" in out and "| 32 |" in out and "| log-log slope |" in out  # the cost table
  assert "| vanilla fwd+bwd ms |" in out  # timed beside vanilla
  assert os.path.getsize(tmp_path / "out" / "attention_fake_ok_L64.png") > 0
  rows = [line for line in out.splitlines() if line.startswith(("| fake_ok |", "| vanilla |"))]
  assert len(rows) == 2
  for row in rows:  # | attention | test acc. | best val. acc. | train steps | wall s | status |
    assert row.split(" | ")[3] == "2" and row.endswith("| ok |"), row


def test_bad_arguments_are_one_line_errors(tmp_path):
  with pytest.raises(ConfigError, match="unknown attention 'no_such'.*known attentions"):
    check.run_check("no_such", quick=True, out=str(tmp_path))
  with pytest.raises(ConfigError, match="--lengths must be positive integers"):
    check.run_check("vanilla", lengths=(0, 64), quick=True, out=str(tmp_path))
  with pytest.raises(ConfigError, match="--steps must be >= 1"):
    check.run_check("vanilla", steps=0, out=str(tmp_path))
