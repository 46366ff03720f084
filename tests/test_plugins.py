"""Attention cores from outside the package: ``--plugin`` modules, ``$LRA_BENCH_PLUGINS`` and the
``lra_bench.attentions`` entry points enter the one registry, each once; failures and name clashes are
one-line :class:`attention_zoo.PluginError` messages naming the modules; child processes see them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

import attention_zoo
from attention_zoo import registry

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CORE = '''
import dataclasses
import flax.linen as nn
from attention_zoo.registry import AttentionConfig, register_attention
from attention_zoo.vanilla import VanillaAttention


@dataclasses.dataclass(frozen=True)
class {cls}Config(AttentionConfig):
  pass


@register_attention({name!r}, {cls}Config)
class {cls}(nn.Module):
  config: {cls}Config

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    return VanillaAttention(self.config)(query, key, value, mask, deterministic)
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
  """A directory on ``sys.path`` to write plugin modules into; the registry, the plugin bookkeeping,
  the environment and ``sys.modules`` are restored afterwards."""
  saved = (dict(registry._REGISTRY), set(registry._LOADED), dict(registry._state), set(sys.modules))
  monkeypatch.syspath_prepend(str(tmp_path))
  # setenv first so that monkeypatch records (and restores) the variable: load_plugins exports to it.
  monkeypatch.setenv(registry.PLUGINS_ENV, "")
  monkeypatch.delenv(registry.PLUGINS_ENV)
  monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
  registry._state["entry_points_done"] = True  # this interpreter's installed entry points stay out

  def write(module: str, text: str) -> str:
    path = tmp_path.joinpath(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return module

  yield write
  registry._REGISTRY.clear()
  registry._REGISTRY.update(saved[0])
  registry._LOADED.clear()
  registry._LOADED.update(saved[1])
  registry._state.update(saved[2])
  for name in set(sys.modules) - saved[3]:
    del sys.modules[name]


# A mixer a plugin registers beside its core (the same plugin mechanism imports both kinds).
MIXER = """
import dataclasses as _dataclasses
from attention_zoo.registry import MixerConfig as _MixerConfig, register_mixer as _register_mixer


@_dataclasses.dataclass(frozen=True)
class HalfMixerConfig(_MixerConfig):
  pass


@_register_mixer("half_mixer", HalfMixerConfig)
class HalfMixer(nn.Module):
  config: HalfMixerConfig

  def __call__(self, x, mask, deterministic=True):
    return x
"""


def _unique(prefix: str) -> str:
  return f"{prefix}_{uuid.uuid4().hex[:8]}"


def test_plugin_module_registers_and_names_its_module(plugins):
  module = plugins(_unique("plug"), CORE.format(name="plug_core", cls="PlugCore"))
  assert "plug_core" not in attention_zoo.list_attentions()
  assert attention_zoo.load_plugins([module]) == ["plug_core"]
  assert "plug_core" in attention_zoo.list_attentions()
  assert attention_zoo.defining_module("plug_core") == module
  assert attention_zoo.defining_module("vanilla") == "attention_zoo.vanilla"
  assert attention_zoo.load_plugins([module]) == []  # once: the second call imports nothing
  assert os.environ[registry.PLUGINS_ENV].split(",") == [module]


def test_import_failure_is_one_line_naming_module_and_exception(plugins):
  module = plugins(_unique("broken"), CORE.format(name="half_registered", cls="Half") + MIXER
                   + "\nimport no_such_module_xyz\n")
  with pytest.raises(attention_zoo.PluginError) as err:
    attention_zoo.load_plugins([module])
  assert str(err.value) == (f"plugin '{module}' failed to import: ModuleNotFoundError: "
                            "No module named 'no_such_module_xyz'; unregistered again: a sequence mixer "
                            "'half_mixer', an attention core 'half_registered'")
  # what it registered is undone, of both kinds (the mixer stayed registered when mixers had a registry of
  # their own)
  assert "half_registered" not in attention_zoo.list_attentions()
  assert "half_mixer" not in attention_zoo.list_layers()
  with pytest.raises(attention_zoo.PluginError) as err:
    attention_zoo.load_plugins(["no_such_plugin_pkg_xyz.attn"])
  assert str(err.value) == ("plugin 'no_such_plugin_pkg_xyz.attn' failed to import: ModuleNotFoundError: "
                            "No module named 'no_such_plugin_pkg_xyz' (install it, or put the directory "
                            "that holds it on PYTHONPATH)")
  with pytest.raises(attention_zoo.PluginError, match="not a module path"):
    attention_zoo.load_plugins(["my-plugin.py"])


def test_exception_raised_by_plugin_code_is_one_line(plugins):
  module = plugins(_unique("raises"), "raise RuntimeError('bad\\nconfig here')\n")
  with pytest.raises(attention_zoo.PluginError) as err:
    attention_zoo.load_plugins([module])
  assert str(err.value) == f"plugin '{module}' failed to import: RuntimeError: bad config here"


def test_clash_with_a_builtin_names_both_modules(plugins):
  module = plugins(_unique("clash"), CORE.format(name="vanilla", cls="MyVanilla"))
  with pytest.raises(attention_zoo.PluginError) as err:
    attention_zoo.load_plugins([module])
  message = str(err.value)
  assert "'attention_zoo.vanilla' (built-in)" in message and f"'{module}'" in message
  assert "\n" not in message
  assert attention_zoo.defining_module("vanilla") == "attention_zoo.vanilla"


def test_clash_between_two_plugins_names_both(plugins):
  first = plugins(_unique("first"), CORE.format(name="shared_name", cls="First"))
  second = plugins(_unique("second"), CORE.format(name="shared_name", cls="Second"))
  with pytest.raises(attention_zoo.PluginError, match=f"'{first}' and by module '{second}'"):
    attention_zoo.load_plugins([first, second])
  assert attention_zoo.defining_module("shared_name") == first


def test_environment_variable_is_read_on_first_lookup(plugins, monkeypatch):
  module = plugins(_unique("envplug"), CORE.format(name="env_core", cls="EnvCore"))
  monkeypatch.setenv(registry.PLUGINS_ENV, f" {module} ,")
  assert "env_core" in attention_zoo.list_attentions()  # no load_plugins call: the lookup loads it
  assert attention_zoo.create_attention("env_core").config.causal is False
  assert attention_zoo.defining_module("env_core") == module


def test_broken_environment_plugin_fails_the_lookup_clearly(plugins, monkeypatch):
  monkeypatch.setenv(registry.PLUGINS_ENV, "no_such_env_plugin_xyz")
  with pytest.raises(attention_zoo.PluginError, match="'no_such_env_plugin_xyz' failed to import"):
    attention_zoo.attention_config("vanilla")


def _write_dist_info(root, dist: str, entry_points: dict[str, str]) -> None:
  """An installed distribution as importlib.metadata sees it: a ``.dist-info`` with entry points."""
  info = root / f"{dist}-0.1.dist-info"
  info.mkdir()
  info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
  lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
  info.joinpath("entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{lines}")


def test_entry_point_plugins_load_on_first_lookup(plugins, tmp_path):
  module = plugins(_unique("epplug"), CORE.format(name="ep_core", cls="EpCore"))
  helper = plugins(_unique("ephelper"), "REGISTER = True\n")
  _write_dist_info(tmp_path, _unique("dist"), {"core": module, "extra": f"{helper}:REGISTER"})
  registry._state["entry_points_done"] = False
  assert "ep_core" in attention_zoo.list_attentions()
  assert {module, f"{helper}:REGISTER"} <= registry._LOADED
  assert attention_zoo.defining_module("ep_core") == module


def test_failing_entry_point_names_its_module(plugins, tmp_path):
  _write_dist_info(tmp_path, _unique("dist"), {"bad": "no_such_ep_module_xyz"})
  registry._state["entry_points_done"] = False
  with pytest.raises(attention_zoo.PluginError, match="plugin 'no_such_ep_module_xyz' failed to import"):
    attention_zoo.list_attentions()


def test_subprocesses_see_plugins_given_to_load_plugins(plugins, tmp_path):
  """What suite --isolate cells and bench points rely on: the variable and the module's directory are
  exported, and a child process (here elsewhere than the plugin's directory) lists the core."""
  module = plugins(_unique("childplug"), CORE.format(name="child_core", cls="ChildCore"))
  attention_zoo.load_plugins([module])
  assert str(tmp_path) in os.environ["PYTHONPATH"].split(os.pathsep)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ["PYTHONPATH"]]))
  code = ("import attention_zoo; print(attention_zoo.defining_module('child_core')); "
          "print(type(attention_zoo.create_attention('child_core')).__name__)")
  proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.split() == [module, "ChildCore"]
  listing = subprocess.run([sys.executable, "-m", "lra_bench", "list", "attentions"], env=env, cwd=REPO,
                           capture_output=True, text=True, timeout=300)
  assert listing.returncode == 0, listing.stderr[-2000:]
  assert "child_core" in listing.stdout.split()


def test_bench_point_subprocess_measures_a_plugin_core(plugins):
  """``bench`` runs each point in ``python -m lra_bench.experiments.bench``: that process builds the model
  from the registry, so it must load the plugin given to this one (not installed, not on its path)."""
  from lra_bench.experiments import bench

  module = plugins(_unique("benchplug"), CORE.format(name="bench_core", cls="BenchCore"))
  attention_zoo.load_plugins([module])
  config = bench.bench_config("bench_core", 32, batch_size=1, compile_only=True,
                              overrides=["model.num_layers=1", "model.emb_dim=16", "model.qkv_dim=16",
                                         "model.mlp_dim=16"])
  point = bench.run_point(config, isolate=True, timeout_s=600)
  assert point["status"] == "ok", point.get("error")
  assert point["flops_per_step"] > 0


def test_isolated_suite_cell_trains_a_plugin_core(plugins, listops_dir, tmp_path):
  """``suite --isolate`` runs each cell as ``python -m lra_bench train`` in a fresh process."""
  from lra_bench.experiments import results, suite
  from tests.conftest import tiny_overrides

  module = plugins(_unique("suiteplug"), CORE.format(name="suite_core", cls="SuiteCore"))
  attention_zoo.load_plugins([module])
  results_dir = str(tmp_path / "results")
  suite.run_suite("smoke", "listops", "suite_core", "0", results_dir=results_dir, data_dir=listops_dir,
                  overrides=tiny_overrides(num_train_steps=4, eval_every=4, checkpoint_every=4),
                  isolate=True, progress=False)
  (record,) = results.load_records(results_dir)
  assert (record["attention"], record["status"]) == ("suite_core", "ok"), record.get("error")


def test_copied_plugin_file_registering_the_same_class_name_clashes(plugins):
  """Issue 30 item 5: a copied scaffold file (same name, same class name) used to replace the first
  core silently while records still named the first module."""
  first = plugins(_unique("copy_a"), CORE.format(name="copied_core", cls="CopiedCore"))
  second = plugins(_unique("copy_b"), CORE.format(name="copied_core", cls="CopiedCore"))
  with pytest.raises(attention_zoo.PluginError) as err:
    attention_zoo.load_plugins([first, second])
  assert str(err.value) == (f"plugin '{second}': attention 'copied_core' is registered twice: by module "
                            f"'{first}' and by module '{second}'; rename one of them")
  assert attention_zoo.defining_module("copied_core") == first
  assert type(attention_zoo.create_attention("copied_core")).__module__ == first  # the first one runs


def test_copied_plugin_clash_is_one_cli_line(plugins, tmp_path):
  first = plugins(_unique("cli_a"), CORE.format(name="cli_copied", cls="CliCopied"))
  second = plugins(_unique("cli_b"), CORE.format(name="cli_copied", cls="CliCopied"))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  env.pop(registry.PLUGINS_ENV, None)
  proc = subprocess.run([sys.executable, "-m", "lra_bench", "list", "attentions", "--plugin", first,
                         "--plugin", second], capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.splitlines() == [
      f"error: plugin '{second}': attention 'cli_copied' is registered twice: by module '{first}' and by "
      f"module '{second}'; rename one of them"]


def test_reimporting_the_same_plugin_module_is_not_a_clash(plugins):
  import importlib

  module = plugins(_unique("reload"), CORE.format(name="reloaded_core", cls="ReloadedCore"))
  attention_zoo.load_plugins([module])
  importlib.reload(sys.modules[module])  # the same module registers its (new) class again
  assert attention_zoo.defining_module("reloaded_core") == module
  assert type(attention_zoo.create_attention("reloaded_core")) is sys.modules[module].ReloadedCore


def test_one_file_imported_under_two_module_names_is_not_a_clash(plugins, tmp_path):
  """``--plugin pkg.core`` and the installed ``core`` of the same file (two sys.path entries)."""
  plugins(f"{_unique('pkg')}.placeholder", "")
  package = next(p.name for p in tmp_path.iterdir() if p.name.startswith("pkg_"))
  plugins(f"{package}.same_core", CORE.format(name="same_file_core", cls="SameFileCore"))
  monkeypatch_path = str(tmp_path / package)
  sys.path.insert(0, monkeypatch_path)
  try:
    attention_zoo.load_plugins([f"{package}.same_core", "same_core"])
  finally:
    sys.path.remove(monkeypatch_path)
  assert attention_zoo.defining_module("same_file_core") == f"{package}.same_core"
