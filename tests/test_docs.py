"""The README and docs/ stay true to the repository: the README stays short and opens with the two commands
CI relies on, its numbers are the committed reports', every relative link resolves, docs/index.md lists
every page, docs/zoo.md's table names every registered layer, and docs/ARCHITECTURE.md's module map (the
only one) names every module and nothing that does not exist."""

from __future__ import annotations

import functools
import os
import re
import shlex

import attention_zoo
import configs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
README = os.path.join(REPO, "README.md")
MODULE_MAP = os.path.join(REPO, "docs/ARCHITECTURE.md")
README_MAX_BYTES = 10 * 1024
README_SECTIONS = ["## Read the results", "## Add your own attention", "## Where to go next"]


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def _pages() -> list[str]:
  return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


def _code_blocks(text: str) -> list[str]:
  return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S)


def _prose(text: str) -> str:
  """``text`` without fenced code blocks and inline code."""
  text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
  return re.sub(r"`[^`\n]*`", "", text)


def _section(text: str, heading: str) -> str:
  assert heading in text, f"lost its section {heading!r}"
  return text.split(heading, 1)[1].split("\n## ", 1)[0]


def _table_rows(text: str) -> list[list[str]]:
  """The data rows of the Markdown tables in ``text``, as lists of stripped cells."""
  rows = []
  for line in text.splitlines():
    if line.startswith("|") and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line.strip()):
      rows.append([c.strip() for c in line.strip().strip("|").split("|")])
  return rows


# --- The README ---------------------------------------------------------------------------------------------


def test_the_readme_is_at_most_10_kb():
  size = os.path.getsize(README)
  assert size <= README_MAX_BYTES, f"README.md is {size} bytes (at most {README_MAX_BYTES}): move detail to docs/"


def test_the_readme_opens_with_the_two_commands_and_ci_runs_its_test_command():
  text = _read(README)
  first = _code_blocks(text)[0]
  assert text.index("```") < text.index("\n## "), "README.md must open with the two commands"
  commands = [shlex.split(line, comments=True) for line in first.splitlines() if line and not line[0].isspace()]
  assert [c[0] for c in commands] == ["./run_all.sh", "./run_tests.sh"], commands
  ci = [line.strip() for line in _read(os.path.join(REPO, ".ci", "run")).splitlines()]
  assert " ".join(commands[1]) in ci, ".ci/run no longer runs the README's test command"


def test_the_readme_sections_come_in_their_order():
  headings = re.findall(r"^## .*", _read(README), flags=re.M)
  assert headings == README_SECTIONS, headings


def test_the_readme_accuracy_excerpt_is_the_committed_reports():
  """Every row of the excerpt is the row of the same attention in reports/example_cpu/report/accuracy_cpu.md."""
  excerpt = _table_rows(_section(_read(README), "## Read the results"))
  assert excerpt[0] == ["Model", "Attention", "ListOps", "Avg"] and len(excerpt) > 3, excerpt
  report = _read(os.path.join(REPO, "reports", "example_cpu", "report", "accuracy_cpu.md"))
  assert report.startswith("## Accuracy — protocol `cpu`")
  header, *rows = _table_rows(next(p for p in report.split("\n\n") if p.startswith("| Model |")))
  columns = [header.index("Model"), header.index("Attention"), header.index("ListOps"), header.index("Avg")]
  by_key = {(row[0], row[1]): [row[i] for i in columns] for row in rows}
  for row in excerpt[1:]:
    assert by_key.get((row[0], row[1])) == row, f"README row {row} is not reports/example_cpu's"


def test_the_readme_reproduction_table_is_the_committed_reports():
  """Each row: our cell as reports/cpu_xiong_listops/report/accuracy_xiong.md has it, and its published row."""
  table = _table_rows(_read(README).split("## Read the results", 1)[0])
  assert table[0][:2] == ["model", "registered name"], table
  rows = _table_rows(_read(os.path.join(REPO, "reports", "cpu_xiong_listops", "report", "accuracy_xiong.md")))
  for _, name, ours, published in table[1:]:
    name = name.strip("`")
    mine = [row for row in rows if row[1] == name]
    assert mine and mine[0][2].replace("*", "") == ours.replace("*", ""), (name, ours, mine[:1])
    assert any(row[2] == published and row[-1].startswith("xiong_2021") for row in mine), (name, published)


# --- Links --------------------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
  """GitHub's anchor of a heading."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@functools.cache
def _anchors(path: str) -> set[str]:
  text = re.sub(r"^```.*?^```", "", _read(path), flags=re.M | re.S)
  return {_slug(h) for h in re.findall(r"^#+ (.*)", text, flags=re.M)}


def test_every_link_resolves_inside_the_repository():
  """Every link and image of README.md and docs/*.md is a relative path to a file or folder of the
  repository (and, with ``#anchor``, to a heading of that page); nothing points outside it."""
  bad = []
  for page in _pages():
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(_read(page))):
      where = f"{os.path.relpath(page, REPO)}: {target}"
      path, _, anchor = target.partition("#")
      if re.match(r"[a-z]+:", path) or path.startswith("/"):
        bad.append(f"{where} points outside the repository")
        continue
      resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
      if os.path.relpath(resolved, REPO).startswith(os.pardir):
        bad.append(f"{where} points outside the repository")
      elif not os.path.exists(resolved):
        bad.append(f"{where} does not exist")
      elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
        bad.append(f"{where}: no heading with that anchor")
  assert not bad, "\n".join(bad)


def test_the_docs_index_lists_every_page():
  index = _read(os.path.join(DOCS, "index.md"))
  missing = [f for f in sorted(os.listdir(DOCS)) if f.endswith(".md") and f != "index.md" and f"]({f})" not in index]
  assert not missing, f"add these pages to docs/index.md: {missing}"


# --- The zoo ------------------------------------------------------------------------------------------------


def _zoo_names() -> set[str]:
  names = set()
  for cells in _table_rows(_section(_read(os.path.join(DOCS, "zoo.md")), "## The field"))[1:]:
    names.update(re.findall(r"`([a-z0-9_]+)`", cells[1]))
  return names


def _builtin() -> set[str]:
  """The attentions and sequence mixers lra-bench itself ships (plugins, e.g. the installed example
  package, are not in the table)."""
  return {name for name in attention_zoo.list_layers()
          if attention_zoo.layer_defining_module(name).startswith("attention_zoo.")}


def test_every_registered_layer_is_in_the_zoo_table():
  missing = sorted(_builtin() - _zoo_names())
  assert not missing, f"add these registered layers to docs/zoo.md's table: {missing}"


def test_every_name_in_the_zoo_table_is_registered():
  unknown = sorted(_zoo_names() - _builtin())
  assert not unknown, f"docs/zoo.md's table names unregistered layers: {unknown}"


# --- The module map -----------------------------------------------------------------------------------------

ENTRY = re.compile(r"( *)([\w.][\w./-]*)(?:\s|$)")


def map_entries() -> list[str]:
  """The repository paths named by docs/ARCHITECTURE.md's module map: a line of its code block whose first
  word, indented by two spaces per level (at most four levels), is a folder (``name/``), a ``.py`` or
  ``.sh`` file or a path; its folder is the nearest entry above it one level up."""
  block = _code_blocks(_section(_read(MODULE_MAP), "## The module map"))[0]
  entries, folders = [], []
  for line in block.splitlines():
    match = ENTRY.match(line)
    if not match or len(match.group(1)) > 8 or len(match.group(1)) % 2:
      continue
    word, depth = match.group(2), len(match.group(1)) // 2
    if not (word.endswith(("/", ".py", ".sh")) or "/" in word):
      continue
    path = "".join(folders[:depth]) + word
    entries.append(path.rstrip("/"))
    if word.endswith("/"):
      folders[depth:] = [word]
  return entries


def _files(top: str) -> list[str]:
  return sorted(os.path.relpath(os.path.join(root, f), REPO) for root, dirs, files in os.walk(os.path.join(REPO, top))
                if "__pycache__" not in root for f in files if f.endswith((".py", ".sh")))


def _unlisted() -> list[str]:
  """The modules that are neither a registered layer's nor a protocol's file, which the map must name."""
  layers = {attention_zoo.layer_defining_module(name) for name in attention_zoo.list_layers()}
  protocols = {f"configs.{name}" for name in configs.list_protocols()}
  modules = []
  for path in _files("lra_bench") + _files("tasks") + _files("scripts") + _files("attention_zoo") + _files("configs"):
    module = path[:-len(".py")].replace(os.sep, ".")
    if module not in layers and module not in protocols:
      modules.append(path)
  return modules


def test_every_module_is_in_the_module_map():
  named = set(map_entries())
  missing = [path for path in _unlisted() if path not in named]
  assert not missing, f"add these modules to docs/ARCHITECTURE.md's module map: {missing}"


def test_every_entry_of_the_module_map_exists():
  entries = map_entries()
  assert {"lra_bench/training/loop.py", "attention_zoo/registry.py", "tasks/base.py"} <= set(entries), entries
  gone = [path for path in entries if not os.path.exists(os.path.join(REPO, path))]
  assert not gone, f"docs/ARCHITECTURE.md's module map names what does not exist: {gone}"
