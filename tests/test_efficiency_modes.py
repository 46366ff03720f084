"""A layer benchmarked in both of its forms (``mode="chunk"``, the default, and ``mode="recurrent"``) is two
rows of the efficiency tables, in the layer's own family."""

from __future__ import annotations

from lra_bench.report import efficiency


def _record(mode: str | None, seconds: float) -> dict:
  kwargs = {} if mode is None else {"mode": mode}
  return {"kind": "bench", "attention": "gla", "task": "text", "protocol": "bench", "seed": 0, "max_length": 1024,
          "status": "ok", "mode": "core", "config_hash": mode or "default", "step_seconds_median": seconds,
          "config": {"model": {"attention_kwargs": kwargs, "num_heads": 4, "qkv_dim": 256}}}


def test_the_two_forms_of_a_layer_are_two_rows_of_its_family():
  frame = efficiency.bench_frame([_record(None, 0.1), _record("recurrent", 0.5), _record("chunk", 0.2)])
  assert sorted(frame["attention"]) == ["gla", "gla", "gla (recurrent)"]
  assert set(frame["family"]) == {"linear-recurrent"}
  recurrent = frame[frame["attention"] == "gla (recurrent)"]
  assert recurrent["step_seconds_median"].tolist() == [0.5]


def test_the_crossover_table_keeps_a_recurrent_row_in_its_layers_family():
  frame = efficiency.bench_frame([_record(None, 0.1), _record("recurrent", 0.5)])
  table = efficiency.crossover_frame(frame, ["gla", "gla (recurrent)"])
  assert table["family"].tolist() == ["linear-recurrent", "linear-recurrent"]


def test_core_forward_records_are_the_forward_column_of_the_core_group_not_a_group():
  """One group per (mode, batch, device), except ``core_forward``: its records fill the ``core`` group's forward
  column (same batch, device, heads and attention dropout), beside the forward + backward time."""
  import pandas as pd

  def point(mode: str, seconds: float, **fields) -> dict:
    return dict(_record(None, seconds), mode=mode, config_hash=mode, batch_size=1, device_kind="cpu",
                backend="cpu", compile_only=False, **fields)

  records = [point("core", 0.2), point("core_forward", 0.05), point("train", 1.0), point("inference", 0.3)]
  groups = efficiency.efficiency_groups(records, pd.DataFrame())
  assert [g.mode for g in groups] == ["core", "inference", "train"]
  core = groups[0]
  row = core.checks_frame.set_index("attention").loc["gla"]
  assert row.forward_seconds == 0.05 and row.step_seconds == 0.2
  assert core.checks.columns[2:4] == ["forward", "fwd+bwd"] and core.checks.rows[0][2:4] == ["50 ms", "200 ms"]
  assert groups[2].checks_frame.set_index("attention").loc["gla"].forward_seconds == 0.3  # train: from inference
