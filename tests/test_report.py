"""Reports from hand-written records: values, mean ± std, bold best, deltas vs the published numbers,
missing cells with their fix, efficiency ratios, slope fits, and the files (plots non-empty)."""

import os

import numpy as np
import pandas as pd
import pytest

from lra_bench.experiments import results
from lra_bench.report import accuracy, efficiency, plots, reference, viz
from lra_bench.report import index as report_index
from lra_bench.training import config as config_lib


def train_record(attention, task, seed, accuracy, protocol="lra", status="ok", error=None):
  # As results.train_record writes it: the protocol's config and its hash, which includes the seed.
  config = config_lib.load_config(protocol, task, attention=attention, seed=seed)
  return {"kind": "train", "task": task, "attention": attention, "protocol": protocol, "seed": seed,
          "status": status, "error": error, "test_accuracy": accuracy, "config": config.to_dict(),
          "config_hash": config_lib.config_hash(config), "max_length": 10,
          "backend": "cpu", "device_kind": "cpu", "num_devices": 1, "versions": {"jax": "0.10.2"},
          "git_sha": "abc"}


def bench_record(attention, length, sps=None, memory=None, flops=None, status="ok", compile_only=False):
  median = 1.0 / sps if sps else None
  return {"kind": "bench", "task": "text", "attention": attention, "protocol": "bench", "seed": 0,
          "status": status, "max_length": length, "config_hash": f"b{length}", "mode": "train",
          "batch_size": 4, "backend": "cpu", "device_kind": "cpu", "num_devices": 1,
          "compile_only": compile_only, "steps_per_second": sps, "step_seconds_median": median,
          "step_seconds_q25": median and 0.9 * median, "step_seconds_q75": median and 1.1 * median,
          "examples_per_second": sps and 4 * sps, "compiled_memory_bytes": memory,
          "peak_memory_bytes": None, "flops_per_step": flops}


RECORDS = [
    train_record("vanilla", "listops", 0, 0.36), train_record("vanilla", "listops", 1, 0.37),
    train_record("vanilla", "listops", 2, 0.38),
    train_record("performer", "listops", 0, 0.20),
    train_record("vanilla", "text", 0, 0.65), train_record("performer", "text", 0, 0.66),
    train_record("bigbird", "listops", 0, None, status="no_data",
                 error="no file x\nPrepare it with:\n  lra-bench data prepare listops --protocol lra"),
    train_record("combiner_fixed", "listops", 0, None, status="failed", error="RuntimeError: boom"),
    train_record("vanilla", "listops", 0, 0.10, protocol="smoke"),
]
REFERENCE, REFERENCE_EFF = reference.load_reference()


def cell(rep, attention, task):
  row = [r for r in rep.ours.rows if r[1] == attention][0]
  return row[rep.ours.columns.index(task)]


def test_accuracy_table_values_bold_and_deltas():
  rep = accuracy.accuracy_report(RECORDS, "lra", REFERENCE, "RES")
  assert cell(rep, "vanilla", "ListOps") == "37.00 ± 1.00"      # mean ± sample std over seeds 0, 1, 2
  assert cell(rep, "performer", "ListOps") == "20.00"           # one seed: no std
  assert cell(rep, "bigbird", "ListOps") == "no data"
  assert cell(rep, "combiner_fixed", "ListOps") == "failed"
  assert rep.avg_tasks == ["listops", "text"]
  assert cell(rep, "vanilla", "Avg") == "51.00"                 # (37 + 65) / 2
  assert cell(rep, "performer", "Avg") == "43.00"
  assert rep.ours.rows[0][:3] == ["Chance", "", "10.00"]
  # bold: vanilla is best on ListOps and Avg, performer on Text
  row_of = {r[1]: i for i, r in enumerate(rep.ours.rows)}
  col = rep.ours.columns.index
  assert (row_of["vanilla"], col("ListOps")) in rep.ours.bold
  assert (row_of["performer"], col("Text")) in rep.ours.bold
  assert (row_of["vanilla"], col("Text")) not in rep.ours.bold
  assert (row_of["vanilla"], col("Avg")) in rep.ours.bold
  assert "**37.00 ± 1.00**" in rep.ours.to_markdown() and "\\textbf{37.00 $\\pm$ 1.00}" in rep.ours.to_latex()
  # published numbers (LRA Table 1) and deltas
  cells = rep.cells.set_index(["attention", "task"])
  assert cells.loc[("vanilla", "listops"), "reference"] == pytest.approx(36.37)
  assert cells.loc[("vanilla", "listops"), "delta"] == pytest.approx(0.63)
  assert cells.loc[("performer", "text"), "delta"] == pytest.approx(66.0 - 65.40)
  assert cells.loc[("combiner_fixed", "listops"), "reference_source"] == "combiner_paper_table5"
  assert pd.isna(cells.loc[("combiner_fixed", "pathfinder"), "reference"])   # intermediate != hard
  delta_row = [r for r in rep.delta.rows if r[1] == "vanilla"][0]
  assert delta_row[2] == "+0.63"
  published = [r for r in rep.published.rows if r[1] == "vanilla"][0]
  assert published[2] == "36.37" and published[-1] == "lra_paper_table1"
  # missing cells say why and how to fix them
  notes = "\n".join(rep.ours.notes)
  assert "bigbird / ListOps: no data" in notes and "lra-bench data prepare listops --protocol lra && " \
      "lra-bench suite --protocol lra --tasks listops --attentions bigbird --seeds 0,1,2 --results_dir RES" in notes
  assert "combiner_fixed / ListOps: failed — RuntimeError: boom" in notes


def test_other_protocols_are_labelled_not_comparable():
  rep = accuracy.accuracy_report(RECORDS, "smoke", REFERENCE)
  assert "NOT comparable" in rep.ours.caption and rep.delta is None
  assert cell(rep, "vanilla", "ListOps") == "10.00"


def test_a_protocol_with_its_own_paper_is_set_beside_that_papers_rows():
  """``xiong`` runs Xiong et al.'s recipe: its cells sit beside that paper's Table 3 (names, values,
  deltas), not beside LRA Table 1, and without the not-comparable banner."""
  records = [train_record("nystromformer", "listops", 0, 0.3705, protocol="xiong"),
             train_record("performer", "listops", 0, 0.1950, protocol="xiong")]
  own = reference.own_reference(reference.load_followups(), "xiong")
  assert sorted(own["attention"]) == ["linformer", "nystromformer", "performer", "reformer", "vanilla"]
  rep = accuracy.accuracy_report(records, "xiong", own, "RES")
  assert "NOT comparable" not in rep.ours.caption
  cells = rep.cells.set_index(["attention", "task"])
  assert cells.loc[("nystromformer", "listops"), "reference"] == pytest.approx(37.15)
  assert cells.loc[("nystromformer", "listops"), "reference_source"] == "xiong_2021_table3"
  assert cells.loc[("performer", "listops"), "delta"] == pytest.approx(19.50 - 18.80)
  assert cells.loc[("vanilla", "listops"), "reference"] == pytest.approx(37.10)  # "Standard", not LRA's 36.37
  delta = {r[1]: r for r in rep.delta.rows}
  assert delta["nystromformer"][:3] == ["Nystromformer", "nystromformer", "−0.10"]
  published = {r[1]: r for r in rep.published.rows}
  assert published["reformer"][:3] == ["Reformer (2 hashes)", "reformer", "19.05"]
  assert published["vanilla"][-2:] == ["same", "xiong_2021_table3"] and "bigbird" not in published
  # a protocol whose paper published nothing keeps LRA Table 1, for orientation only
  assert reference.own_reference(reference.load_followups(), "smoke").empty


def test_paper_names():
  assert reference.paper_name("vanilla") == "Transformer"
  assert reference.paper_name("combiner_axial_vertical") == "Combiner-Axial"
  assert reference.paper_name("sparse_fixed") == "Sparse Trans."
  assert reference.paper_name("combiner_mixture") is None


BENCH = [bench_record("vanilla", 1024, 2.0, 2 ** 30, 4e9), bench_record("vanilla", 2048, 1.0, 2 ** 32, 16e9),
         bench_record("performer", 1024, 4.0, 2 ** 29, 2e9), bench_record("performer", 2048, status="oom"),
         bench_record("vanilla", 4096, None, 2 ** 34, 64e9, compile_only=True)]


def test_efficiency_tables_ratios_vs_vanilla():
  (group,) = efficiency.efficiency_groups(BENCH, REFERENCE_EFF)
  speed = {r[0]: r[1:] for r in group.speed.rows}
  assert group.speed.columns[-2:] == ["time slope", "vs flash"]   # no flash records: the column says so
  # time slope: seconds per step 0.5 -> 1.0 from 1024 to 2048 (the compile-only 4096 has no time)
  assert speed["vanilla"] == ["2.00", "1.00", "compiled only", "1.00", "no flash records"]
  assert speed["performer"] == ["4.00 (2.00× vanilla)", "OOM", "—", "—", "no flash records"]
  memory = {r[0]: r[1:] for r in group.memory.rows}
  assert memory["vanilla"][:2] == ["1.00 GiB", "4.00 GiB"] and memory["performer"][0] == "512 MiB (0.50× vanilla)"
  assert group.memory.columns[-2] == "slope" and memory["vanilla"][-2] == "2.00"  # 1, 4, 16 GiB at 1K, 2K, 4K
  flops = {r[0]: r[1:] for r in group.flops.rows}
  assert flops["vanilla"][2] == "64.0 G" and flops["vanilla"][3] == "2.00" and flops["performer"][3] == "—"
  published = {r[1]: r[2:] for r in group.published.rows}
  assert published["vanilla"][0] == "1.00×" and published["performer"][3] == f"{8.0 / 1.4:.2f}×"


def test_efficiency_ratios_vs_flash():
  with_flash = BENCH + [bench_record("flash", 1024, 8.0, 2 ** 28, 4e9)]
  (group,) = efficiency.efficiency_groups(with_flash, REFERENCE_EFF)
  speed = {r[0]: r[1:] for r in group.speed.rows}
  assert group.speed.columns[-1] != "vs flash" and list(speed)[:2] == ["vanilla", "flash"]
  assert speed["performer"][0] == "4.00 (2.00× vanilla, 0.50× flash)"
  assert speed["vanilla"][:2] == ["2.00 (0.25× flash)", "1.00"]  # no flash point at 2048: no ratio
  assert speed["flash"][0] == "8.00 (4.00× vanilla)"


def _timed(attention, times, memory=None):
  """Core-mode records of ``attention`` with these seconds per step (and compiled bytes) per length."""
  memory = memory or {}
  return [dict(bench_record(attention, length, 1.0 / t if t else None, memory.get(length, 2 ** 20), 1e9,
                            status="ok" if t else "oom"), mode="core",
               config={"model": {"num_heads": 4, "qkv_dim": 256}})
          for length, t in times.items()]


VANILLA_TIMES = {512: 1.0, 1024: 2.0, 2048: 4.0, 4096: 8.0}
CROSSING = (_timed("vanilla", VANILLA_TIMES, {512: 100, 1024: 200, 2048: 400, 4096: 800})
            + _timed("faster_from_1024", {512: 1.5, 1024: 1.9, 2048: 3.0, 4096: 5.0},
                     {512: 150, 1024: 150, 2048: 150, 4096: 150})
            + _timed("never_faster", {512: 2.0, 1024: 3.0, 2048: 5.0, 4096: 9.0})
            + _timed("faster_slower_faster", {512: 1.5, 1024: 1.0, 2048: 5.0, 4096: 7.0}))


def test_crossover_lengths():
  """L*: the shortest measured length from which the attention is faster than the baseline there and at
  every longer length; "never (≤ Lmax)" without one; "—" without the baseline's records."""
  (group,) = efficiency.efficiency_groups(CROSSING, REFERENCE_EFF)
  frame = group.frame
  assert efficiency.crossover(frame, "faster_from_1024", "vanilla", "step_seconds_median") == (1024, "1024")
  assert efficiency.crossover(frame, "never_faster", "vanilla", "step_seconds_median") == (None, "never (≤ 4096)")
  assert efficiency.crossover(frame, "faster_slower_faster", "vanilla", "step_seconds_median") == (4096, "4096")
  # memory: 150 bytes against vanilla's 100, 200, 400, 800 -> smaller from 1024
  assert efficiency.crossover(frame, "faster_from_1024", "vanilla", "compiled_memory_bytes") == (1024, "1024")
  assert efficiency.crossover(frame, "faster_from_1024", "flash", "step_seconds_median") == (None, "—")
  assert efficiency.crossover(frame, "vanilla", "vanilla", "step_seconds_median") == (None, "—")
  # Out of memory: the baseline's is the attention's win, the attention's its loss.
  oom = CROSSING + _timed("vanilla", {8192: None}) + _timed("never_faster", {8192: 20.0})
  (group,) = efficiency.efficiency_groups(oom, REFERENCE_EFF)
  assert efficiency.crossover(group.frame, "never_faster", "vanilla", "step_seconds_median") == (8192, "8192")
  assert efficiency.crossover(group.frame, "faster_from_1024", "vanilla", "step_seconds_median")[1] == "1024"
  lost = CROSSING + _timed("faster_from_1024", {8192: None}) + _timed("vanilla", {8192: 16.0})
  (group,) = efficiency.efficiency_groups(lost, REFERENCE_EFF)
  assert efficiency.crossover(group.frame, "faster_from_1024", "vanilla", "step_seconds_median")[1] == \
      "never (≤ 8192)"


def test_crossover_table_and_its_caption():
  (group,) = efficiency.efficiency_groups(CROSSING, REFERENCE_EFF)
  table = group.crossover
  rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
  assert rows["faster_from_1024"]["faster than vanilla from"] == "1024"
  assert rows["faster_from_1024"]["smaller than vanilla from"] == "1024"
  assert rows["never_faster"]["faster than vanilla from"] == "never (≤ 4096)"
  assert rows["faster_slower_faster"]["faster than vanilla from"] == "4096"
  assert rows["faster_from_1024"]["faster than flash from"] == "—"
  assert rows["vanilla"]["family"] == "exact" and rows["never_faster"]["family"] == "other"
  assert [r[0] for r in table.rows][0] == "vanilla"   # by family: exact first, "other" last
  # every line has its slopes: vanilla's time doubles with the length (1.00), its FLOPs stay (0.00)
  assert rows["vanilla"]["slope time"] == "1.00" and rows["vanilla"]["slope FLOPs"] == "0.00"
  assert rows["vanilla"]["slope memory"] == "1.00"
  for text in ("attention core forward + backward", "batch 4", "4 heads x 64", "cpu", "shortest measured length",
               "never (≤ Lmax)", "lengths 512–4096"):
    assert text in table.caption, text
  numbers = group.crossover_frame.set_index("attention")
  assert numbers.loc["faster_slower_faster", "faster_than_vanilla_from"] == 4096
  assert pd.isna(numbers.loc["never_faster", "faster_than_vanilla_from"])
  assert numbers.loc["vanilla", "time_slope"] == pytest.approx(1.0)


def test_followups_are_a_separate_table_labelled_by_protocol():
  table = accuracy.followups_table(reference.load_followups())
  rows = {r[0]: r for r in table.rows}
  assert rows["Standard"][1:3] == ["vanilla", "nystromformer (2 layers x 64)"]
  assert rows["Luna-256"][1] == "luna" and rows["Performer (256)"][1] == "performer"
  assert "not comparable with LRA Table 1" in table.caption
  # never merged into the LRA ranking: Nystromformer's row is absent from the published LRA table
  rep = accuracy.accuracy_report(RECORDS, "lra", REFERENCE)
  assert all("Nystromformer" not in str(r) for r in rep.published.rows)


def test_slope_fit_on_power_laws():
  x = np.array([256, 512, 1024, 4096])
  assert plots.fit_slope(x, 3.0 * x ** 2.0) == pytest.approx(2.0)
  assert plots.fit_slope(x, 0.5 * x) == pytest.approx(1.0)
  assert plots.fit_slope(x, 7.0 * x ** 1.5 * np.exp([0.01, -0.01, 0.01, -0.01])) == pytest.approx(1.5, abs=0.02)
  assert plots.fit_slope([1024], [1.0]) is None
  assert plots.fit_slope([1, 2], [0.0, np.nan]) is None


def test_write_report_files(tmp_path, fast_compile):
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  for r in RECORDS + BENCH:
    results.append_record(results_dir, r)
  paths = report_index.write_report(results_dir, out, attention_names=["vanilla"], command="lra-bench report")
  names = {os.path.basename(p) for p in paths}
  for name in ("index.md", "accuracy_lra.md", "accuracy_lra.csv", "accuracy_lra.tex", "accuracy_smoke.md",
               "efficiency_train_b4_cpu.md", "efficiency_train_b4_cpu.csv", "scaling_train_b4_cpu_time.png",
               "scaling_train_b4_cpu_time.svg", "scaling_train_b4_cpu_memory.png", "crossover_train_b4_cpu.md",
               "crossover_train_b4_cpu.csv", "crossover_train_b4_cpu.tex", "bubble_lra.png", "bubble_lra.svg",
               "attention_patterns.png", "attention_patterns.svg"):
    assert name in names, name
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  with open(os.path.join(out, "index.md")) as f:
    index = f.read()
  assert "](scaling_train_b4_cpu_time.png)" in index and "](attention_patterns.png)" in index
  assert "faster than vanilla from" in index
  assert "cpu / cpu × 1" in index and "jax 0.10.2" in index and "`lra`" in index
  assert "## Published under other protocols (not comparable with LRA Table 1)" in index


def test_viz_attention_command(tmp_path, fast_compile):
  (path,) = viz.plot_attention("vanilla", str(tmp_path / "v.svg"), 16)
  assert os.path.getsize(path) > 0
  with pytest.raises(ValueError, match="unknown attention 'nope'"):
    viz.plot_attention("nope", str(tmp_path / "n.png"), 16)
  assert not os.path.exists(tmp_path / "n.png")


def test_benchmark_only_results_have_no_accuracy_section(tmp_path, fast_compile):
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  for r in BENCH:
    results.append_record(results_dir, r)
  paths = report_index.write_report(results_dir, out, attention_names=["vanilla"])
  names = {os.path.basename(p) for p in paths}
  assert "efficiency_train_b4_cpu.md" in names and not any(n.startswith("accuracy_") for n in names)
  with open(os.path.join(out, "index.md")) as f:
    index = f.read()
  assert "## Accuracy" not in index and "Benchmark records only" in index


def test_the_report_names_no_absolute_path(tmp_path, monkeypatch, fast_compile):
  """index.md names the records (and the commands that fill its missing cells) relative to where the report was
  made, never by the machine's absolute path (here the results dir is given absolute, beside the cwd)."""
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  results.append_record(results_dir, RECORDS[0])
  elsewhere = tmp_path / "cwd"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  report_index.write_report(results_dir, out, attention_names=["vanilla"])
  with open(os.path.join(out, "index.md")) as f:
    index = f.read()
  assert str(tmp_path) not in index and "`../results/results.jsonl`" in index
  monkeypatch.chdir(tmp_path)
  assert report_index.shown_path(results_dir) == "results"


def test_missing_cells_fix_commands_name_the_data_folder_relative_to_the_report(tmp_path, monkeypatch):
  """A cell without data records its fix with the absolute --data_dir it ran with (run_all.sh passes
  $PWD/lra_data); the report made in that folder shows `--data_dir lra_data`, never the machine's path."""
  data = tmp_path / "lra_data"
  error = (f"text data not found: TFDS dataset 'imdb_reviews' is not prepared in {data}/tfds\nPrepare it with:\n"
           f"  lra-bench data prepare text --protocol lra --data_dir {data}")
  results_dir, out = str(tmp_path / "results"), str(tmp_path / "report")
  for attention in ("vanilla", "performer"):
    results.append_record(results_dir, train_record(attention, "text", 0, None, status="no_data", error=error))
  monkeypatch.chdir(tmp_path)
  report_index.write_report(results_dir, out, attention_names=["vanilla", "performer"])
  with open(os.path.join(out, "accuracy_lra.md")) as f:
    table = f.read()
  assert "Fix: `lra-bench data prepare text --protocol lra --data_dir lra_data && " in table
  assert str(tmp_path) not in table


def test_paths_are_shortened_only_where_they_start_in_the_working_directory(tmp_path, monkeypatch):
  """Made in "/", a report leaves relative paths alone (the unanchored rule turned results/cpu into
  resultscpu); a folder named like the working directory inside another path is not cut either."""
  monkeypatch.chdir("/")
  assert accuracy._local("Fix: `lra-bench suite --results_dir results/cpu`") == \
      "Fix: `lra-bench suite --results_dir results/cpu`"
  monkeypatch.chdir(tmp_path)
  assert accuracy._local(f"in {tmp_path}/lra_data/tfds and /x{tmp_path}/y") == f"in lra_data/tfds and /x{tmp_path}/y"


def test_a_task_without_any_result_is_one_note_not_a_column_of_no_data(tmp_path):
  """ListOps has results, Text none (no data for any attention): the table has no Text column, its caption
  says so, and the notes give Text's one line with the fix; a task with a failed cell keeps its column."""
  error = "no file x\nPrepare it with:\n  lra-bench data prepare text --protocol lra"
  records = [train_record("vanilla", "listops", 0, 0.36), train_record("performer", "listops", 0, 0.20),
             train_record("vanilla", "text", 0, None, status="no_data", error=error),
             train_record("performer", "text", 0, None, status="no_data", error=error),
             train_record("vanilla", "retrieval", 0, None, status="failed", error="RuntimeError: boom")]
  rep = accuracy.accuracy_report(records, "lra", REFERENCE)
  md = rep.ours.to_markdown()
  header = next(line for line in md.splitlines() if line.startswith("| Model"))
  assert header.split("|")[3:6] == [" ListOps ", " Retrieval ", " Avg "]
  assert "Without any result, so not shown as columns: Text" in md
  assert "Text: no data for any attention. Fix: `lra-bench data prepare text --protocol lra && " in md


def test_memory_columns_name_their_source_and_never_mix():
  """The compiled estimate (every backend) and the measured device peak (GPU/TPU) are separate tables
  whose captions say which is which; a point without a measured peak is n/a there, not its estimate."""
  gpu = [dict(bench_record("vanilla", 1024, 2.0, 2 ** 30, 4e9), peak_memory_bytes=3 * 2 ** 30),
         dict(bench_record("performer", 1024, 4.0, 2 ** 29, 2e9), peak_memory_bytes=None),
         bench_record("vanilla", 2048, None, 2 ** 32, 16e9, compile_only=True)]
  (group,) = efficiency.efficiency_groups(gpu, REFERENCE_EFF)
  compiled = {r[0]: r[1:] for r in group.memory.rows}
  assert compiled["vanilla"][:2] == ["1.00 GiB", "4.00 GiB"] and compiled["performer"][0] == "512 MiB (0.50× vanilla)"
  assert efficiency.COMPILED_MEMORY in group.memory.caption and efficiency.COMPILED_MEMORY == group.memory_source
  peak = {r[0]: r[1:] for r in group.peak_memory.rows}
  assert peak["vanilla"][:2] == ["3.00 GiB", "compiled only"] and peak["performer"][0] == "n/a"
  assert efficiency.DEVICE_PEAK in group.peak_memory.caption
  assert group.frame.memory_bytes.tolist() == group.frame.compiled_memory_bytes.tolist()
  # A CPU run (no point with a measured peak) has no peak table at all.
  (cpu,) = efficiency.efficiency_groups(BENCH, REFERENCE_EFF)
  assert cpu.peak_memory is None and cpu.memory_source == efficiency.COMPILED_MEMORY


def test_the_attention_dropout_rate_is_in_the_caption_and_splits_sweeps():
  """A point's cost depends on its attention dropout (the mask's random bits), so the captions name the
  rate, and two sweeps of one mode, batch and device at different rates are two groups, two file stems."""
  off = [dict(r, config={"model": {**r["config"]["model"], "attention_dropout_rate": 0.0}}) for r in CROSSING]
  (group,) = efficiency.efficiency_groups(off, REFERENCE_EFF)
  assert "attention dropout off" in group.setting and "attention dropout off" in group.crossover.caption
  assert group.stem == "core_b4_cpu" and group.attention_dropout is None
  on = [dict(r, config={"model": {**r["config"]["model"], "attention_dropout_rate": 0.1}},
             config_hash=r["config_hash"] + "d") for r in CROSSING]
  groups = efficiency.efficiency_groups(off + on, REFERENCE_EFF)
  assert [(g.attention_dropout, g.stem) for g in groups] == [(0.0, "core_b4_cpu_dropout0"),
                                                             (0.1, "core_b4_cpu_dropout0p1")]
  assert "attention dropout 0.1" in groups[1].setting and "off" not in groups[1].setting
  # each group holds its own sweep's points only
  assert all(len(g.frame) == len(CROSSING) for g in groups)
  # a point whose record has no config is kept, in a group of its own with the plain stem
  bare = dict(bench_record("vanilla", 8192, 0.5, 2 ** 20, 1e9), mode="core", config_hash="bare")
  groups = efficiency.efficiency_groups(off + on + [bare], REFERENCE_EFF)
  assert [g.stem for g in groups] == ["core_b4_cpu_dropout0", "core_b4_cpu_dropout0p1", "core_b4_cpu"]
  assert groups[2].frame.length.tolist() == [8192]
  # one sweep in which a preset runs at its own rate (LRA's reformer: no attention dropout) stays one
  # group, its crossovers against vanilla computed, and the caption names the exception
  preset = [r if r["attention"] != "never_faster" else
            dict(r, config={"model": {**r["config"]["model"], "attention_dropout_rate": 0.0}}) for r in on]
  (group,) = efficiency.efficiency_groups(preset, REFERENCE_EFF)
  assert group.stem == "core_b4_cpu" and set(group.frame.attention) == {r["attention"] for r in CROSSING}
  assert "attention dropout 0.1 (off for never_faster)" in group.crossover.caption
  assert group.crossover_frame.set_index("attention").loc["faster_from_1024", "faster_than_vanilla_from"] == 1024
