"""``lra_bench.check.run_check`` (what ``lra-bench check NAME`` runs): the report, its files, and a
non-zero exit naming the property when a core is broken."""

from __future__ import annotations

import os

import pytest

from attention_zoo.registry import temporary
from lra_bench import check
from lra_bench.training.config import ConfigError
from tests.test_kit import CORES


def test_vanilla_quick_passes_and_writes_the_report(tmp_path, capsys):
  out = str(tmp_path / "report")
  assert check.run_check("vanilla", quick=True, out=out) == 0
  captured = capsys.readouterr()
  path = os.path.join(out, "check_vanilla.md")
  with open(path) as f:
    text = f.read()
  assert text in captured.out and f"written to {path}" in captured.out
  for check_name in ("config", "causal", "padding_zero_weight", "dropout_unbiased"):
    assert f"| {check_name} | pass |" in text
  assert "| support | n.a. |" in text
  assert "| 64 |" in text and "| 128 |" in text and "| log-log slope |" in text  # the quick lengths
  assert "Learnability" not in text and "Verdict: conformant" in text
  assert os.path.getsize(os.path.join(out, "attention_vanilla_L64.png")) > 0
  assert "[check vanilla] conformance" in captured.err  # progress on stderr


@pytest.mark.parametrize("name, failing", [("fake_peek", "causal"), ("fake_leak", "padding_zero_weight")])
def test_a_broken_core_fails_naming_the_property(tmp_path, capsys, name, failing):
  with temporary({name: CORES[name]}):
    status = check.run_check(name, quick=True, lengths=(32, 64), out=str(tmp_path))
  out = capsys.readouterr().out
  assert status == 1
  assert f"| {failing} | FAIL |" in out
  verdict = [line for line in out.splitlines() if line.startswith("Verdict: FAIL (")]
  assert len(verdict) == 1 and failing in verdict[0]
  assert "| vanilla fwd+bwd ms |" in out  # timed beside vanilla


def test_a_core_that_raises_still_gets_a_report(tmp_path, capsys):
  with temporary({"fake_crash": CORES["fake_crash"]}):
    status = check.run_check("fake_crash", quick=True, lengths=(32, 64), out=str(tmp_path))
  out = capsys.readouterr().out
  assert status == 1
  assert "| float32 | FAIL | raised | TypeError: boom" in out
  assert "not measured: TypeError: boom" in out and "not drawn: TypeError: boom" in out
  assert os.path.exists(tmp_path / "check_fake_crash.md")


def test_learnability_generates_missing_data_and_trains_both_cells(tmp_path, capsys):
  """Not quick: the smoke ListOps data is generated in an empty data_dir; 2 steps per cell."""
  with temporary({"fake_ok": CORES["fake_ok"]}):
    status = check.run_check("fake_ok", lengths=(16, 32), out=str(tmp_path / "out"), steps=2,
                             data_dir=str(tmp_path / "data"))
  out = capsys.readouterr().out
  assert status == 0
  assert os.path.exists(tmp_path / "data" / "listops-1000" / "smoke_train.tsv")
  assert "## Learnability (smoke ListOps, 2 steps each; chance 0.1)" in out
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
