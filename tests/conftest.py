"""Shared test setup: hide accelerators from TensorFlow, keep JAX quiet and deterministic."""

import ast
import atexit
import collections
import functools
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES_FOR_TF", "")
# Tests run tiny shapes where XLA's CPU compile time dominates; LLVM optimisation level 0 compiles the
# attention cores ~2-4x faster and does not change results.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")
# Many tests (and the runs they start as subprocesses) compile the same tiny programs, and most of a test's
# time on a CPU is XLA compiling them: JAX's persistent compilation cache lets each program compile once per
# machine, not once per test run (tests/test_attention_registry.py on 2 CPUs: 406 s with an empty cache, 123 s
# with the programs of an earlier run). The cache is the folder LRA_TEST_JAX_CACHE names, by default
# ~/.cache/lra-bench/jax-tests ($XDG_CACHE_HOME), shared by pytest-xdist's workers and their subprocesses
# (they inherit JAX_COMPILATION_CACHE_DIR) and by later runs; a program is found only under the same jax
# version, flags and code, so a stale entry is never used, only unused: past CACHE_LIMIT bytes the folder is
# emptied when a run starts. LRA_TEST_JAX_CACHE=run uses an empty folder for this run only, removed when it
# ends (the time of a first run on a fresh machine); a JAX_COMPILATION_CACHE_DIR already set is used as is.
CACHE_LIMIT = 2 << 30


def _folder_bytes(path):
  total = 0
  for folder, _, files in os.walk(path):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(folder, name))
      except OSError:  # removed by another process meanwhile
        pass
  return total


if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _WANTED = os.environ.get("LRA_TEST_JAX_CACHE", "")
  if _WANTED == "run":
    _JAX_CACHE = tempfile.mkdtemp(prefix="lra-bench-tests-jax-cache-")
    atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
  else:
    _base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    _JAX_CACHE = os.path.abspath(_WANTED or os.path.join(_base, "lra-bench", "jax-tests"))
    if os.path.isdir(_JAX_CACHE) and _folder_bytes(_JAX_CACHE) > CACHE_LIMIT:
      shutil.rmtree(_JAX_CACHE, ignore_errors=True)
    os.makedirs(_JAX_CACHE, exist_ok=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _JAX_CACHE
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


@pytest.fixture
def x64():
  """Runs the test body with float64 enabled (exact reference comparisons)."""
  import jax

  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", False)


@pytest.fixture(scope="session")
def listops_dir(tmp_path_factory):
  """A tiny generated ListOps data root (name 'tiny': 120/40/37 examples of 11..63 tokens)."""
  from tasks import get_task

  root = str(tmp_path_factory.mktemp("lra_data"))
  get_task("listops").prepare(root, name="tiny", num_train=120, num_val=40, num_test=37, seed=0,
                              min_length=10, max_expression_length=64, progress=False)
  return root


def tiny_overrides(**extra):
  """Overrides that shrink the smoke protocol to seconds, for the tiny ListOps data above."""
  values = {"data.options.name": "tiny", "data.max_length": 64, "batch_size": 8,
            "num_train_steps": 24, "eval_every": 8, "checkpoint_every": 8, "log_every": 4,
            "model.num_layers": 1, "model.emb_dim": 16, "model.qkv_dim": 16, "model.mlp_dim": 32,
            "optimizer.warmup_steps": 4}
  values.update(extra)
  return [f"{k}={v}" for k, v in values.items()]


@pytest.fixture
def fast_compile(monkeypatch):
  """Compiles with most XLA optimizations off (much faster on CPU), here and in child processes."""
  import jax

  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", False)


def pytest_configure(config):
  config.addinivalue_line("markers", "slow(why): trains, spawns processes or sweeps the whole registry; set by "
                          "pytest_collection_modifyitems below, never by hand (`-m 'not slow'`: the quick tier)")
  config.addinivalue_line("markers", "slurm: needs a reachable SLURM (scripts/slurm_local.sh start); "
                          "skipped without one unless LRA_REQUIRE_SLURM=1")


# The test pyramid. The quick tier, `./run_tests.sh --quick` (`-m "not slow"`, under 5 minutes on 2 CPU
# cores), is every test this hook leaves unmarked: the unit tests, the float64 references and the conformance
# kit of one layer per family, the architecture and docs checks. The complete suite (`./run_tests.sh`, what CI
# runs) runs everything. A test is marked slow, here and nowhere else, when
#   - the code it runs (its body, and the functions and fixtures of its module or of the shared test modules
#     that it reaches) spawns processes (SPAWNS), trains or takes a training step (TRAINS), builds the whole
#     model (MODEL), runs a command that trains (`lra-bench train|suite|bench|check`), or runs the whole
#     conformance kit on a layer (FULL_KIT without quick=True); or
#   - it is about a layer that does not stand for its family (the first registered layer of each family
#     does): a test of a file about one layer (test_<layer>.py, test_mixer_<layer>.py) or a case of a
#     parametrisation over several layers (the registry-wide kit among them) whose layers are not all the
#     families' first.
# docs/testing.md states the rule; the marker's argument says why (`pytest --collect-only -m "not slow"`).
SPAWNS = frozenset({"subprocess", "Popen", "multiprocessing", "fork", "ProcessPoolExecutor", "submitit", "submit"})
TRAINS = frozenset({"train_cell", "train_and_evaluate", "run_suite", "run_cell", "run_bench", "run_point",
                    "measure", "train_step"})
MODEL = frozenset({"Classifier", "LanguageModel", "Pretrainer", "init_state", "create_model"})
TRAINING_COMMANDS = frozenset({"train", "suite", "bench", "check"})  # lra-bench commands that train or time
FULL_KIT = frozenset({"assert_conformant", "run_conformance", "run_check"})  # quick=True: small shapes, no training
LAYER_SWEEP = 2  # a parametrisation naming this many registered layers or more is a sweep over layers


def _defs(tree) -> dict:
  """{name: node} of the module-level functions and classes of ``tree`` (a class's methods under
  ``Class.method`` too)."""
  defs = {}
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      defs[node.name] = node
    if isinstance(node, ast.ClassDef):
      defs.update({f"{node.name}.{n.name}": n for n in node.body if isinstance(n, ast.FunctionDef)})
  return defs


@functools.cache
def _module_defs(path: str) -> dict:
  with open(path, encoding="utf-8") as f:
    return _defs(ast.parse(f.read()))


@functools.cache
def _helper_defs() -> dict:
  """The functions and fixtures of the shared test modules (this file and the helpers beside it)."""
  here = os.path.dirname(os.path.abspath(__file__))
  defs = {}
  for name in sorted(os.listdir(here)):
    if name.endswith(".py") and not name.startswith("test_"):
      defs.update(_module_defs(os.path.join(here, name)))
  return defs


def _runs_training_command(node) -> bool:
  """A literal ``["lra-bench", "train", ...]`` or ``"lra-bench suite ..."`` in ``node``."""
  for sub in ast.walk(node):
    if isinstance(sub, (ast.List, ast.Tuple)):
      words = [e.value for e in sub.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
      if any(a == "lra-bench" and b in TRAINING_COMMANDS for a, b in zip(words, words[1:])):
        return True
    elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
      words = sub.value.split()
      if words[:1] == ["lra-bench"] and words[1:2] and words[1] in TRAINING_COMMANDS:
        return True
  return False


def _name(node) -> str | None:
  return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _slow_code(item) -> str | None:
  """Why the code ``item`` runs is slow (what it reaches), or None."""
  defs = {**_helper_defs(), **_module_defs(str(item.path))}
  name = getattr(item, "originalname", item.name)
  start = f"{item.cls.__name__}.{name}" if getattr(item, "cls", None) else name
  todo, seen = [start, *getattr(item, "fixturenames", ())], set()
  while todo:
    key = todo.pop()
    if key in seen or key not in defs:
      continue
    seen.add(key)
    node = defs[key]
    if _runs_training_command(node):
      return f"{key} runs a command that trains"
    for sub in ast.walk(node):
      if isinstance(sub, ast.Call) and _name(sub.func) in FULL_KIT and not any(
          k.arg == "quick" and isinstance(k.value, ast.Constant) and k.value.value is True for k in sub.keywords):
        return f"{key} calls {_name(sub.func)} without quick=True"
      word = _name(sub)
      if word in SPAWNS or word in TRAINS or word in MODEL:
        return f"{key} uses {word}"
      if word is not None:
        todo.append(word)
  return None


def _layers_of(item) -> set[str]:
  import attention_zoo

  layers = set(attention_zoo.list_layers())
  values = list(getattr(getattr(item, "callspec", None), "params", {}).values())
  found = set()
  while values:
    value = values.pop()
    if isinstance(value, (tuple, list)):
      values.extend(value)
    elif isinstance(value, str) and value in layers:
      found.add(value)
  return found


def _layer_of_file(path: str, layers: list[str]) -> str | None:
  """The layer a test file is about: ``test_<layer>[_<topic>].py`` or ``test_mixer_<layer>[_<topic>].py``
  (the longest registered name that fits), else None."""
  stem = os.path.basename(path)[:-len(".py")].removeprefix("test_").removeprefix("mixer_")
  fits = [name for name in layers if stem == name or stem.startswith(name + "_")]
  return max(fits, key=len) if fits else None


def _not_representative(items) -> set:
  """The items about a layer that is not the first registered layer of its family: those of a test file
  about one layer (``tests/test_performer.py``, ``tests/test_mixer_mamba.py``) and the cases of a
  parametrisation over several layers (``tests/test_attention_registry.py``) that name such a layer."""
  import attention_zoo

  names = attention_zoo.list_layers()
  first = {}
  for name in names:
    first.setdefault(attention_zoo.layer_family(name), name)
  representatives = set(first.values())
  groups = collections.defaultdict(list)
  for item in items:
    groups[(str(item.path), getattr(item, "cls", None), getattr(item, "originalname", item.name))].append(item)
  out = set()
  for (path, _, _), group in groups.items():
    about = _layer_of_file(path, names)
    layers = [_layers_of(item) | ({about} if about else set()) for item in group]
    if about is not None or len(set().union(*layers)) >= LAYER_SWEEP:
      out.update(item for item, found in zip(group, layers) if found - representatives)
  return out


def pytest_collection_modifyitems(config, items):
  sweep = _not_representative(items)
  for item in items:
    why = _slow_code(item) or ("about a layer that does not stand for its family" if item in sweep else None)
    if why:
      item.add_marker(pytest.mark.slow(why))
