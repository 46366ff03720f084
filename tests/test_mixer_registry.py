"""Every registered sequence mixer through the mixer conformance kit (lra_bench.mixer_testing), one test
per check: a new mixer file enters these tests without a line written for it."""

import pytest

import attention_zoo
from lra_bench import mixer_testing

MIXERS = attention_zoo.list_mixers()


def test_the_built_in_mixers_are_registered():
  assert {"s4d", "s5", "lru", "mega", "mega_chunk", "seq_icl_lru"} <= set(MIXERS)
  assert not set(MIXERS) & set(attention_zoo.list_attentions())


@pytest.mark.parametrize("check", mixer_testing.CHECKS)
@pytest.mark.parametrize("name", MIXERS)
def test_mixer_conforms(name, check):
  result = mixer_testing.check_one(name, check)
  if result.passed is None:
    pytest.skip(f"{name} {check}: {result.detail}")
  assert result.passed, f"{name} {check}: {result.measured}; {result.detail}"
