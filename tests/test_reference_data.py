"""The published numbers the report reads are package data (``lra_bench/report/published``): a wheel built
from ``pyproject.toml`` carries every one of those files, and the report of an installed (non-editable)
lra-bench reads them from where it is installed, outside any checkout of the repository."""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from lra_bench.report import reference

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("lra_bench", "attention_zoo", "tasks", "configs")


def test_the_default_reference_dir_is_inside_the_package():
  package = os.path.join(REPO, "lra_bench", "report")
  assert os.path.dirname(reference.DEFAULT_REFERENCE_DIR) == package, reference.DEFAULT_REFERENCE_DIR
  assert "lra_paper_accuracy.csv" in os.listdir(reference.DEFAULT_REFERENCE_DIR)


@pytest.mark.timeout(600)
def test_an_installed_wheel_reads_its_own_published_numbers(tmp_path):
  source = tmp_path / "source"  # what a wheel is built from: the project file, the readme, the packages
  source.mkdir()
  for name in ("pyproject.toml", "README.md"):
    shutil.copy(os.path.join(REPO, name), source / name)
  for package in PACKAGES:
    shutil.copytree(os.path.join(REPO, package), source / package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
  wheels = tmp_path / "wheels"
  proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                         "--quiet", "--wheel-dir", str(wheels), str(source)],
                        cwd=tmp_path, capture_output=True, text=True, timeout=540)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  [wheel] = wheels.glob("lra_bench-*.whl")
  published = sorted(os.listdir(reference.DEFAULT_REFERENCE_DIR))
  with zipfile.ZipFile(wheel) as archive:
    names = set(archive.namelist())
    missing = [f for f in published if f"lra_bench/report/published/{f}" not in names]
    assert not missing, f"the wheel lacks {missing}: declare them in pyproject.toml's package data"
    site = tmp_path / "site"  # a wheel installs by unpacking (pure Python: purelib is its root)
    archive.extractall(site)
  # The installed package, imported from outside the repository (no checkout on its path), reads its own copy.
  code = ("import os, sys; from lra_bench.report import index, reference; "
          "d = reference.DEFAULT_REFERENCE_DIR; assert d.startswith(sys.argv[1]), d; "
          "assert index.reference_problem(None) is None; accuracy, efficiency = reference.load_reference(); "
          "print(len(accuracy), len(efficiency), len(reference.load_followups()))")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  proc = subprocess.run([sys.executable, "-c", code, str(site)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120, env=dict(env, PYTHONPATH=str(site)))
  assert proc.returncode == 0, proc.stderr
  assert all(int(n) > 0 for n in proc.stdout.split()), proc.stdout
