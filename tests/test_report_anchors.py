"""The efficiency report's checkable numbers: achieved FLOP/s against the device's peak, FlashAttention-2's
FLOP count of exact attention, the label of an unfused flash row, and the published anchors (the CSVs and
the report's "Published anchors" section)."""

import os

import pandas as pd
import pytest

from lra_bench.experiments import results
from lra_bench.report import efficiency, reference
from lra_bench.report import index as report_index

H100 = "NVIDIA H100 80GB HBM3"
_, REFERENCE_EFF = reference.load_reference()


def core_record(attention, length, seconds, flops, *, device=H100, backend="gpu", mode="core", **fields):
  """A bench record of batch 2, 4 heads x 64 (qkv 256), as bench.py writes it, plus ``fields``."""
  return {"kind": "bench", "task": "text", "attention": attention, "protocol": "bench", "seed": 0,
          "status": "ok", "max_length": length, "config_hash": f"{attention}{length}{mode}", "mode": mode,
          "batch_size": 2, "backend": backend, "device_kind": device, "num_devices": 1, "compile_only": False,
          "steps_per_second": 1 / seconds, "step_seconds_median": seconds, "step_seconds_q25": seconds,
          "step_seconds_q75": seconds, "compiled_memory_bytes": 1e9, "flops_per_step": flops,
          "config": {"precision": "float32", "model": {"num_heads": 4, "qkv_dim": 256, "attention_kwargs": {}}},
          **fields}


def checks_of(records):
  (group,) = efficiency.efficiency_groups(records, REFERENCE_EFF)
  return group, group.checks_frame.set_index(["attention", "length"])


def test_fa2_count_of_a_known_shape():
  # 4·B·H·L²·D forward; x3.5 forward + backward; /2 causal
  assert efficiency.fa2_attention_flops(2, 4, 1024, 64, backward=False) == 4 * 2 * 4 * 1024 ** 2 * 64
  assert efficiency.fa2_attention_flops(2, 4, 1024, 64) == 3.5 * 4 * 2 * 4 * 1024 ** 2 * 64 == 7516192768.0
  assert efficiency.fa2_attention_flops(2, 4, 1024, 64, causal=True) == 7516192768.0 / 2


def test_flops_per_second_and_fraction_of_peak_of_a_synthetic_record():
  records = [core_record("flash", 1024, 0.002, 3.0e10, compute_dtype="bfloat16", attention_implementation="cudnn"),
             core_record("vanilla", 1024, 0.004, 3.0e10, compute_dtype="bfloat16"),
             core_record("local", 1024, 0.001, 1.0e9, compute_dtype="bfloat16")]
  group, checks = checks_of(records)
  flash = checks.loc[("flash", 1024)]
  assert flash.model_flops_per_second == 1.5e13                 # 3e10 FLOPs / 2 ms
  assert flash.peak_flops_per_second == 989e12 and flash.peak_compute == "bfloat16"
  assert flash.fraction_of_peak == pytest.approx(1.5e13 / 989e12)
  assert flash.fa2_attention_flops_per_second == 7516192768.0 / 0.002   # FA2's count / time
  assert checks.loc[("vanilla", 1024)].vs_flash == 2.0
  assert pd.isna(checks.loc[("local", 1024)].fa2_attention_flops)         # not exact attention: no FA2 count
  rows = {r[0]: r for r in group.checks.rows}
  # the forward column, never recorded in mode core, is left out (the caption says so)
  assert group.checks.columns[2:] == ["fwd+bwd", "× flash", "model FLOP/s (XLA)", "of peak",
                                      "attention FLOP/s (FA2 count)"]
  assert rows["flash"][1:] == ["1024", "2 ms", "", "15 TFLOP/s", "1.52 %", "3.76 TFLOP/s"]
  assert rows["vanilla"][3] == "2.00×"
  assert "peak 989 TFLOP/s" in group.checks.caption and "nvidia_h100_datasheet" in group.checks.caption


def test_float32_on_a_gpu_is_held_against_tf32_unless_highest():
  assert efficiency.peak_compute("float32", None, "gpu")[0] == "tf32"
  assert efficiency.peak_compute("float32", "highest", "gpu")[0] == "float32"
  assert efficiency.peak_compute(None, None, "gpu") == (None, "compute dtype not recorded")
  # the record's precision (no compute_dtype): float32 at the default precision, TF32's 494 TFLOP/s
  _, checks = checks_of([core_record("vanilla", 1024, 0.01, 4.94e12)])
  assert checks.loc[("vanilla", 1024)].fraction_of_peak == pytest.approx(1.0)
  # a CPU has no peak: nothing is invented
  group, checks = checks_of([core_record("vanilla", 1024, 0.01, 1e9, device="cpu", backend="cpu")])
  assert pd.isna(checks.loc[("vanilla", 1024)].peak_flops_per_second)
  assert "of peak" not in group.checks.columns          # no row has a peak: the column is left out
  assert "peak not known for this device" in group.checks.caption


def test_a_flash_record_that_does_not_say_fused_is_labelled_unfused():
  assert efficiency.row_label("flash", None) == "flash (unfused: not recorded)"
  assert efficiency.row_label("flash", "xla") == "flash (unfused: xla)"
  assert efficiency.row_label("flash", "cudnn") == "flash"
  assert efficiency.row_label("vanilla", None) == "vanilla"
  group, _ = checks_of([core_record("flash", 1024, 0.002, 3e10, attention_implementation="xla"),
                        core_record("vanilla", 1024, 0.002, 3e10)])
  assert [r[0] for r in group.checks.rows] == ["vanilla", "flash (unfused: xla)"]


def test_the_published_csvs_parse_with_their_columns():
  flash = reference.load_flash_reference()
  assert list(flash.columns) == reference.FLASH_COLUMNS
  fa2 = flash[(flash.source == "dao_2023_fa2_fig4") & (flash.implementation == "FlashAttention-2")
              & (flash.causal == "false") & (flash.head_dim == "64")]
  assert fa2.set_index("seq_len").tflops.to_dict() == {"512": "132", "1024": "162", "2048": "171", "4096": "175",
                                                       "8192": "176", "16384": "176"}
  assert set(flash.hardware) == {"NVIDIA A100 80GB SXM4", "NVIDIA H100 SXM5"}
  fla = reference.load_fla_reference()
  assert list(fla.columns) == reference.FLA_COLUMNS
  row = fla[(fla.direction == "fwd+bwd") & (fla.batch == "1") & (fla.seq_len == "8192")].set_index("op").ms
  assert row.to_dict() == {"chunk_retention": "2.618", "chunk_gla": "7.670", "chunk_gdn": "4.738",
                           "flash_attn": "15.371"}
  assert set(fla.hardware) == {"NVIDIA GB200"} and set(fla.causal) == {"true"}
  peaks = reference.load_device_peaks()
  assert list(peaks.columns) == reference.PEAK_COLUMNS
  assert set(peaks.source) <= set(reference.ANCHOR_SOURCES) and set(flash.source) <= set(reference.ANCHOR_SOURCES)
  # every device kind of a committed GPU report is spelled as jax spells it there
  assert {H100, "NVIDIA H200"} <= set(peaks.device_kind)


def test_the_report_page_has_the_anchors_beside_our_rows(tmp_path):
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  for r in [core_record("vanilla", 1024, 0.004, 3e10, compute_dtype="bfloat16"),
            core_record("flash", 1024, 0.002, 3e10, compute_dtype="bfloat16")]:
    results.append_record(results_dir, r)
  paths = report_index.write_report(results_dir, out)
  assert "checks_core_b2_nvidia-h100-80gb-hbm3.csv" in {os.path.basename(p) for p in paths}
  with open(os.path.join(out, "index.md")) as f:
    index = f.read()
  assert "### Published anchors" in index and "### Time, ratio to flash and FLOP/s per length" in index
  # ours (FA2's count over our time) beside FA2's figure at the same length
  assert "| 1024 | 1.88 TFLOP/s | 3.76 TFLOP/s | 162 TFLOP/s | 181 TFLOP/s | not given |" in index
  assert "| ours: vanilla | ours: flash (unfused: not recorded) |" in index
  assert "chunk_gla (gla) ms" in index and "NVIDIA GB200" in index


def test_the_matmul_precision_strings_records_write():
  for precision, compute in (("default (tf32 on gpu)", "tf32"), ("tensorfloat32", "tf32"), ("highest", "float32"),
                             ("default (gpu: float32)", "float32"), ("default (gpu)", None)):
    assert efficiency.peak_compute("float32", precision, "gpu")[0] == compute, precision
  assert efficiency.peak_compute("bfloat16", "default (tf32 on gpu)", "gpu")[0] == "bfloat16"
  assert efficiency.row_label("flash", "cudnn (not found in compiled program)") == \
      "flash (unfused: cudnn (not found in compiled program))"
  assert efficiency.row_label("flash", "explicit (training dropout)") == "flash (unfused: explicit (training dropout))"


def test_a_core_group_takes_its_forward_column_from_the_matching_core_forward_records():
  """A ``core_forward`` record is the forward column of the ``core`` point of the same batch, device, heads and
  attention dropout (not a group of its own); its FA2 rate uses FA2's forward count, 4·B·H·L²·D."""
  eight_heads = {"precision": "float32", "model": {"num_heads": 8, "qkv_dim": 256, "attention_kwargs": {}}}
  records = [core_record("flash", 1024, 0.002, 3e10, compute_dtype="bfloat16", attention_implementation="cudnn"),
             core_record("flash", 1024, 0.0005, 1e10, mode="core_forward", compute_dtype="bfloat16",
                         attention_implementation="cudnn"),
             core_record("vanilla", 1024, 0.004, 3e10, compute_dtype="bfloat16"),
             # 8 heads of 32: another point than vanilla's 4 x 64, so not its forward
             core_record("vanilla", 1024, 0.001, 1e10, mode="core_forward", compute_dtype="bfloat16",
                         config=eight_heads)]
  group, checks = checks_of(records)  # one group: the core_forward records are its forward column
  assert group.mode == "core"
  flash = checks.loc[("flash", 1024)]
  assert flash.forward_seconds == 0.0005 and flash.step_seconds == 0.002
  assert flash.fa2_forward_flops == 4 * 2 * 4 * 1024 ** 2 * 64
  assert flash.fa2_forward_flops_per_second == 4 * 2 * 4 * 1024 ** 2 * 64 / 0.0005
  assert flash.fa2_attention_flops_per_second == 7516192768.0 / 0.002  # fwd+bwd: still FA2's x3.5 count
  assert pd.isna(checks.loc[("vanilla", 1024)].forward_seconds)
  assert group.checks.columns == ["Attention", "L", "forward", "fwd+bwd", "× flash", "model FLOP/s (XLA)", "of peak",
                                  "attention FLOP/s (FA2 count)", "forward attention FLOP/s (FA2 count)"]
  rows = {r[0]: r for r in group.checks.rows}
  assert rows["flash"][2:4] == ["0.5 ms", "2 ms"] and rows["flash"][8] == "4.29 TFLOP/s"
  assert rows["vanilla"][2] == "—" and rows["vanilla"][8] == "—"
  assert "the core's forward alone (mode core_forward" in group.checks.caption


def test_core_forward_records_without_a_core_group_are_one_titled_forward_only():
  group, checks = checks_of([core_record("vanilla", 1024, 0.0005, 1e10, mode="core_forward")])
  assert group.mode == "core_forward" and group.what.startswith("attention core forward only")
  assert checks.loc[("vanilla", 1024)].fa2_attention_flops == 4 * 2 * 4 * 1024 ** 2 * 64  # the forward count
  assert group.checks.columns[:3] == ["Attention", "L", "forward"]  # the step is the forward: no second column
  assert "not comparable in mode core_forward" in group.anchors[0].caption


def test_sweeps_in_two_compute_dtypes_on_one_device_are_two_groups_never_one_table():
  # a float32 lease and a bfloat16 one of the same points (their config hashes differ, as precision does)
  records = [core_record("vanilla", 1024, 0.004, 3e10, compute_dtype="float32"),
             core_record("flash", 1024, 0.003, 3e10, compute_dtype="float32"),
             {**core_record("vanilla", 1024, 0.002, 3e10, compute_dtype="bfloat16"), "config_hash": "v-bf16"},
             {**core_record("flash", 1024, 0.001, 3e10, compute_dtype="bfloat16"), "config_hash": "f-bf16"}]
  groups = efficiency.efficiency_groups(records, REFERENCE_EFF)
  assert [g.stem for g in groups] == ["core_b2_nvidia-h100-80gb-hbm3_bfloat16", "core_b2_nvidia-h100-80gb-hbm3_float32"]
  by_dtype = {g.compute_dtype: g for g in groups}
  assert by_dtype["bfloat16"].setting.endswith(", bfloat16") and by_dtype["float32"].setting.endswith(", float32")
  assert sorted(by_dtype["bfloat16"].frame.step_seconds_median) == [0.001, 0.002]
  assert by_dtype["float32"].checks_frame.set_index("attention").loc["vanilla"].vs_flash == pytest.approx(4 / 3)
  # one dtype: one group, named as before
  (single,) = efficiency.efficiency_groups(records[:2], REFERENCE_EFF)
  assert single.stem == "core_b2_nvidia-h100-80gb-hbm3" and single.compute_dtype is None
