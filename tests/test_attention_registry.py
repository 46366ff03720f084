"""Registry-wide attention tests: every registered core gets these without writing a line.

One test per (core, check) through the conformance kit ``lra_bench.testing`` — the same code a plugin's
author runs on their core and ``lra-bench check`` prints — so there is no second copy of the checks
here. A check that does not apply to a core (no causal form; a property its config does not declare;
no fixed support) is a skip naming why.
"""

from __future__ import annotations

import pytest

import attention_zoo
from lra_bench import testing

NAMES = attention_zoo.list_attentions()


def test_registry_errors_are_clear():
  with pytest.raises(ValueError, match="known attentions: .*vanilla"):
    attention_zoo.create_attention("no_such_attention")
  with pytest.raises(TypeError, match="no_such_field"):
    attention_zoo.create_attention("vanilla", no_such_field=1)


@pytest.mark.parametrize("check", testing.CHECKS)
@pytest.mark.parametrize("name", NAMES)
def test_conformance(name, check):
  result = testing.check_one(name, check)
  if result.passed is None:
    pytest.skip(f"{name} {check}: {result.detail}")
  assert result.passed, f"{name} fails {check}: {result.measured}; {result.detail}"
