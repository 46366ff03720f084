"""The example external package ``examples/my_attention`` end to end, through the ``lra-bench`` command
in fresh processes, as a researcher with their own package would use it: the installed entry point puts
``my_attention`` in ``lra-bench list``, ``lra-bench check`` passes on it, a one-cell smoke suite records
it, the report shows its accuracy, and the deliberately broken variant (loaded with ``--plugin``) makes
``check`` fail naming the property it breaks.

``scripts/setup_env.sh`` installs the example into the test venv. Where this interpreter lacks it, the
tests build the same installed state from the example's own files: its ``src`` on the path and a
``.dist-info`` declaring the entry points its pyproject.toml declares.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO, "examples", "my_attention")
DIST = "lra-bench-my-attention"
GROUP = "lra_bench.attentions"


def _declared_entry_points() -> dict[str, str]:
  with open(os.path.join(EXAMPLE, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["entry-points"][GROUP]


def _installed() -> bool:
  try:
    importlib.metadata.distribution(DIST)
  except importlib.metadata.PackageNotFoundError:
    return False
  return True


@pytest.fixture(scope="module")
def env(tmp_path_factory):
  """The environment of an ``lra-bench`` process that has the example installed."""
  paths = [REPO]
  if not _installed():
    site = tmp_path_factory.mktemp("site")
    info = site / f"{DIST.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir()
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1.0\n")
    entry_points = "".join(f"{k} = {v}\n" for k, v in _declared_entry_points().items())
    info.joinpath("entry_points.txt").write_text(f"[{GROUP}]\n{entry_points}")
    paths += [os.path.join(EXAMPLE, "src"), str(site)]
  environ = {k: v for k, v in os.environ.items() if k != "LRA_BENCH_PLUGINS"}
  environ["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p])
  environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"  # tiny CPU programs: compile time dominates
  return environ


def _lra_bench(env: dict, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "lra_bench", *args], env=env, cwd=REPO, capture_output=True,
                        text=True, timeout=timeout)


def test_entry_point_names_the_core_module_only():
  """Installing the package registers ``my_attention``; the broken variant needs ``--plugin``."""
  assert _declared_entry_points() == {"my_attention": "my_attention.core"}


def test_list_shows_the_installed_example(env):
  proc = _lra_bench(env, "list")
  assert proc.returncode == 0, proc.stderr[-3000:]
  names = re.findall(r"[a-z0-9_]+", proc.stdout)
  assert "my_attention" in names and "vanilla" in names
  assert "my_attention_broken" not in names
  code = "import attention_zoo; print(attention_zoo.defining_module('my_attention'))"
  proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert proc.stdout.strip() == "my_attention.core", proc.stderr[-3000:]


def test_the_example_package_tests_pass(env):
  """The example's own tests (the kit and a float64 reference), run by pytest as its author would."""
  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                         os.path.join(EXAMPLE, "tests")], env=env, cwd=EXAMPLE, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert re.search(r"\b4 passed\b", proc.stdout), proc.stdout[-1000:]


def test_check_passes_on_the_example(env, tmp_path):
  proc = _lra_bench(env, "check", "my_attention", "--quick", "--out", str(tmp_path / "check"), timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "my_attention" in proc.stdout + proc.stderr


def test_broken_variant_fails_check_naming_the_property(env, tmp_path):
  proc = _lra_bench(env, "check", "my_attention_broken", "--quick", "--out", str(tmp_path / "check"),
                    "--plugin", "my_attention.broken", timeout=900)
  output = proc.stdout + proc.stderr
  assert proc.returncode != 0, output[-3000:]
  assert "Traceback" not in output, output[-3000:]
  failed = [line for line in output.splitlines() if "causal" in line.lower()]
  assert failed and any(re.search(r"fail|✗|FAIL", line) for line in failed), output[-3000:]


def test_unimportable_plugin_is_one_clear_error(env):
  proc = _lra_bench(dict(env, LRA_BENCH_PLUGINS="my_attention.no_such_module"), "list")
  assert proc.returncode != 0
  assert "plugin 'my_attention.no_such_module' failed to import: ModuleNotFoundError" in proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_one_cell_smoke_suite_records_it_and_the_report_lists_it(env, listops_dir, tmp_path):
  results_dir = str(tmp_path / "results")
  sets = [f"--set={o}" for o in tiny_overrides(num_train_steps=8, eval_every=8, checkpoint_every=8)]
  proc = _lra_bench(env, "suite", "--protocol=smoke", "--tasks=listops", "--attentions=my_attention",
                    "--seeds=0", f"--data_dir={listops_dir}", f"--results_dir={results_dir}", *sets)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(os.path.join(results_dir, "results.jsonl")) as f:
    records = [json.loads(line) for line in f]
  assert [(r["attention"], r["task"], r["status"]) for r in records] == [("my_attention", "listops", "ok")]
  accuracy = records[0]["test_accuracy"]
  out = str(tmp_path / "report")
  # the plugin's own effective-attention panel (the other registered cores' are not what this tests)
  proc = _lra_bench(env, "report", f"--results_dir={results_dir}", f"--out={out}", "--patterns=my_attention")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert os.path.exists(os.path.join(out, "attention_patterns.png"))
  with open(os.path.join(out, "index.md")) as f:
    assert "my_attention: could not be probed" not in f.read()
  with open(os.path.join(out, "accuracy_smoke.csv"), newline="") as f:
    rows = [r for r in csv.DictReader(f) if (r["attention"], r["task"]) == ("my_attention", "listops")]
  assert len(rows) == 1 and rows[0]["n"] == "1", rows
  assert float(rows[0]["mean"]) == pytest.approx(100 * accuracy, abs=0.01), rows
  with open(os.path.join(out, "accuracy_smoke.md")) as f:
    assert "my_attention" in f.read()
  assert records[0]["attention_module"] == "my_attention.core"
