"""The suite's sweeps (a protocol's declared axes and --sweep) and its causal-form filter."""

from __future__ import annotations

import pytest

from lra_bench.experiments import suite
from lra_bench.training import config as config_lib


def test_a_cli_sweep_makes_one_cell_per_value_with_its_own_workdir(tmp_path):
  sweeps = suite.parse_sweeps(["optimizer.learning_rate=0.001,0.01", "model.num_layers=1,2"])
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], str(tmp_path), sweeps=sweeps)
  assert [c.variant for c in cells] == ["lr=0.001,num_layers=1", "lr=0.001,num_layers=2",
                                       "lr=0.01,num_layers=1", "lr=0.01,num_layers=2"]
  assert [(c.config.optimizer.learning_rate, c.config.model.num_layers) for c in cells] == \
      [(0.001, 1), (0.001, 2), (0.01, 1), (0.01, 2)]
  assert len({c.workdir for c in cells}) == 4 and len({c.key() for c in cells}) == 4
  assert cells[0].name == "listops/vanilla/seed0[lr=0.001,num_layers=1]"
  # a fresh `train` process rebuilds the config from the cell's own overrides
  assert cells[3].overrides == ("optimizer.learning_rate=0.01", "model.num_layers=2")


def test_a_set_fixes_a_swept_key(tmp_path):
  sweeps = suite.parse_sweeps(["optimizer.learning_rate=0.001,0.01"])
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla"], [0], str(tmp_path),
                        ["optimizer.learning_rate=0.5"], sweeps)
  assert len(cells) == 1 and cells[0].variant == "" and cells[0].config.optimizer.learning_rate == 0.5


def test_without_a_sweep_a_cell_is_unchanged(tmp_path):
  cells, _ = suite.plan("smoke", ["listops"], ["vanilla", "local"], [0, 1], str(tmp_path))
  assert [c.name for c in cells] == ["listops/vanilla/seed0", "listops/vanilla/seed1", "listops/local/seed0",
                                     "listops/local/seed1"]


@pytest.mark.parametrize("item", ["optimizer.learning_rate", "=1,2", "optimizer.learning_rate="])
def test_a_malformed_sweep_is_one_clear_error(item):
  with pytest.raises(config_lib.ConfigError, match="--sweep"):
    suite.parse_sweeps([item])


def test_a_bad_swept_value_names_the_cell(tmp_path):
  with pytest.raises(config_lib.ConfigError, match=r"cell listops/vanilla/seed0\[num_layers=zero\]"):
    suite.plan("smoke", ["listops"], ["vanilla"], [0], str(tmp_path),
               sweeps=suite.parse_sweeps(["model.num_layers=zero"]))


def test_the_zoology_protocol_sweeps_length_width_and_rate(tmp_path):
  variants = suite.sweep_variants("zoology", "mqar", {}, ())
  assert len(variants) == 3 * 4 * 4
  sets, label = variants[0]
  assert label == "L=64,d=64,lr=0.0001"
  assert "data.prepare.num_kv_pairs=4" in sets and "data.max_length=64" in sets and "batch_size=512" in sets
  # --sweep replaces the protocol's axis of the same key; --set removes the axis
  narrowed = suite.sweep_variants("zoology", "mqar", suite.parse_sweeps(["optimizer.learning_rate=0.001"]),
                                  ("model.emb_dim=64", "model.qkv_dim=64"))
  assert [label for _, label in narrowed] == ["L=64,lr=0.001", "L=128,lr=0.001", "L=256,lr=0.001"]


def test_cores_without_a_causal_form_leave_the_next_token_grid(tmp_path):
  sets = ["optimizer.learning_rate=0.001", "model.emb_dim=16", "model.qkv_dim=16"]
  cells, _ = suite.plan("zoology", ["mqar"], ["vanilla", "linformer", "local"], [0], str(tmp_path), sets)
  kept, excluded = suite.without_causal_form(cells)
  assert {c.attention for c in kept} == {"vanilla", "local"}
  assert list(excluded) == ["linformer"] and "causal" in excluded["linformer"]


def test_an_attention_option_is_checked_against_the_grids_attentions(tmp_path):
  """A --set of one layer's option (the modern layers' token-by-token form) plans the grid of layers that
  have it, and names the cell of a layer that has not."""
  sets = ["model.attention_kwargs.mode=recurrent"]
  cells, _ = suite.plan("smoke", ["listops"], ["gla", "mamba"], [0], str(tmp_path), sets)
  assert [(c.attention, c.config.model.attention_kwargs.mode) for c in cells] == \
      [("gla", "recurrent"), ("mamba", "recurrent")]
  with pytest.raises(config_lib.ConfigError, match="vanilla.*no config field.*mode"):
    suite.plan("smoke", ["listops"], ["gla", "vanilla"], [0], str(tmp_path), sets)
