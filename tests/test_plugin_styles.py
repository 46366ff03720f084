"""Attention cores written as an NNX module or as a plain function (issue 30 item 16) enter the registry
through ``register_attention`` (wrapped into linen modules: ``flax.nnx.bridge.ToLinen`` for NNX), pass
the same conformance kit, train, and are recorded under their own module, as linen cores are.

End to end, per style, through ``lra-bench`` in fresh processes: ``new attention --style`` writes a
core -> its generated float64 reference test passes -> ``check --quick`` passes -> a tiny ``train``
writes a record naming the module. The example plugins (``examples/plugin_styles``) pass the kit and
train in-process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench import testing
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from tests.conftest import tiny_overrides

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples", "plugin_styles")


def _env(*paths: str) -> dict[str, str]:
  environ = {k: v for k, v in os.environ.items() if k != registry.PLUGINS_ENV}
  environ["PYTHONPATH"] = os.pathsep.join([*paths, REPO])
  environ["JAX_DISABLE_MOST_OPTIMIZATIONS"] = "1"  # tiny CPU programs: compile time dominates
  return environ


def _lra_bench(env: dict, cwd: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "lra_bench", *args], env=env, cwd=cwd, capture_output=True,
                        text=True, timeout=900)


@pytest.mark.parametrize("style", ["nnx", "function"])
def test_scaffolded_core_checks_trains_and_is_recorded(style, listops_dir, tmp_path):
  name, mine = f"styled_{style}", str(tmp_path / "mine")
  env = _env(mine)
  proc = _lra_bench(env, str(tmp_path), "new", "attention", name, "--dir", mine, "--style", style)
  assert proc.returncode == 0, proc.stderr
  source = open(os.path.join(mine, f"{name}.py")).read()
  assert {"nnx": "class StyledNnxAttention(nnx.Module):", "function": f"def {name}(query"}[style] in source

  proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                         "-k", "reference", os.path.join(mine, f"test_{name}.py")], env=env, cwd=mine,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0 and "2 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]

  proc = _lra_bench(env, str(tmp_path), "check", name, "--plugin", name, "--quick", "--out",
                    str(tmp_path / "check"))
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "FAIL" not in proc.stdout + proc.stderr

  results = str(tmp_path / "results")
  sets = [f"--set={o}" for o in tiny_overrides(num_train_steps=8, eval_every=8, checkpoint_every=8)]
  proc = _lra_bench(env, str(tmp_path), "train", "--task=listops", "--protocol=smoke", f"--attention={name}",
                    f"--plugin={name}", f"--data_dir={listops_dir}", f"--workdir={tmp_path / 'run'}",
                    f"--results_dir={results}", *sets)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(os.path.join(results, "results.jsonl")) as f:
    (record,) = [json.loads(line) for line in f]
  assert (record["attention"], record["attention_module"], record["status"]) == (name, name, "ok")


@pytest.fixture
def example_plugins(monkeypatch):
  """``examples/plugin_styles`` importable; the registry and ``sys.modules`` restored afterwards."""
  saved = (dict(registry._REGISTRY), set(registry._LOADED), set(sys.modules), dict(registry._state))
  registry._state["entry_points_done"] = True  # this interpreter's installed entry points stay out
  monkeypatch.syspath_prepend(EXAMPLES)
  monkeypatch.setenv(registry.PLUGINS_ENV, "")
  monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
  yield
  registry._REGISTRY.clear()
  registry._REGISTRY.update(saved[0])
  registry._LOADED.clear()
  registry._LOADED.update(saved[1])
  registry._state.update(saved[3])
  for module in set(sys.modules) - saved[2]:  # only the examples (TensorFlow cannot be imported twice)
    if (getattr(sys.modules[module], "__file__", None) or "").startswith(EXAMPLES):
      del sys.modules[module]


@pytest.mark.parametrize("module, name", [("temperature_nnx", "temperature_nnx"),
                                          ("softplus_function", "softplus_function")])
def test_example_plugin_is_conformant_trains_and_is_recorded(example_plugins, module, name, listops_dir,
                                                             tmp_path, fast_compile):
  assert attention_zoo.load_plugins([module]) == [name]
  testing.assert_conformant(name, quick=True)
  config = config_lib.load_config("smoke", "listops", tiny_overrides(num_train_steps=8, eval_every=8,
                                                                     checkpoint_every=8), attention=name)
  record = cell.train_cell(config, str(tmp_path / "run"), listops_dir, str(tmp_path / "results"))
  assert record["status"] == "ok", record["error"]
  assert record["attention_module"] == module


def test_nnx_parameters_are_linen_parameters_and_train(example_plugins):
  """The NNX core's ``nnx.Param`` is a linen ``params`` leaf: it gets a gradient like any parameter."""
  attention_zoo.load_plugins(["temperature_nnx"])
  core = attention_zoo.create_attention("temperature_nnx", max_heads=3)
  q, k, v = testing.random_qkv(0, 2, 7, 3, 4, 5)
  variables = core.init(jax.random.key(0), q, k, v)
  assert jax.tree_util.tree_map(jnp.shape, variables["params"]) == {"nnx": {"log_temperature": (3,)}}
  grad = jax.grad(lambda p: jnp.sum(core.apply({"params": p}, q, k, v) ** 2))(variables["params"])
  assert np.all(np.asarray(grad["nnx"]["log_temperature"]) != 0)


# ----------------------------------------------------------------------------------------------------
# The function style's contract


@dataclasses.dataclass(frozen=True)
class _Config(attention_zoo.AttentionConfig):
  pass


def _mean_of_real_keys(query, key, value, mask):
  """Uniform weights over the real keys: no config, no dropout."""
  del query, key
  weights = mask[:, :, None, None].astype(value.dtype)                        # [B, K, 1, 1]
  return (jnp.sum(value * weights, axis=1, keepdims=True) /
          jnp.maximum(jnp.sum(weights, axis=1, keepdims=True), 1)).repeat(value.shape[1], 1)


def test_a_function_without_config_or_dropout_rng_says_what_it_cannot_do():
  with registry.temporary({"test_mean_fn": (_mean_of_real_keys, _Config)}):
    q, k, v = testing.random_qkv(0, 2, 5, 1, 4, 3)
    mask = jnp.array([[True] * 5, [True, True, True, False, False]])
    core = attention_zoo.create_attention("test_mean_fn")
    out = core.apply({}, q, k, v, mask)
    np.testing.assert_allclose(out[1, 0], v[1, :3].mean(0), rtol=1e-6)
    assert testing.check_one("test_mean_fn", "causal").passed is None  # "no causal form", not a failure
    with pytest.raises(NotImplementedError, match="takes no `dropout_rng`, so it cannot apply attention "
                       r"dropout \(dropout_rate=0.1\)"):
      attention_zoo.create_attention("test_mean_fn", dropout_rate=0.1).apply({}, q, k, v, mask)


def test_a_function_that_cannot_take_the_call_is_refused_at_registration():
  def two_arguments(query, key):
    return query

  with pytest.raises(TypeError, match="a function core is called as fn\\(query, key, value, mask\\)"):
    registry.register_attention("test_two_args", _Config)(two_arguments)
  assert "test_two_args" not in attention_zoo.list_attentions()


def test_registering_something_else_is_a_clear_type_error():
  with pytest.raises(TypeError, match="takes a flax.linen Module class, a flax.nnx Module class or a "
                     "function, got 3"):
    registry.register_attention("test_three", _Config)(3)
