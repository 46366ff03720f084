"""README.md's table of the field's systems stays true: every registered attention and sequence mixer
appears in it, and every name it lists is registered."""

from __future__ import annotations

import os
import re

import attention_zoo

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")
HEADING = "## The field: every system of the surveys, and where it is"


def _table_names() -> set[str]:
  text = open(README, encoding="utf-8").read()
  assert HEADING in text, f"README.md lost its section {HEADING!r}"
  section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
  names = set()
  for line in section.splitlines():
    cells = line.split("|")
    if len(cells) > 3 and not set(cells[2].strip()) <= set("-"):
      names.update(re.findall(r"`([a-z0-9_]+)`", cells[2]))
  return names


def _builtin() -> set[str]:
  """The attentions and sequence mixers lra-bench itself ships (plugins, e.g. the installed example
  package, are not in the table)."""
  return {name for name in attention_zoo.list_layers()
          if attention_zoo.layer_defining_module(name).startswith("attention_zoo.")}


def test_every_registered_attention_is_in_the_readme_table():
  missing = sorted(_builtin() - _table_names())
  assert not missing, f"add these registered attentions to README.md's systems table: {missing}"


def test_every_name_in_the_readme_table_is_registered():
  unknown = sorted(_table_names() - _builtin())
  assert not unknown, f"README.md's systems table names unregistered attentions: {unknown}"
