"""The shape of lra_bench (docs/ARCHITECTURE.md): the import graph of its modules, read from their source
(imports inside functions and ``import_module("...")`` of a literal name included), has no cycle and no
upward edge (the ground modules <- training <- experiments <- report, the command modules on top); every
module has a layer; the report reads records and never imports training; the packages below lra_bench (tasks,
attention_zoo, configs) never import it; and the repository points to no document outside itself."""

import ast
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "lra_bench")
# A module may import modules of its own layer or below. Layer 0, the ground: modules that import no
# other part of lra_bench but each other (errors: the base of the user-facing errors; files: the atomic
# writer; testing: the conformance kit and the effective-matrix probe, which imports only attention_zoo, so
# it can never reach training). The command modules (cli, check,
# scaffold) share the top layer.
LAYER = {"errors": 0, "files": 0, "testing": 0, "training": 1, "experiments": 2, "report": 3,
         "cli": 4, "check": 4, "scaffold": 4, "__main__": 5}


def _module_name(path: str) -> str:
  rel = os.path.relpath(path, REPO)[:-len(".py")].replace(os.sep, ".")
  return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _python_files(top: str) -> dict[str, str]:
  """{module name: path} of every Python file under ``top``."""
  return {_module_name(os.path.join(root, name)): os.path.join(root, name)
          for root, _, files in os.walk(top) for name in files if name.endswith(".py")}


def imported_names(path: str) -> set[str]:
  """Every name the source of ``path`` imports, at any depth (imports inside functions count too), and the
  literal names it passes to ``import_module`` / ``__import__``; ``from a import b`` gives ``a`` and ``a.b``."""
  with open(path) as f:
    tree = ast.parse(f.read())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names.update(f"{node.module}.{a.name}" for a in node.names)
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
          in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)
          and isinstance(node.args[0].value, str)):
      names.add(node.args[0].value)
  return names


def import_graph() -> dict[str, set[str]]:
  """{module: the lra_bench modules it imports (at any depth of its source)}."""
  modules = _python_files(PACKAGE)
  return {module: {e for e in imported_names(path) if e in modules and e != module} for module, path in modules.items()}


def _layer(module: str) -> int | None:
  parts = module.split(".")
  return LAYER.get(parts[1]) if len(parts) > 1 else None  # the package root is below every layer


def test_every_module_has_a_layer():
  unplaced = sorted(m for m in import_graph() if m != "lra_bench" and _layer(m) is None)
  assert not unplaced, f"add these to LAYER: {unplaced}"


def test_the_report_never_imports_training():
  """The report reads records (and the published references, ``configs/``, the kit's probe): whatever it
  needs from a run, the record carries (docs/ARCHITECTURE.md, after the data flow)."""
  offending = sorted((m, e) for m, edges in import_graph().items() if m.startswith("lra_bench.report")
                     for e in edges if e == "lra_bench.training" or e.startswith("lra_bench.training."))
  assert not offending, offending


@pytest.mark.parametrize("package", ["tasks", "attention_zoo", "configs"])
def test_the_packages_below_lra_bench_never_import_it(package):
  """tasks (the data, and the plan of what a protocol needs prepared: ``tasks.plan``), attention_zoo and configs
  sit below every wing of lra_bench, which may import them; an import the other way (inside a function
  included) would make a cycle between the packages."""
  offending = sorted((module, name) for module, path in _python_files(os.path.join(REPO, package)).items()
                     for name in imported_names(path) if name == "lra_bench" or name.startswith("lra_bench."))
  assert not offending, offending


def test_no_upward_import():
  upward = [(m, e) for m, edges in import_graph().items() for e in edges
            if _layer(e) is not None and _layer(m) is not None and _layer(e) > _layer(m)]
  assert not upward, upward


def test_no_import_cycle():
  graph, done, path = import_graph(), set(), []

  def visit(module):
    if module in path:
      pytest.fail("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
    if module in done:
      return
    path.append(module)
    for other in sorted(graph[module]):
      visit(other)
    path.pop()
    done.add(module)

  for module in sorted(graph):
    visit(module)


def test_the_wings_exist_and_training_knows_no_records():
  graph = import_graph()
  assert {"lra_bench.training.loop", "lra_bench.experiments.cell", "lra_bench.report.index"} <= set(graph)
  for module, edges in graph.items():
    if module.startswith("lra_bench.training"):
      assert not any(e.startswith(("lra_bench.experiments", "lra_bench.report")) for e in edges), module


OUTSIDE = re.compile(r"\.\./shared|research/[a-z_]+\.md")
# Outside docs/, a docs page is named with its folder (inside docs/ a bare name is a sibling page, and
# tests/test_docs.py resolves every link there).
BARE_PAGE = re.compile(r"(?<!docs/)(ARCHITECTURE|generators|lra_protocol)\.md")


def test_no_pointer_to_documents_outside_the_repository():
  """The code, the tests, the scripts and the docs name only documents that are in the repository."""
  offending = []
  paths = [os.path.join(REPO, "README.md")]
  for top in ("lra_bench", "configs", "attention_zoo", "tasks", "tests", "scripts", "docs"):
    for root, _, files in os.walk(os.path.join(REPO, top)):
      paths += [os.path.join(root, f) for f in files if f.endswith((".py", ".md", ".sh"))
                and f != "test_architecture.py"]
  for path in paths:
    with open(path) as f:
      for lineno, line in enumerate(f, 1):
        if OUTSIDE.search(line) or (not path.startswith(os.path.join(REPO, "docs", "")) and BARE_PAGE.search(line)):
          offending.append(f"{os.path.relpath(path, REPO)}:{lineno}: {line.strip()}")
  assert not offending, "\n".join(offending)
  assert os.path.exists(os.path.join(REPO, "docs", "ARCHITECTURE.md"))
