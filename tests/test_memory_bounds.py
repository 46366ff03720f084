"""Issue 30 item 10: lengths whose programs cannot fit are refused before they run, with the estimate.

``viz attention --length 100000`` used to abort inside XLA (exit 134); ``--set data.max_length=10000000``
was ended by the kernel's OOM killer with no record. Now XLA's memory analysis of the compiled program is
compared with the free memory first (``xla_stats.check_fits``): viz exits 2 with one line, a training run
is recorded ``oom`` with the estimate. Allocation failures that do happen are ``oom``, not ``failed``.
The free memory is patched so that the tests mean the same on every machine.
"""

import errno

import pytest

from lra_bench import cli as cli_lib
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from lra_bench.training import xla_stats
from tests.conftest import tiny_overrides

GIB = 2 ** 30


@pytest.fixture
def free_memory(monkeypatch):
  """Pretends ``bytes`` of host memory are free."""
  def set_free(num_bytes):
    monkeypatch.setattr(xla_stats, "available_bytes", lambda device=None: (num_bytes, "host memory"))
  return set_free


def test_viz_refuses_a_probe_that_cannot_fit(tmp_path, capsys, free_memory):
  """``viz attention vanilla --length 100000`` (112 GiB) on a 16 GiB host, scaled down: length 4096
  (a few 64 MiB matrices) with 16 MiB free, so that a broken check fails this test instead of aborting
  the test process."""
  free_memory(16 * 2 ** 20)
  out = tmp_path / "a.png"
  code = cli_lib.main(cli_lib.parse(["lra-bench", "viz", "attention", "vanilla", "--length", "4096",
                                     f"--out={out}"]))
  err = capsys.readouterr().err.splitlines()
  assert code == 2 and len(err) == 1, err
  assert err[0].startswith("error: out of memory: the effective-attention probe of vanilla at length 4096 "
                           "needs ")
  assert err[0].endswith("GiB (XLA's estimate, before running it) and 0.0 GiB of host memory is free; use a "
                         "shorter --length (the probe holds several length x length matrices)")
  assert not out.exists()


def test_a_train_step_that_cannot_fit_is_an_oom_record_with_the_estimate(listops_dir, tmp_path, free_memory):
  free_memory(2 ** 20)  # 1 MiB: the tiny model's train step needs more
  config = config_lib.load_config("smoke", "listops", tiny_overrides())
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir)
  assert record["status"] == "oom", record["error"]
  assert record["error"].startswith("out of memory: the train step needs ")
  assert "and 0.0 GiB of host memory is free; lower data.max_length or batch_size" in record["error"]
  assert record["train_steps"] is None  # refused before the first step


def test_a_program_that_fits_runs(listops_dir, tmp_path, free_memory):
  free_memory(64 * GIB)
  record = cell.train_cell(config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=8)),
                           str(tmp_path / "run"), listops_dir)
  assert record["status"] == "ok", record["error"]


@pytest.mark.parametrize("err, status", [
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8589934592 bytes."), "oom"),  # XLA, CPU
    (MemoryError("Unable to allocate 37.3 GiB for an array with shape (10000000, 1000)"), "oom"),  # numpy
    (MemoryError(), "oom"),
    (RuntimeError("std::bad_alloc"), "oom"),
    (ValueError('RESOURCE_EXHAUSTED: Error writing local file "/r/x": [OS error 28: No space left on device]'),
     "failed"),  # TensorStore's full disk is no OOM
    (OSError(errno.ENOSPC, "No space left on device"), "failed"),
])
def test_allocation_failures_are_oom(err, status):
  assert cell.outcome(err)[0] == status
