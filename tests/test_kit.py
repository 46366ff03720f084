"""Tests of the conformance kit itself (``lra_bench.testing``): each deliberately broken core fails
exactly the check for its bug, with the number measured; the correct one passes everything.

The broken cores: one softmax core whose config field ``bug`` switches one defect on; with ``bug=""``
it is correct, so a failing check is due to the bug alone. ``CORES`` maps a registry name to (module
class, config class) for ``attention_zoo.registry.temporary`` (tests/test_check.py uses them too).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo.registry import AttentionConfig, temporary
from lra_bench import testing


@dataclasses.dataclass(frozen=True)
class FakeConfig(AttentionConfig):
  """``bug``: "" (correct), "peek" (ignores causal), "leak" (ignores the padding mask), "scaled" (rows
  sum to 2), "negative" (2 softmax - uniform: rows sum to 1, weights go negative), "biased_dropout" (no
  1/(1-p)), "fixed_key" (dropout from a constant key, not the "dropout" stream), "crash" (raises),
  "no_causal" (raises NotImplementedError under causal, as a core without a causal form), "uniform"
  (equal weights on the allowed keys: masking, causal and dropout right, q and k never read),
  "numpy_dropout" (the dropout mask drawn by numpy when the core runs, i.e. once per trace under jit),
  "frozen_value" (stop_gradient on the values), "upcast" (float32 output whatever the input dtype),
  "always_dropout" (drops weights under ``deterministic=True`` too), "round_off" (the output moves by
  ~1e-7 of its size with the dropout key: the run-to-run rounding of a GPU's atomic scatter-adds)."""

  bug: str = ""


class FakeCore(nn.Module):
  config: FakeConfig

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    c, bug = self.config, self.config.bug
    if bug == "crash":
      raise TypeError("boom: this core is broken on purpose")
    if bug == "no_causal" and c.causal:
      raise NotImplementedError("fake core has no causal form")
    batch, length, _, depth = query.shape
    allowed = jnp.ones((batch, 1, 1, length), bool)
    if mask is not None and bug != "leak":
      allowed = mask[:, None, None, :]
    if c.causal and bug != "peek":
      allowed = allowed & jnp.tril(jnp.ones((length, length), bool))
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(depth)
    p = jnp.where(allowed, jax.nn.softmax(jnp.where(allowed, logits, -1e30), axis=-1), 0.0)
    if bug == "uniform":
      p = jnp.broadcast_to(allowed / jnp.sum(allowed, axis=-1, keepdims=True), p.shape)
    if bug == "scaled":
      p = 2.0 * p
    if bug == "negative":
      p = 2.0 * p - allowed / jnp.sum(allowed, axis=-1, keepdims=True)
    if (not deterministic or bug == "always_dropout") and c.dropout_rate > 0:
      rng = jax.random.key(0) if bug == "fixed_key" else self.make_rng("dropout")
      keep = jax.random.bernoulli(rng, 1.0 - c.dropout_rate, p.shape)
      if bug == "numpy_dropout":
        keep = np.random.default_rng().random(p.shape) < 1.0 - c.dropout_rate
      p = jnp.where(keep, p, 0.0) / (1.0 if bug == "biased_dropout" else 1.0 - c.dropout_rate)
    if bug == "frozen_value":
      value = jax.lax.stop_gradient(value)
    out = jnp.einsum("bhqk,bkhv->bqhv", p.astype(value.dtype), value)
    if bug == "round_off" and self.has_rng("dropout"):
      out = out * (1.0 + 1e-7 * jax.random.uniform(self.make_rng("dropout"), out.shape, out.dtype, -1.0, 1.0))
    return out.astype(jnp.float32) if bug == "upcast" else out


def _config(bug: str, **declared) -> type[FakeConfig]:
  """A config class whose ``bug`` defaults to ``bug``, with class-level declarations ``declared``."""
  fields = [("bug", str, dataclasses.field(default=bug))]
  return dataclasses.make_dataclass(f"Fake_{bug or 'ok'}", fields, bases=(FakeConfig,), frozen=True,
                                    namespace=dict(declared))


def _banded(length: int) -> np.ndarray:
  i = np.arange(length)
  return np.abs(i[:, None] - i[None, :]) <= 2


CORES = {
    "fake_ok": (FakeCore, _config("")),
    "fake_peek": (FakeCore, _config("peek")),
    "fake_leak": (FakeCore, _config("leak")),
    "fake_scaled": (FakeCore, _config("scaled")),
    "fake_scaled_undeclared": (FakeCore, _config("scaled", rows_sum_to_one=False)),
    "fake_negative": (FakeCore, _config("negative")),
    "fake_biased_dropout": (FakeCore, _config("biased_dropout")),
    "fake_fixed_key": (FakeCore, _config("fixed_key")),
    "fake_crash": (FakeCore, _config("crash")),
    "fake_no_causal": (FakeCore, _config("no_causal")),
    # a full softmax that declares a band of width 2: weight outside its declared support
    "fake_support": (FakeCore, _config("", support=lambda self, length: _banded(length))),
    "fake_uniform": (FakeCore, _config("uniform")),
    "fake_uniform_declared": (FakeCore, _config("uniform", ignores=("query", "key"))),
    "fake_false_declaration": (FakeCore, _config("", ignores=("key",))),  # reads the key all the same
    "fake_numpy_dropout": (FakeCore, _config("numpy_dropout")),
    "fake_frozen_value": (FakeCore, _config("frozen_value")),
    "fake_upcast": (FakeCore, _config("upcast")),
    "fake_always_dropout": (FakeCore, _config("always_dropout")),
    "fake_round_off": (FakeCore, _config("round_off")),
    # config declarations of the wrong type: a float support mask; an input name that does not exist
    "fake_float_support": (FakeCore, _config("", support=lambda self, length: np.ones((length, length)))),
    "fake_bad_ignores": (FakeCore, _config("", ignores=("keys",))),
}


# (broken core, the check that rejects it, words of its detail): every check of the kit has one.
REJECTS = [
    ("fake_peek", "causal", "above the diagonal"),
    ("fake_leak", "padding_appended", "trailing padded positions"),
    ("fake_leak", "padding_inserted", "inserted padded positions"),
    ("fake_leak", "padding_zero_weight", "padded keys"),
    ("fake_scaled", "rows_sum_to_one", "declares rows that sum to 1"),
    ("fake_negative", "nonnegative", "declares nonnegative"),
    ("fake_support", "support", "outside the declared support"),
    ("fake_biased_dropout", "dropout_unbiased", "away from the deterministic output"),
    ("fake_fixed_key", "determinism", "another dropout key gives the same output"),
    ("fake_always_dropout", "determinism", "deterministic=True output depends on the dropout key"),
    ("fake_crash", "float32", "TypeError: boom"),
    ("fake_uniform", "depends_on_qk", "does not depend on the query"),
    ("fake_uniform", "depends_on_qk", "does not depend on the key"),
    ("fake_false_declaration", "depends_on_qk", "declares ignores 'key', yet the output moves"),
    ("fake_numpy_dropout", "jit", "jit and op-by-op outputs differ"),
    ("fake_frozen_value", "gradients", "d/dvalue is zero"),
    ("fake_upcast", "bfloat16", "output dtype float32, expected bfloat16"),
    ("fake_float_support", "config", "not bool"),
    ("fake_bad_ignores", "config", "ignores is ('keys',)"),
]


@pytest.fixture(scope="module")
def fakes():
  with temporary(CORES) as names:
    yield names


def test_a_correct_core_passes_every_check(fakes):
  results = testing.run_conformance("fake_ok", quick=True)
  assert [r.name for r in results] == list(testing.CHECKS)
  assert {r.name: r.passed for r in results} == {c: None if c == "support" else True for c in testing.CHECKS}


@pytest.mark.parametrize("name, check, words", REJECTS)
def test_each_bug_fails_its_check_with_the_measured_number(fakes, name, check, words):
  result = testing.check_one(name, check, quick=True)
  assert result.passed is False, result
  assert words in result.detail
  assert result.measured  # the number (or "raised") that decided it


def test_every_check_has_a_core_it_rejects():
  """The table above names, for every check of the kit, a broken core that fails it."""
  assert {check for _, check, _ in REJECTS} == set(testing.CHECKS)


def test_uniform_weights_fail_only_the_dependence_check(fakes):
  """The audit's case: equal weights on the real keys, masked, causal and dropout right, pass every
  other check; only ``depends_on_qk`` tells that the core does not attend."""
  results = testing.run_conformance("fake_uniform", quick=True)
  assert [r.name for r in testing.failures(results)] == ["depends_on_qk"]
  dependence = next(r for r in results if r.name == "depends_on_qk")
  assert dependence.measured == "query redrawn: rel. Δ 0, key redrawn: rel. Δ 0"


def test_declared_content_independence_is_reported_not_passed(fakes):
  result = testing.check_one("fake_uniform_declared", "depends_on_qk", quick=True)
  assert result.passed is None and result.status == "n.a."
  assert result.detail == "declared content-independent (ignores query and key)"
  ok = testing.check_one("fake_ok", "depends_on_qk", quick=True)
  assert ok.passed is True and ok.detail == ""


@pytest.mark.parametrize("name, check", [("fake_peek", "padding_zero_weight"), ("fake_leak", "causal"),
                                         ("fake_negative", "rows_sum_to_one"),
                                         ("fake_biased_dropout", "determinism"),
                                         # run-to-run rounding is not a dropout key in deterministic outputs
                                         ("fake_round_off", "determinism")])
def test_a_bug_does_not_fail_unrelated_checks(fakes, name, check):
  assert testing.check_one(name, check, quick=True).passed is True


def test_undeclared_properties_and_missing_forms_are_not_applicable(fakes):
  undeclared = testing.check_one("fake_scaled_undeclared", "rows_sum_to_one", quick=True)
  assert undeclared.passed is None and "not declared" in undeclared.detail
  assert "row sum" in undeclared.measured  # still measured: 1 off
  no_causal = testing.check_one("fake_no_causal", "causal", quick=True)
  assert no_causal.passed is None and "no causal form" in no_causal.detail


def test_assert_conformant_lists_each_failure_with_its_number(fakes):
  with pytest.raises(AssertionError) as info:
    testing.assert_conformant("fake_leak", quick=True)
  message = str(info.value)
  assert "fake_leak" in message and "3 conformance check(s)" in message
  for check in ("padding_appended", "padding_inserted", "padding_zero_weight"):
    assert f"  {check}: max |" in message


def test_bad_arguments_are_clear(fakes):
  with pytest.raises(ValueError, match="its checks: config"):
    testing.check_one("fake_ok", "no_such_check")
  with pytest.raises(ValueError, match="known attentions"):
    testing.check_one("no_such_attention", "config")
  with pytest.raises(TypeError, match="unknown option.*lenght"):
    testing.check_one("fake_ok", "config", lenght=5)
