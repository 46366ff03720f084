"""The run's headline (issue: "the headline at the end, on the terminal"): ``report.summary.headline`` is the
one source of the summary that index.md opens with and that ``lra-bench report`` prints, and its figures are
the report's own: vanilla's accuracy and Wilson interval, the attentions significantly better or worse than
vanilla, the lowest and highest time slope and the crossovers against vanilla equal the CSVs' numbers."""

import os
import re
import subprocess
import sys

import pandas as pd
import pytest

from lra_bench.experiments import results
from lra_bench.report import index as report_index
from lra_bench.report import summary
from tests.test_report import bench_record, train_record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(attention, accuracy, seed=0, task="listops", examples=2000):
  return dict(train_record(attention, task, seed, accuracy, protocol="smoke"), test_examples=examples)


# vanilla 60 % on 2000 test examples; performer clearly above, bigbird and linformer clearly below, local
# within noise; text has no data at all.
RECORDS = [_train("vanilla", 0.60), _train("performer", 0.70), _train("bigbird", 0.40), _train("linformer", 0.45),
           _train("local", 0.605),
           dict(train_record("vanilla", "text", 0, None, protocol="smoke", status="no_data",
                             error="no imdb\nPrepare it with:\n  lra-bench data prepare text"))]
# seconds per step: vanilla ~ L^2, performer and local ~ L (faster from 512 and 1024), bigbird never faster
TIMES = {"vanilla": (1.0, 4.0, 16.0), "performer": (2.0, 3.0, 4.5), "local": (1.5, 4.5, 6.0),
         "bigbird": (2.0, 10.0, 50.0)}
BENCH = [bench_record(name, length, sps=1.0 / t) for name, times in TIMES.items()
         for length, t in zip((256, 512, 1024), times)]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  root = tmp_path_factory.mktemp("summary")
  results_dir, out = str(root / "results"), str(root / "report")
  for record in RECORDS + BENCH:
    results.append_record(results_dir, record)
  report_index.write_report(results_dir, out, attention_names=[])
  return results_dir, out


def _read(path):
  with open(path, encoding="utf-8") as f:
    return f.read()


def test_index_opens_with_the_summary(report):
  _, out = report
  text = _read(os.path.join(out, summary.FILE))
  index = _read(os.path.join(out, "index.md"))
  assert text.startswith(f"## {summary.TITLE}\n")
  # right after the title and the "Generated ..." line, before every table
  assert index.index(text) < index.index("## Accuracy") and index.split("\n")[4] == f"## {summary.TITLE}"


def test_the_summarys_figures_are_the_reports(report):
  _, out = report
  text = _read(os.path.join(out, summary.FILE))
  cells = pd.read_csv(os.path.join(out, "accuracy_smoke.csv")).set_index(["attention", "task"])
  vanilla = cells.loc[("vanilla", "listops")]
  line = next(l for l in text.splitlines() if l.startswith("- Accuracy, protocol smoke, ListOps:"))
  assert f"vanilla {vanilla['mean']:.2f} [{vanilla.ci_low:.1f}, {vanilla.ci_high:.1f}] on 2000 test examples" in line
  better = re.search(r"significantly better \((\d+)\): ([^;]*)", line)
  worse = re.search(r"significantly worse \((\d+)\): ([^;]*)", line)
  ours = cells.xs("listops", level="task")
  higher = ours[ours.vs_vanilla == "higher"]
  lower = ours[ours.vs_vanilla == "lower"]
  assert int(better.group(1)) == len(higher) == 1 and better.group(2) == "performer 70.00"
  assert int(worse.group(1)) == len(lower) == 2
  assert worse.group(2) == ", ".join(f"{a} {m:.2f}" for a, m in lower["mean"].sort_values().items())
  assert "not significantly different: 1" in line            # local, 60.5 vs 60.0 on 2000 examples
  assert "- Accuracy, protocol smoke: no results for Text" in text
  crossover = pd.read_csv(os.path.join(out, "crossover_train_b4_cpu.csv")).set_index("attention")
  line = next(l for l in text.splitlines() if l.startswith("- Efficiency, train, batch 4, cpu:"))
  slopes = crossover.time_slope.sort_values()
  assert f"lowest {slopes.index[0]} {slopes.iloc[0]:.2f}, highest {slopes.index[-1]} {slopes.iloc[-1]:.2f}" in line
  assert slopes.index[-1] == "bigbird" and f"vanilla {crossover.time_slope['vanilla']:.2f}" in line
  shown = dict(re.findall(r"(\w+) (\d+)", line.split("faster than vanilla from")[1].split(";")[0]))
  expected = {a: str(int(n)) for a, n in crossover.faster_than_vanilla_from.dropna().items()}
  assert shown == expected == {"performer": "512", "local": "1024"}
  assert "never faster at the longest length compared: 1" in line  # bigbird


def test_the_report_command_prints_the_summary(report):
  results_dir, out = report
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "report", f"--results_dir={results_dir}",
                         f"--out={out}", "--patterns=none"], cwd=REPO, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith(_read(os.path.join(out, summary.FILE)).rstrip("\n"))
  assert proc.stdout.rstrip().endswith(f"start at {os.path.join(out, 'index.md')}")
  # not a terminal: the report's steps are lines, one per finished step
  steps = [l for l in proc.stderr.splitlines() if l.startswith("report: ")]
  assert steps[-1].startswith("report: 4/4 steps: summary and index.md")
