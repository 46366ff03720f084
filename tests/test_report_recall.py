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
  summary = text[text.index("## Summary"):text.index("## Recall")]   # the summary names what recalled
  assert ("- Recall, protocol zoology, mqar L=64 kv=4 d=64 (2 attentions): vanilla 97.0; recall 90 % or more (1): "
          "vanilla 97.0; blind choice or worse, 30 % or less (1 of the 4 values + 5 points; 1): local 20.0; "
          "between: 0") in summary
  assert "mqar L=128 kv=8 d=64 (1 attention): vanilla 50.0; recall 90 % or more (0): none" in summary
  assert "No accuracy, recall or benchmark records yet" not in summary


def test_a_shortened_protocol_shows_the_original_protocols_published_values(tmp_path):
  sets = ["optimizer.learning_rate=0.01"]
  config = config_lib.load_config("recall_cpu", "mqar", sets, attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.98, test_examples=1000, test_labels=4000, train_steps=6000)
  rep = recall.recall_tables(recall.recall_frame([record]), "recall_cpu", recall.load_reference(None))
  rows = {row[0]: row for row in rep.tables[0].rows}
  assert rows["published (zoology): Attention (= vanilla)"][1] == "100.0"
  assert any("shortens `zoology`" in note for note in rep.tables[0].footnotes)


def test_a_cell_run_off_the_published_recipe_is_marked_with_what_differs(tmp_path):
  """recall_cpu's cells against Zoology's rows: the budget always, the block only for a run without Zoology's
  (zoology/model.py TransformerBlock.forward's norm2(residual)); read from each record's own config."""
  def run(attention, sets):
    config = config_lib.load_config("recall_cpu", "mqar", ["optimizer.learning_rate=0.01", *sets], attention=attention)
    return results.train_record(config, "ok", workdir=str(tmp_path / attention), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.9, test_examples=1000, test_labels=4000, train_steps=6000)
  records = [run("vanilla", ["model.identity_state_mixer=False"]), run("local", [])]  # the old block; the preset's
  table = recall.recall_tables(recall.recall_frame(records), "recall_cpu", recall.load_reference(None)).tables[0]
  rows = {row[0]: row for row in table.rows}
  assert rows["vanilla"][1].startswith("90.0 ≠ [") and rows["local"][1].startswith("90.0 ≠ [")
  notes = [note for note in table.footnotes if note.startswith("≠")]
  block = [note for note in notes if "norm2(residual)" in note]
  assert len(notes) == 2 and len(block) == 1 and block[0].endswith("— `vanilla`.")
  budget = next(note for note in notes if note not in block)
  assert "6 000 steps of batch 64" in budget and budget.endswith("— `local`.")
  alone = recall.recall_tables(recall.recall_frame(records[:1]), "recall_cpu", recall.load_reference(None)).tables[0]
  assert next(note for note in alone.footnotes if note.startswith("≠")).endswith("— every cell.")
  # A protocol that is its own published source states nothing of the kind.
  own = recall.recall_tables(recall.recall_frame([_record(tmp_path, "vanilla", 1e-3, 0.9)]), "zoology",
                             recall.load_reference(None)).tables[0]
  assert "≠" not in own.rows[0][1] and not any(note.startswith("≠") for note in own.footnotes)


def test_seq_icl_shows_its_readme_table_beside_ours(tmp_path):
  """The published rows match our cell's setting (30 tokens, width 32): the table's settings, not the
  later configs' (length 256), under which no published value exists."""
  config = config_lib.load_config("seq_icl", "induction_head", [], attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=0.95, test_examples=500, test_labels=500, train_steps=62800)
  rep = recall.recall_tables(recall.recall_frame([record]), "seq_icl", recall.load_reference(None))
  assert rep.tables[0].columns[1].startswith("L=30")
  rows = {row[0]: row for row in rep.tables[0].rows}
  assert rows["vanilla"][1].startswith("95.0 [")
  assert rows["published: Transformer (= vanilla)"][1] == "97.2"
  assert rows["published: S4D (= s4d)"][1] == "8.8"
  assert rows["published: Random"][1] == "5.0"


def test_seq_icls_lru_row_is_not_put_beside_the_papers_lru(tmp_path):
  """seq_icl's "LRU" is its own gated layer (``seq_icl_lru``), not minimal-LRU (``lru``)."""
  config = config_lib.load_config("seq_icl", "assoc_recall", [], attention="vanilla")
  record = results.train_record(config, "ok", workdir=str(tmp_path / "w"), data_dir=str(tmp_path / "d"),
                                test_accuracy=1.0, test_examples=500, test_labels=500, train_steps=62800)
  rep = recall.recall_tables(recall.recall_frame([record]), "seq_icl", recall.load_reference(None))
  labels = [row[0] for row in rep.tables[0].rows]
  assert "published: LRU (= seq_icl_lru)" in labels
  assert not any(label.endswith("(= lru)") for label in labels)
  zoology = recall.recall_tables(recall.recall_frame([_record(tmp_path, "vanilla", 1e-3, 0.9)]), "zoology",
                                 recall.load_reference(None))
  assert "published: Attention (= vanilla)" in [row[0] for row in zoology.tables[0].rows]


def test_seq_icl_is_the_config_that_made_its_table():
  """berlino/seq_icl at ec42595 (the commit that wrote the table's numbers): vocabulary 20, AR over 40
  tokens and IH over 30, width 32, 1 head, batch 32, 400 epochs of 157 steps; S4D as its s4d.yaml."""
  ar = config_lib.load_config("seq_icl", "assoc_recall", [], attention="vanilla")
  ih = config_lib.load_config("seq_icl", "induction_head", [], attention="vanilla")
  for c, length, model_length in ((ar, 40, 42), (ih, 30, 31)):
    assert (c.data.prepare.vocab_size, c.data.prepare.seq_len, c.data.max_length) == (20, length, model_length)
    assert (c.data.prepare.num_train, c.data.prepare.num_test) == (5000, 500)
    assert (c.model.emb_dim, c.model.num_layers, c.model.num_heads, c.model.mlp_dim) == (32, 2, 1, 128)
    assert (c.batch_size, c.num_train_steps, c.eval_every, c.optimizer.warmup_steps) == (32, 62800, 157, 6280)
    assert (c.optimizer.learning_rate, c.optimizer.weight_decay) == (5e-4, 0.1)
    assert (c.model.embed_dropout_rate, c.model.attention_dropout_rate, c.model.dropout_rate) == (0.1, 0.1, 0.0)
    assert (c.model.dense_init_std, c.model.residual_init_rescale, c.model.positions) == (0.02, True, "learned")
  assert ar.optimizer.schedule.endswith("linear_decay") and ar.optimizer.steps_per_cycle == 62800
  assert ih.optimizer.schedule.endswith("cosine_decay") and ih.optimizer.steps_per_cycle == 62800 - 6280
  s4d = config_lib.load_config("seq_icl", "induction_head", [], attention="s4d")
  assert dict(s4d.model.attention_kwargs) == {"causal": True, "d_state": 64, "init": "inv", "postact": "linear",
                                              "dropout_rate": 0.0, "B_init": "random", "n_ssm": 1,
                                              "out_init_std": 0.02}
  assert s4d.model.positions == "none"    # the S4D and LRU experiments have no position embeddings
  assert ih.model.attention_bias and ar.model.attention_bias  # simple_lm.py MHA: Wqkv, out_proj with bias
  assert "attention_bias" not in s4d.model  # a mixer's config (and its records' hash) does not carry it
  assert (s4d.optimizer.ssm_learning_rate, s4d.optimizer.ssm_weight_decay) == (5e-4, 0.0)
  assert "ssm_learning_rate" not in ih.optimizer


def test_zoology_initialises_as_its_init_weights_and_recall_cpu_keeps_the_encoders():
  """Zoology's _init_weights (zoology/model.py): nn.Linear N(0, 0.02), out_proj N(0, 0.02 / sqrt(2 n_layers)),
  its MHA's Wqkv and out_proj with (zeroed) biases; the CPU-sized protocol keeps its committed cells' init."""
  zoology = config_lib.load_config("zoology", "mqar", [], attention="vanilla")
  assert (zoology.model.dense_init_std, zoology.model.residual_init_rescale, zoology.model.attention_bias,
          zoology.model.embed_init_std) == (0.02, True, True, 0.02)
  cpu = config_lib.load_config("recall_cpu", "mqar", [], attention="vanilla")
  assert not any(key in cpu.model for key in ("dense_init_std", "residual_init_rescale", "attention_bias"))


def test_cores_without_a_causal_form_are_listed():
  no_causal = recall.no_causal_forms()
  assert "linformer" in no_causal and "vanilla" not in no_causal and "local" not in no_causal


@pytest.mark.parametrize("curve, rising", [
    ([[2000, 0.092], [4000, 0.153], [6000, 0.366]], True),    # vanilla at width 128: the jump under way
    ([[2000, 0.046], [4000, 0.504], [6000, 0.678]], True),
    ([[2000, 0.259], [4000, 0.263], [6000, 0.253]], False),   # flat: the budget is not what limits it
    ([[2000, 0.997], [4000, 1.0], [6000, 1.0]], False),       # done
    ([[2000, 0.50], [4000, 0.30], [6000, 0.36]], False),      # up 6 points, but below its best
    ([[2000, 0.10], [4000, 0.149]], False),                   # 4.9 points: under the threshold
    ([[6000, 0.9]], False), (None, False)])
def test_a_run_still_climbing_at_its_end_is_recognised(curve, rising):
  assert recall.still_rising(curve) is rising


def test_a_cell_still_rising_is_marked_in_the_table(tmp_path):
  climbing = _record(tmp_path, "vanilla", 1e-3, 0.366)
  climbing["val_curve"] = [[2000, 0.092], [4000, 0.153], [6000, 0.366]]
  flat = _record(tmp_path, "local", 1e-3, 0.26)
  flat["val_curve"] = [[2000, 0.259], [4000, 0.263], [6000, 0.253]]
  rep = recall.recall_tables(recall.recall_frame([climbing, flat]), "zoology", recall.load_reference(None))
  rows = {row[0]: row for row in rep.tables[0].rows}
  assert rows["vanilla"][1].startswith("36.6 ↑ [") and "↑" not in rows["local"][1]
  assert any(note.startswith("↑: still rising") for note in rep.tables[0].footnotes)
  settled = recall.recall_tables(recall.recall_frame([flat]), "zoology", recall.load_reference(None))
  assert not any("still rising" in note for note in settled.tables[0].footnotes)
