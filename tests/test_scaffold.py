"""``lra-bench new attention``: the generated core imports, registers and computes exact softmax
attention (its own float64 reference test passes), the generated test runs the conformance kit, bad
names and existing files are refused with one line, and the printed next steps name the module."""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench import scaffold
from lra_bench.training.config import ConfigError


@pytest.fixture
def generated(tmp_path, monkeypatch):
  """(name, directory, printed text) of a freshly generated core, importable from ``sys.path``;
  registry and ``sys.modules`` restored afterwards."""
  saved = (dict(registry._REGISTRY), set(sys.modules))
  name = "scaffolded_attention"
  text = scaffold.new_attention(name, str(tmp_path / "mine"))
  monkeypatch.syspath_prepend(str(tmp_path / "mine"))
  yield name, tmp_path / "mine", text
  registry._REGISTRY.clear()
  registry._REGISTRY.update(saved[0])
  for module in set(sys.modules) - saved[1]:
    del sys.modules[module]


def _import_generated_test(name: str, monkeypatch):
  """The generated test module. Until the kit exists, its import is served by a module whose
  ``assert_conformant`` fails, so only the reference test can be run from it."""
  try:
    import lra_bench.testing  # noqa: F401 - the import is the test
  except ImportError:
    fake = types.ModuleType("lra_bench.testing")
    fake.assert_conformant = lambda *a, **k: pytest.fail("the conformance kit is not merged yet")
    monkeypatch.setitem(sys.modules, "lra_bench.testing", fake)
  return __import__(f"test_{name}")


def test_generated_core_registers_and_is_softmax_attention(generated, monkeypatch):
  name, directory, _ = generated
  assert sorted(os.listdir(directory)) == [f"{name}.py", f"test_{name}.py"]
  source = (directory / f"{name}.py").read_text()
  assert "Axis legend" in source and source.count("REPLACE") >= 4
  module = __import__(name)
  assert name in attention_zoo.list_attentions()
  assert attention_zoo.defining_module(name) == name
  config = attention_zoo.attention_config(name)
  assert type(config).__name__ == "ScaffoldedAttentionConfig" and config.causal is False
  assert (config.nonnegative, config.rows_sum_to_one, config.paper_name, config.support(8)) == (
      True, True, None, None)
  assert isinstance(attention_zoo.create_attention(name), module.ScaffoldedAttention)
  tests = _import_generated_test(name, monkeypatch)
  for causal in (False, True):
    tests.test_scaffolded_attention_matches_float64_reference(causal)


def test_generated_placeholder_equals_vanilla(generated):
  """The placeholder is exact softmax attention: the same outputs as the built-in ``vanilla``, also
  with padding, causal masking and a bfloat16 input."""
  import jax
  import jax.numpy as jnp

  name, _, _ = generated
  __import__(name)
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 13, 2, 4)), jnp.float32) for _ in range(3))
  mask = jnp.asarray(np.arange(13)[None, :] < np.array([[9], [13]]))
  for causal in (False, True):
    for dtype in (jnp.float32, jnp.bfloat16):
      args = (q.astype(dtype), k.astype(dtype), v.astype(dtype), mask)
      ours = attention_zoo.create_attention(name, causal=causal)
      ref = attention_zoo.create_attention("vanilla", causal=causal)
      got = ours.apply(ours.init(jax.random.key(0), *args), *args)
      want = ref.apply(ref.init(jax.random.key(0), *args), *args)
      assert got.dtype == dtype
      np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                 rtol=2e-2 if dtype == jnp.bfloat16 else 1e-5,
                                 atol=4e-3 if dtype == jnp.bfloat16 else 1e-6)


def test_generated_test_passes_the_conformance_kit(generated, monkeypatch):
  name, _, _ = generated
  tests = _import_generated_test(name, monkeypatch)
  tests.test_scaffolded_attention_is_conformant()


def test_next_steps_name_the_module_and_the_directory(generated):
  name, directory, text = generated
  lines = [line.strip() for line in text.splitlines() if line.startswith("  ")]
  assert lines == [
      f"PYTHONPATH={directory} lra-bench check {name} --plugin {name}",
      f"PYTHONPATH={directory} python -m pytest {directory / f'test_{name}.py'}",
      f"PYTHONPATH={directory} lra-bench suite --protocol smoke --tasks listops --attentions {name} "
      f"--results_dir results/{name} --plugin {name}"]


def test_in_the_current_directory_no_path_is_needed(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  text = scaffold.new_attention("here_attention", ".")
  assert "  lra-bench check here_attention --plugin here_attention" in text.splitlines()
  assert "  python -m pytest test_here_attention.py" in text.splitlines()


@pytest.mark.parametrize("name, message", [
    ("vanilla", "already registered by attention_zoo.vanilla"),
    ("json", "a Python module named 'json' already exists"),
    ("MyAttention", "not a valid name"),
    ("my-attention", "not a valid name"),
    ("lambda", "not a valid name"),
    ("2attention", "not a valid name"),
])
def test_bad_names_are_refused_and_nothing_is_written(tmp_path, name, message):
  with pytest.raises(ConfigError, match=message):
    scaffold.new_attention(name, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_existing_files_are_not_overwritten(tmp_path):
  (tmp_path / "test_kept_attention.py").write_text("# mine\n")
  with pytest.raises(ConfigError, match="test_kept_attention.py already exists; not overwriting"):
    scaffold.new_attention("kept_attention", str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["test_kept_attention.py"]
  assert (tmp_path / "test_kept_attention.py").read_text() == "# mine\n"
