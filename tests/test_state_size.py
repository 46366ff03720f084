"""``AttentionConfig.state_size`` and ``attention_zoo.state_size``: the causal state of every core.

Zoology (Arora et al. 2024) and Based plot recall against the floats a causal model keeps per layer to
produce the next token; papers reused a state size that was wrong by 4-16x (zoology issues #34-37), so
every family is checked here against a count made by hand, the fixed patterns also against the causal
probe of the core itself (the positions a later query still gives weight to), and the registry as a
whole against what ``causal=True`` actually does.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from lra_bench import testing

NAMES = attention_zoo.list_attentions()


def size(name: str, length: int, heads: int = 1, head_dim: int = 64, **overrides) -> int | None:
  """The count the registry helper reports (and the config method agrees with it)."""
  count, reason = attention_zoo.state_size(name, length, heads, head_dim, **overrides)
  assert reason
  assert count == attention_zoo.attention_config(name, **overrides).state_size(length, heads, head_dim)
  return count


# ----------------------------------------------------------------------------------------------------
# Hand counts, one family at a time, each at two lengths


@pytest.mark.parametrize("name", ["vanilla", "flash", "kernelized", "synthesizer"])
def test_exact_attention_keeps_every_key_and_value(name):
  assert size(name, 64, heads=1, head_dim=64) == 2 * 64 * 64 == 8192        # Zoology's 2·d·L, d = H·D
  assert size(name, 100, heads=4, head_dim=16) == 2 * (4 * 16) * 100 == 12800
  count, reason = attention_zoo.state_size(name, 64, 1, 64)
  assert "H·D·L" in reason, reason


@pytest.mark.parametrize("name", ["synthesizer_dense", "synthesizer_factorized_random"])
def test_synthesizers_without_dot_product_keep_values_only(name):
  assert size(name, 64) == 64 * 64                      # no Q Kᵀ: the keys are never read again
  assert size(name, 100, heads=2, head_dim=8) == 2 * 8 * 100
  assert size(name, 64, ignore_dot_product=False) == 2 * 64 * 64


def test_windows_keep_their_width_whatever_the_length():
  # adaptive_span: distances 1..max_span − 1, so max_span = 9 keeps 8 past keys/values per head.
  for length in (64, 4096):
    assert size("adaptive_span", length, max_span=9) == 2 * 64 * 8 == 1024
  assert size("adaptive_span", 5, max_span=9) == 2 * 64 * 5                  # clamped to L
  # longformer: ⌈w/2⌉ keys to the left including the query itself: w = 9 keeps 4, w = 17 keeps 8.
  assert size("longformer", 64, window=9) == size("longformer", 1000, window=9) == 2 * 64 * 4
  assert size("longformer", 64, window=17) == 2 * 64 * 8
  assert size("longformer", 3, window=17) == 2 * 64 * 3
  # local blocks of S: at most the S − 1 earlier positions of the current block.
  assert size("local", 64, block_size=8) == size("local", 1000, block_size=8) == 2 * 64 * 7
  assert size("local", 5, block_size=8) == 2 * 64 * 5
  assert size("local", 64, block_size=8, grouping="lra_strided") == 2 * 64 * 64  # residues recur
  # image_local 1-D: block b = 8, flange f = 3: the query at the block's last position keeps f + b − 1.
  assert size("image_local", 64, block_len=8, memory_flange=3) == 2 * 64 * 10
  assert size("image_local", 1000, block_len=8, memory_flange=3) == 2 * 64 * 10
  # axial rows of m: the current row's past part.
  assert size("axial", 64, width=8, mode="row") == size("axial", 1000, width=8, mode="row") == 2 * 64 * 7
  # long_short, w = 8 (e = 4), r = 32: running sums H·r·(2D + 2), window e + w − 1 = 11 positions.
  for length in (64, 4096):
    assert size("long_short", length, heads=2, head_dim=16) == 2 * 32 * (2 * 16 + 2) + 2 * 2 * 16 * 11


def test_patterns_that_reach_every_past_position_keep_all_of_them():
  for name, overrides in [("sparse_strided", {}), ("bigbird", {}), ("sinkhorn", {}),
                          ("axial", {"mode": "union"}), ("axial", {"mode": "column"}),
                          ("axial", {"mode": "parallel"})]:
    assert size(name, 64, **overrides) == 2 * 64 * 64, name
    assert size(name, 81, heads=2, head_dim=8, **overrides) == 2 * 2 * 8 * 81, name


def test_sparse_fixed_keeps_summary_columns_and_the_current_block():
  # l = 4, c = 1: k = 1 summary column per finished block + the block's past: most at t = 15: 3 + 3.
  assert size("sparse_fixed", 16, block_len=4, summary=1, head_dim=1) == 2 * (3 * 1 + 3)
  assert size("sparse_fixed", 19, block_len=4, summary=1, head_dim=1) == 2 * (4 * 1 + 3)
  # first_column adds offset 0: k = 2 -> at t = 15, 3·2 + 3.
  assert size("sparse_fixed", 16, block_len=4, summary=1, first_column=True, head_dim=1) == 2 * 9
  # cls_token: the CLS key + the pattern on the other L − 1 = 8 positions (most at t' = 7: 1 + 3).
  assert size("sparse_fixed", 9, block_len=4, summary=1, cls_token=True, head_dim=1) == 2 * (1 + 4)


@pytest.mark.parametrize("name, overrides, per_head", [
    ("linear_transformer", {}, 64 * 64 + 64),                     # F = D = 64
    ("performer", {}, 256 * 64 + 256 + 1),                        # F = M = 256, + the running max
    ("performer", {"kernel": "relu"}, 64 * 64 + 64),              # F = D
    ("performer", {"nb_features": 2}, 2 * 64 + 2 + 1),            # LRA's ListOps FAVOR+
    ("rfa", {}, 256 * 64 + 256),                                  # F = 2M = 256 (sin and cos)
    ("rfa", {"causal": True, "gated": True}, 256 * 64 + 256),     # the gate decays S and z in place
    ("cosformer", {}, 128 * 64 + 128),                            # F = 2D (sin and cos blocks)
    ("luna", {}, 256 * (2 * 64 + 1)),                             # Σ w·k, Σ w·v, Σ w per latent
])
def test_recurrent_state_does_not_grow_with_length(name, overrides, per_head):
  for length in (64, 4096):
    assert size(name, length, heads=1, head_dim=64, **overrides) == per_head
    assert size(name, length, heads=3, head_dim=64, **overrides) == 3 * per_head


def test_based_accounting():
  """Based's linear attention: heads·head_dim·E + heads·E for feature dim E; the Linear Transformer is
  that with E = D (its elu + 1 map keeps the head dim)."""
  heads, head_dim = 4, 16
  assert size("linear_transformer", 512, heads, head_dim) == heads * head_dim * head_dim + heads * head_dim


def test_memory_compressed_keeps_one_slot_per_window():
  assert size("memory_compressed", 63, head_dim=8) == 2 * 8 * 21              # S = 3: 21 windows
  assert size("memory_compressed", 64, head_dim=8) == 2 * 8 * 22              # + the unfinished one


def test_combiner_counts():
  d = 1
  # combiner_fixed, S = 4, C = 1: per finished block C summary keys/values + k̂, v̂ (2D·2), the
  # current block's raw keys/values (2D each) and its running query pool (D). Most at t = 15.
  assert size("combiner_fixed", 16, block_size=4, num_summary=1, head_dim=d) == 2 * (2 * 3 + 3) + 1
  assert size("combiner_fixed", 19, block_size=4, num_summary=1, head_dim=d) == 2 * (2 * 4 + 3) + 1
  assert size("combiner_fixed", 16, block_size=4, direct="block", head_dim=d) == 2 * (1 * 3 + 3) + 1
  # combiner_axial_vertical, m = 4: every key/value (2t) + the column pools (m) + this row's queries.
  assert size("combiner_axial_vertical", 16, width=4, head_dim=d) == 2 * 15 + 4 + 3      # t = 15
  assert size("combiner_axial_vertical", 13, width=4, head_dim=d) == 2 * 13 + 4 + 1      # t = 13
  # horizontal and mixture: every past query, key and value.
  for name in ("combiner_axial_horizontal", "combiner_mixture"):
    assert size(name, 16, width=4, head_dim=d) == 3 * 16
    assert size(name, 100, heads=2, head_dim=8) == 3 * 2 * 8 * 100
  # combiner_axial_rowmajor, m = 4: k̂, v̂ per column of each finished row (2D·m) + this row's q, k, v.
  assert size("combiner_axial_rowmajor", 16, width=4, head_dim=d) == 8 * 3 + 3 * 3        # t = 15
  assert size("combiner_axial_rowmajor", 16, width=4, row_summary="pool", head_dim=d) == 5 * 3 + 3 * 3
  assert size("combiner_axial_rowmajor", 14, width=4, head_dim=d) == 8 * 3 + 3 * 2        # t = 14


def test_combiner_logsparse_by_hand():
  """L = 8, K = 3 levels, D = 1. The peak is t = 3 (binary 011): the next query reads the left chunks
  {2} (level 0) and [0, 2) (level 1); the chunk [0, 4) of level 2 is unfinished and will be read by
  the queries of [4, 8), but its span value needs its pooled query, so its 3 raw keys/values stay
  (6), with that running pool (1), and [0, 2)'s v̂ (1; its k̂ re-pools from the raw keys, {2} is raw
  itself): 8. After t = 7 (111) only the three finished left chunks are needed (6)."""
  assert size("combiner_logsparse", 8, head_dim=1) == 8
  assert size("combiner_logsparse", 8, heads=2, head_dim=3) == 2 * 3 * 8
  assert size("combiner_logsparse", 4, head_dim=1) == 4          # K = 2: at t = 3, {2} and [0, 2)
  # The worst case grows like H·D·L: the raw tail of the unfinished half.
  assert size("combiner_logsparse", 1024, head_dim=1) >= 1024


# ----------------------------------------------------------------------------------------------------
# No causal form, config-dependent causal forms, cores that declare nothing


@pytest.mark.parametrize("name", ["linformer", "nystromformer", "fnet", "isab", "routing", "skyformer",
                                  "efficient_attention", "combiner_learnable", "reformer", "global_local"])
def test_no_causal_form_is_none_with_its_reason(name):
  count, reason = attention_zoo.state_size(name, 64, 1, 64)
  assert count is None
  config = attention_zoo.attention_config(name)
  assert config.state_size(64, 1, 64) is None
  assert reason == f"no causal form: {config.no_causal_form}", reason
  assert len(config.no_causal_form) > 10


def test_causal_forms_that_depend_on_the_config():
  assert size("longformer", 64, window=9, num_global=1) is None
  assert size("global_local", 64, num_global=0, window=9) == 2 * 64 * 4
  assert size("reformer", 64, trax_causal=True) == 2 * 64 * 64
  assert size("sinkhorn", 64, sort_activation="sinkhorn") is None
  assert size("sinkhorn", 64, grouping="strided") is None
  assert size("luna", 64) is not None and size("isab", 64) is None


@dataclasses.dataclass(frozen=True)
class _PluginConfig(attention_zoo.AttentionConfig):
  """A plugin's config that declares no state size (as every plugin written before it existed)."""


class _PluginCore(nn.Module):
  config: _PluginConfig

  def __call__(self, query, key, value, mask=None, deterministic=True):
    return value


def test_a_core_that_declares_nothing_is_unknown_not_no_causal_form():
  with registry.temporary({"test_undeclared_state": (_PluginCore, _PluginConfig)}):
    count, reason = attention_zoo.state_size("test_undeclared_state", 64, 1, 64)
    assert count is None and reason.startswith("unknown: "), reason
    assert "_PluginConfig" in reason
    with pytest.raises(attention_zoo.StateSizeUnknown, match="state size not declared"):
      attention_zoo.attention_config("test_undeclared_state").state_size(64, 1, 64)
    assert issubclass(attention_zoo.StateSizeUnknown, NotImplementedError)


def test_helper_rejects_impossible_shapes():
  with pytest.raises(ValueError, match="num_heads"):
    attention_zoo.state_size("vanilla", 64, 0, 64)
  with pytest.raises(ValueError, match="unknown attention"):
    attention_zoo.state_size("no_such_attention", 64, 1, 64)


def test_peak_over_prefixes_is_the_maximum_over_every_prefix():
  for length in range(0, 30):
    for period in (1, 3, 7):
      state = lambda t, p=period: 5 * (t // p) + (t % p) ** 2   # rises within a period, drops after it
      assert registry.peak_over_prefixes(length, period, state) == max(state(t) for t in range(length + 1))


# ----------------------------------------------------------------------------------------------------
# Fixed patterns against the core itself: the past positions a later query still gives weight to


def probed_states(name: str, length: int, margin: int = 40, **overrides) -> np.ndarray:
  """For every L ≤ ``length``: the most, over t ≤ L, of the positions j < t that some query i ≥ t gives
  non-zero weight in the core's causal effective matrix, probed once on ``length + margin`` positions
  (the continuation a generator would go on with)."""
  p = testing.effective_attention(name, length + margin, causal=True, **overrides)
  reached = np.abs(p) > 0
  held = [int(np.any(reached[t:, :t], axis=0).sum()) for t in range(length + 1)]
  return np.maximum.accumulate(held)


PATTERNS = [
    ("vanilla", {}, 2),
    ("flash", {}, 2),
    ("kernelized", {}, 2),
    ("synthesizer", {}, 2),
    ("synthesizer_dense", {}, 1),             # values only: count per position is V = D
    ("local", {"block_size": 8}, 2),
    ("local", {"block_size": 8, "grouping": "lra_strided"}, 2),
    ("longformer", {"window": 9}, 2),
    ("adaptive_span", {"max_span": 8}, 2),
    ("sparse_fixed", {"block_len": 8, "summary": 2, "first_column": True}, 2),
    ("sparse_fixed", {"block_len": 4, "summary": 1, "cls_token": True}, 2),
    ("sparse_strided", {"block_len": 4}, 2),
    ("image_local", {"block_len": 8, "memory_flange": 3}, 2),
    ("image_local", {"image_width": 8, "query_shape": (2, 4), "flange_2d": (1, 2)}, 2),
    ("axial", {"width": 8, "mode": "row"}, 2),
    ("axial", {"width": 8, "mode": "union"}, 2),
    ("bigbird", {"block_size": 4}, 2),
    ("sinkhorn", {"block_size": 4}, 2),
]


@pytest.mark.parametrize("name, overrides, per_position", PATTERNS,
                         ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}" for n, o, _ in PATTERNS])
def test_fixed_patterns_match_the_causal_probe(name, overrides, per_position):
  """At every length from 16 to 40 (the sizes are explicit, so none is clipped at these lengths)."""
  probed = probed_states(name, 40, **overrides)
  config = attention_zoo.attention_config(name, **overrides)
  declared = [config.state_size(length, 1, 1) for length in range(16, 41)]
  assert declared == [per_position * int(n) for n in probed[16:]]


# ----------------------------------------------------------------------------------------------------
# Registry-wide: declared causal capability = what causal=True does


def causal_form_raises(name: str, **overrides) -> bool:
  """Whether ``causal=True`` raises NotImplementedError when the core is traced on a tiny input."""
  core = attention_zoo.create_attention(name, causal=True, **overrides)
  q, k, v = testing.random_qkv(0, 1, 16, 2, 8, 8)
  rngs = testing.probe_rngs(0)
  try:
    jax.eval_shape(lambda q, k, v: core.init_with_output(rngs, q, k, v), q, k, v)
  except NotImplementedError:
    return True
  return False


CONFIG_CASES = [("longformer", {"num_global": 1}), ("global_local", {"num_global": 0}),
                ("reformer", {"trax_causal": True}), ("sinkhorn", {"sort_activation": "sinkhorn"}),
                ("sinkhorn", {"lra_noop_sort": True}), ("performer", {"kernel": "relu"})]


@pytest.mark.parametrize("name, overrides", [(n, {}) for n in NAMES] + CONFIG_CASES,
                         ids=NAMES + [f"{n}-{'-'.join(map(str, o.values()))}" for n, o in CONFIG_CASES])
def test_every_core_declares_a_state_size_that_agrees_with_its_causal_form(name, overrides):
  builtin = attention_zoo.defining_module(name).startswith("attention_zoo.")
  counts = [attention_zoo.state_size(name, length, 2, 8, **overrides) for length in (64, 100)]
  if not builtin and counts[0][1].startswith("unknown: "):
    pytest.skip(f"{name} is a plugin that declares no state size: {counts[0][1]}")
  for count, reason in counts:
    assert not reason.startswith("unknown: "), f"built-in core {name} must declare state_size: {reason}"
    assert count is None or (isinstance(count, int) and count > 0), (name, count)
  has_none = counts[0][0] is None
  assert (counts[1][0] is None) == has_none
  config = attention_zoo.attention_config(name, **overrides)
  assert bool(config.no_causal_form) == has_none, (name, config.no_causal_form)
  assert causal_form_raises(name, **overrides) == has_none, (
      f"{name}: state_size says {'no' if has_none else 'a'} causal form, causal=True says otherwise")


def test_registry_lists_every_builtin_core_with_a_declaration():
  builtins = [n for n in NAMES if attention_zoo.defining_module(n).startswith("attention_zoo.")]
  assert len(builtins) >= 45
  unknown = [n for n in builtins if attention_zoo.state_size(n, 64, 1, 8)[1].startswith("unknown")]
  assert not unknown
