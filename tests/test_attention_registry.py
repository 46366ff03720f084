"""Registry-wide tests: every registered sequence layer, attention core or mixer, gets these without a line
written for it.

One test per (layer, check) through the conformance kit ``lra_bench.testing`` — the same code a plugin's
author runs on their layer and ``lra-bench check`` prints; the kit picks the checks of the layer's kind
(``testing.kit``) — so there is no second copy of the checks here. A check that does not apply to a layer
(no causal form; a property its config does not declare; no fixed support; one form only) is a skip naming
why.
"""

from __future__ import annotations

import pytest

import attention_zoo
from lra_bench import testing

CASES = [(name, check) for name in attention_zoo.list_layers() for check in testing.kit(name).checks]


def test_registry_errors_are_clear():
  with pytest.raises(ValueError, match="known attentions: .*vanilla.*known sequence mixers: .*s5"):
    attention_zoo.create_attention("no_such_attention")
  with pytest.raises(TypeError, match="no_such_field"):
    attention_zoo.create_attention("vanilla", no_such_field=1)
  with pytest.raises(ValueError, match="'s5' is a sequence mixer, not an attention core"):
    attention_zoo.create_attention("s5")


def test_the_built_in_layers_are_registered_once_each():
  mixers, cores = attention_zoo.list_mixers(), attention_zoo.list_attentions()
  assert {"s4d", "s5", "lru", "mega", "mega_chunk", "seq_icl_lru"} <= set(mixers)
  assert {"vanilla", "performer", "flash"} <= set(cores)
  assert not set(mixers) & set(cores)
  assert attention_zoo.list_layers() == cores + mixers
  assert {testing.kit(name).kind for name in mixers} == {"mixer"}


@pytest.mark.parametrize(("name", "check"), CASES)
def test_conformance(name, check):
  result = testing.check_one(name, check)
  if result.passed is None:
    pytest.skip(f"{name} {check}: {result.detail}")
  assert result.passed, f"{name} fails {check}: {result.measured}; {result.detail}"
