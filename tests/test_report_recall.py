"""The recall section of the report: best over the learning-rate sweep, runs counted, the Wilson interval
over labelled positions, the published value beside ours, the figures, and no LRA table for recall-only
records."""

from __future__ import annotations

import os

import pytest

from lra_bench.experiments import results
from lra_bench.report import index, recall
from lra_bench.training import config as config_lib

WIDTH = ["model.emb_dim=64", "model.qkv_dim=64"]


def _record(tmp_path, attention: str, lr: float, accuracy: float, *, length: int = 64, kv: int = 4,
            labels: int = 4000, seed: int = 0) -> dict:
  name = f"L{length}_kv{kv}"
  sets = [*WIDTH, f"optimizer.learning_rate={lr}", f"data.prepare.seq_len={length}", f"data.max_length={length}",
          f"data.prepare.num_kv_pairs={kv}", f"data.options.name={name}", f"data.prepare.name={name}"]
  config = config_lib.load_config("zoology", "mqar", sets, attention=attention, seed=seed)
  return results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                              test_accuracy=accuracy, test_examples=labels // kv, test_labels=labels,
                              train_steps=100)


@pytest.fixture
def records(tmp_path):
  return [_record(tmp_path, "vanilla", lr, acc) for lr, acc in ((1e-4, 0.31), (4.64e-4, 0.97), (2.15e-3, 0.88))] + \
         [_record(tmp_path, "local", lr, acc) for lr, acc in ((1e-4, 0.12), (4.64e-4, 0.20))] + \
         [_record(tmp_path, "vanilla", 4.64e-4, 0.5, length=128, kv=8)]


def test_best_of_the_sweep_with_its_runs_and_interval(records):
  best = recall.best_of_sweep(recall.recall_frame(records))
  row = best[(best.attention == "vanilla") & (best.seq_len == 64)].iloc[0]
  assert row.accuracy == pytest.approx(97.0) and row.runs == 3 and row.best_lr == pytest.approx(4.64e-4)
  assert row.labels == 4000 and row.ci_low < 97.0 < row.ci_high and row.ci_high - row.ci_low < 1.5
  local = best[(best.attention == "local") & (best.seq_len == 64)].iloc[0]
  assert local.accuracy == pytest.approx(20.0) and local.runs == 2
  assert best[(best.attention == "vanilla") & (best.seq_len == 128)].iloc[0].runs == 1


def test_state_sizes_come_from_the_registry(records):
  frame = recall.recall_frame(records)
  vanilla = frame[(frame.attention == "vanilla") & (frame.seq_len == 64)].iloc[0]
  assert vanilla.state_size == 2 * 64 * 64   # K and V of 64 past positions, width 64, one head
  local = frame[frame.attention == "local"].iloc[0]
  assert local.state_size < vanilla.state_size


def test_the_table_puts_the_published_value_beside_ours(records):
  reference = recall.load_reference(None)
  rep = recall.recall_tables(recall.recall_frame(records), "zoology", reference, {"linformer": "no causal form"})
  table = rep.tables[0]
  assert table.columns == ["Attention", "L=64 kv=4 d=64", "L=128 kv=8 d=64"]
  ours = {row[0]: row for row in table.rows}
  assert ours["vanilla"][1].startswith("97.0 [") and ours["vanilla"][1].endswith("(3 runs)")
  assert ours["local"][2] == "—"
  published = ours["published: Attention (= vanilla)"]
  assert published[1] == "100.0" and published[2] == "100.0"
  assert ours["published: H3"][1] == "94.0" and ours["published: H3"][2] == "25.0"
  assert (0, 1) in table.bold and (1, 1) not in table.bold
  assert any("linformer" in note for note in table.footnotes)


def test_report_of_recall_records_has_the_recall_section_and_figures(tmp_path, records):
  results_dir = tmp_path / "results"
  for record in records:
    results.append_record(str(results_dir), record)
  out = tmp_path / "report"
  written = index.write_report(str(results_dir), str(out), attention_names=["vanilla"])
  text = (out / "index.md").read_text()
  assert "## Recall — protocol `zoology`" in text and "## Accuracy — protocol" not in text
  assert "Recall records only (no LRA accuracy section)" in text and "Benchmark records only" not in text
  assert os.path.exists(out / "recall_zoology.csv") and os.path.exists(out / "recall_zoology_state_size.png")
  assert str(out / "recall_zoology_runs.csv") in written


def test_a_shortened_protocol_shows_the_original_protocols_published_values(tmp_path):
  sets = ["optimizer.learning_rate=0.01"]
  config = config_lib.load_config("recall_cpu", "mqar", sets, attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.98, test_examples=1000, test_labels=4000, train_steps=6000)
  rep = recall.recall_tables(recall.recall_frame([record]), "recall_cpu", recall.load_reference(None))
  rows = {row[0]: row for row in rep.tables[0].rows}
  assert rows["published (zoology): Attention (= vanilla)"][1] == "100.0"
  assert any("shortens `zoology`" in note for note in rep.tables[0].footnotes)


def test_the_cpu_induction_head_shows_seq_icls_published_row(tmp_path):
  config = config_lib.load_config("seq_icl_cpu", "induction_head", [], attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.95, test_examples=500, test_labels=500, train_steps=25000)
  rep = recall.recall_tables(recall.recall_frame([record]), "seq_icl_cpu", recall.load_reference(None))
  rows = {row[0]: row for row in rep.tables[0].rows}
  assert rows["published (seq_icl): Transformer (= vanilla)"][1] == "97.2"
  assert rows["published (seq_icl): S4D (= s4d)"][1] == "8.8"
  assert any("shortens `seq_icl`" in note for note in rep.tables[0].footnotes)


def test_the_cpu_induction_head_is_seq_icls_with_a_tenth_of_the_training():
  """Only the length of training and the schedule stretched to it differ from seq_icl's config."""
  full = config_lib.load_config("seq_icl", "induction_head", [], attention="vanilla").to_dict()
  short = config_lib.load_config("seq_icl_cpu", "induction_head", [], attention="vanilla").to_dict()
  assert (short["num_train_steps"], full["num_train_steps"]) == (25_000, 250_000)
  assert (short["optimizer"]["warmup_steps"], short["optimizer"]["steps_per_cycle"]) == (2_500, 22_500)
  for key in ("num_train_steps", "protocol"):
    del full[key], short[key]
  for key in ("warmup_steps", "steps_per_cycle"):
    del full["optimizer"][key], short["optimizer"][key]
  assert short == full


def test_cores_without_a_causal_form_are_listed():
  no_causal = recall.no_causal_forms()
  assert "linformer" in no_causal and "vanilla" not in no_causal and "local" not in no_causal
