"""The modern recurrent layers' published rows (lra_bench/report/published/modern_layers_accuracy.csv and the Kimi
Linear rows of recall_accuracy.csv): read through the report's loaders, values as the papers print them,
each row with its source and protocol, and never set beside our runs under a protocol of ours."""

import configs
import pandas as pd
import pytest

import attention_zoo
from lra_bench.report import accuracy, recall, reference


@pytest.fixture(scope="module")
def modern():
  return reference.load_modern()


@pytest.fixture(scope="module")
def followups():
  return reference.load_followups()


def _row(frame, source, model):
  rows = frame[(frame["source"] == source) & (frame["model"] == model)]
  assert len(rows) == 1, (source, model)
  return rows.iloc[0]


def test_values_as_the_papers_print_them(modern):
  mamba = _row(modern, "xlstm_2024_table6", "Mamba")  # xLSTM Table 6, 0.325 / 0.902 / 0.992 / 0.689
  assert [reference.number(mamba[c]) for c in ("listops", "retrieval", "pathfinder", "image")] == [
      32.5, 90.2, 99.2, 68.9]
  assert mamba["text"] == "" and mamba["path_x"] == "" and mamba["avg5"] == ""  # not run there
  assert "RGB-Image 76.5" in mamba["note"]
  # Table 6's "xLSTM" row, split by App. B.1.3: xLSTM[1:0] (mLSTM) outside the images, xLSTM[0:1] on them
  assert reference.number(_row(modern, "xlstm_2024_table6", "xLSTM[1:0]")["listops"]) == 41.1
  assert reference.number(_row(modern, "xlstm_2024_table6", "xLSTM[0:1]")["image"]) == 69.5
  assert _row(modern, "xlstm_2024_table6", "LSTM")["retrieval"] == "FAIL"
  hgrn = _row(modern, "hgrn_2023", "HGRN")
  assert reference.number(hgrn["avg_paper"]) == 86.91 and reference.number(hgrn["path_x"]) == 97.50
  assert reference.number(hgrn["avg5"]) == 84.79  # (59.95 + 88.14 + 94.23 + 88.69 + 92.92) / 5
  hgrn2 = _row(modern, "hgrn2_2024_lra", "HGRN2")
  assert [reference.number(hgrn2[c]) for c in ("listops", "pathfinder", "path_x", "avg_paper")] == [
      60.52, 93.95, 98.12, 87.66]
  lion_s = _row(modern, "lion_2025_table7", "LION-S")
  assert reference.number(lion_s["avg_paper"]) == 86.07 and reference.number(lion_s["path_x"]) == 97.99
  assert reference.number(_row(modern, "lion_2025_table7", "LION-D")["avg_paper"]) == 85.63
  assert reference.number(_row(modern, "lion_2025_table7", "LION-LIT")["avg_paper"]) == 50.41
  rwkv = _row(modern, "rwkv_2023_table4", "RWKV")
  assert reference.number(rwkv["listops"]) == 55.88 and reference.number(rwkv["avg_paper"]) == 72.07


def test_every_row_names_its_source_protocol_and_how_it_was_read(modern):
  assert list(modern.columns) == reference.MODERN_COLUMNS
  assert len(modern) >= 17
  assert (modern["source"] != "").all() and (modern["protocol"] != "").all() and (modern["note"] != "").all()
  assert set(modern["source"]) == reference.MODERN_SOURCES
  assert not set(modern["protocol"]) & set(configs.list_protocols())  # each paper's recipe, none of ours
  for _, r in modern.iterrows():  # avg5 is the mean of the five tasks, where all five are numbers
    five = [reference.number(r[t]) for t in reference.AVG_TASKS]
    if None in five:
      assert r["avg5"] == ""
    else:
      assert reference.number(r["avg5"]) == pytest.approx(sum(five) / 5, abs=0.006)


def test_rows_map_to_our_layers_by_paper_name_only_where_they_are_the_same_layer(modern):
  layers = set(attention_zoo.list_layers())
  for model in ("RWKV", "RWKV-4", "HGRN", "Griffin", "xLSTM[0:1]", "xLSTM", "LION-D", "Llama"):
    assert reference.published_layer(model) is None
  expected = {"Mamba": "mamba", "HGRN2": "hgrn2", "xLSTM[1:0]": "mlstm"}
  for model, layer in expected.items():
    if layer in layers:
      assert reference.published_layer(model) == layer
  if "mamba" in layers:
    assert reference.row_attention(_row(modern, "xlstm_2024_table6", "Mamba")) == "mamba"


def test_the_protocol_filter_keeps_them_out_of_our_protocols_tables(followups):
  assert set(followups["file"]) == {reference.FOLLOWUPS_FILE, reference.MODERN_FILE}
  for protocol in configs.list_protocols():
    own = reference.own_reference(followups, protocol)
    assert own.empty or set(own["file"]) == {reference.FOLLOWUPS_FILE}, protocol
    assert set(own.get("source", [])).isdisjoint(reference.MODERN_SOURCES), protocol
  # the filter is the row's protocol: under its own recipe's name a row would sit beside our layer
  if "hgrn2" in attention_zoo.list_layers():
    own = reference.own_reference(followups, "hgrn2")
    assert own.set_index("attention").loc["hgrn2", "source"] == "hgrn2_2024_lra"
    assert set(own["protocol"]) == {"hgrn2"}
  # they are listed with the follow-ups, each with its protocol, and "Our settings" says none of ours runs it
  table = accuracy.followups_table(followups)
  source = table.columns.index("Source")
  rows = {(r[0], r[source]): r for r in table.rows}
  assert rows["LION-S", "lion_2025_table7"][2] == "lion" and rows["LION-S", "lion_2025_table7"][-1] == "—"
  assert rows["HGRN", "hgrn_2023"][1] == "—"
  assert "modern_layers_accuracy.csv" in table.caption


def test_mqar_rows_of_kimi_linear_load_and_stay_beside_no_run_of_ours():
  ref = recall.load_reference(None)
  kimi = ref[ref["source"] == "kimi_linear_2025_fig4"]
  assert len(kimi) == 12 and set(kimi["protocol"]) == {"kimi_linear_synthetic"} and set(kimi["task"]) == {"mqar"}
  value = {(r.model, int(r.seq_len)): float(r.accuracy) for r in kimi.itertuples()}
  assert value["KDA", 2048] == 47.6 and value["GDN", 1024] == 78.7 and value["Mamba2", 256] == 97.6
  assert kimi["note"].str.startswith("figure read (±1 points)").all()
  assert kimi["kv"].isna().all() and kimi["d_model"].isna().all()  # not stated by the report
  assert recall.published_attention("kimi_linear_synthetic", "RWKV") is None
  if "gated_deltanet" in attention_zoo.list_layers():
    assert recall.published_attention("kimi_linear_synthetic", "GDN") == "gated_deltanet"
  # a recall table shows the published rows of its own protocol (or its PUBLISHED_PROTOCOL's) only
  def table(protocol):
    run = dict(protocol=protocol, task="mqar", attention="vanilla", seed=0, seq_len=1024, kv=16, d_model=64,
               lr=1e-3, accuracy=90.0, labels=1000, train_steps=10, wall_seconds=1.0, state_size=None,
               state_note="", config_hash="h", metric="accuracy", rising=False, differs=None)
    tables = recall.recall_tables(pd.DataFrame([run]), protocol, ref).tables
    return "\n".join(t.to_markdown() for t in tables)

  for protocol in ("recall_cpu", "zoology"):
    text = table(protocol)
    assert "KDA" not in text and "Mamba2" not in text and "GDN" not in text
  assert "published: GDN" in table("kimi_linear_synthetic")  # under its own protocol it would be shown
