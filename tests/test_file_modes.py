"""Issue 30 item 15: files the package writes atomically get the umask's mode, as ``open(path, "w")``
would give them (0644 under umask 022), not ``mkstemp``'s 0600 (teammates on a shared filesystem could
not read a ``result.json``); and every atomic writer of the package is ``lra_bench.files.write_atomic``."""

import os
import re
import stat

import pytest

from lra_bench import check, files, scaffold
from lra_bench.experiments import results

PACKAGE = os.path.dirname(os.path.abspath(files.__file__))


@pytest.fixture
def umask():
  """Sets the umask for the test body (``umask(mask)``) and restores it."""
  old = os.umask(0o022)
  try:
    yield os.umask
  finally:
    os.umask(old)


def mode(path) -> int:
  return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_get_the_umask_mode(tmp_path, umask, mask, expected):
  umask(mask)
  result = tmp_path / "run" / "result.json"
  results.write_json_atomic(str(result), {"status": "ok"})
  check._write_atomic(str(tmp_path / "check.md"), "# check\n")
  scaffold.new_attention("mode_probe", str(tmp_path / "new"))
  written = [result, tmp_path / "check.md", *sorted((tmp_path / "new").iterdir())]
  assert len(written) == 4
  assert {path.name: mode(path) for path in written} == {path.name: expected for path in written}
  assert files.umask() == mask


def test_every_atomic_writer_of_the_package_is_files_write_atomic():
  """No module but ``lra_bench/files.py`` makes temporary files to rename over their target."""
  offenders = []
  for root, _, names in os.walk(PACKAGE):
    for name in names:
      path = os.path.join(root, name)
      if name.endswith(".py") and path != files.__file__:
        with open(path, encoding="utf-8") as f:
          if re.search(r"\bmkstemp\(|\bos\.replace\(|\bos\.rename\(", f.read()):
            offenders.append(os.path.relpath(path, PACKAGE))
  assert not offenders, offenders
