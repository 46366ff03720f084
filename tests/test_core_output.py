"""The model checks what a core returns (issue 30 item 3): a core whose output is not ``[B, L, H, V]``
in the values' dtype fails at trace time with one line naming the core and its module, instead of
training to ``ok`` (last dim V/2 fed the output projection) or a broadcasting error naming nothing."""

from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
from attention_zoo import registry
from attention_zoo.vanilla import VanillaAttention
from lra_bench.experiments import cell
from lra_bench.training import config as config_lib
from lra_bench.training import models, objectives
from tests.conftest import tiny_overrides


@dataclasses.dataclass(frozen=True)
class _Config(attention_zoo.AttentionConfig):
  pass


class _HalfValue(nn.Module):
  """Softmax attention returning only the first V/2 value features."""
  config: _Config

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    out = VanillaAttention(self.config)(query, key, value, mask, deterministic)
    return out[..., :value.shape[-1] // 2]


class _SwappedAxes(nn.Module):
  """Returns [B, H, L, V] (heads and positions swapped)."""
  config: _Config

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    return jnp.swapaxes(VanillaAttention(self.config)(query, key, value, mask, deterministic), 1, 2)


class _Float32Out(nn.Module):
  """Right shape, but float32 whatever the values' dtype."""
  config: _Config

  @nn.compact
  def __call__(self, query, key, value, mask=None, deterministic=True):
    return VanillaAttention(self.config)(query, key, value, mask, deterministic).astype(jnp.float32)


def _init(name: str, *extra: str):
  config = config_lib.load_config("smoke", "listops", tiny_overrides(**{"data.max_length": 12}) + list(extra),
                                  attention=name)
  model = objectives.select(config).create_model()
  batch = {"inputs": np.arange(1, 25, dtype=np.int32).reshape(2, 12) % 10 + 1}
  return jax.eval_shape(lambda: model.init({"params": jax.random.key(0)}, batch))


@pytest.mark.parametrize("core, got", [(_HalfValue, "float32 [2, 13, 2, 4]"),
                                       (_SwappedAxes, "float32 [2, 2, 13, 8]")])
def test_wrong_output_shape_names_the_core_and_its_module(core, got):
  with registry.temporary({"test_bad_shape": (core, _Config)}):
    with pytest.raises(models.CoreOutputError) as err:
      _init("test_bad_shape")
  message = str(err.value)
  assert message.startswith(f"attention 'test_bad_shape' (module {__name__}) returned {got}; a core must "
                            "return [B, L, H, V] = [2, 13, 2, 8] in the values' dtype float32")
  assert "\n" not in message


def test_wrong_output_dtype_names_the_core():
  with registry.temporary({"test_bad_dtype": (_Float32Out, _Config)}):
    _init("test_bad_dtype")  # float32 model: float32 is right
    with pytest.raises(models.CoreOutputError, match=r"returned float32 \[2, 13, 2, 8\]; .* dtype bfloat16"):
      _init("test_bad_dtype", "precision=bfloat16")


def test_a_conforming_core_passes_the_check():
  _init("vanilla")


def test_train_with_half_value_core_fails_with_one_line_instead_of_ok(listops_dir, tmp_path):
  """The user's run: before the check it trained to ``ok`` and was recorded."""
  with registry.temporary({"test_half_value": (_HalfValue, _Config)}):
    config = config_lib.load_config("smoke", "listops", tiny_overrides(), attention="test_half_value")
    record = cell.train_cell(config, str(tmp_path / "run"), listops_dir, str(tmp_path / "results"))
  assert record["status"] == "failed"
  assert re.match(rf"CoreOutputError: attention 'test_half_value' \(module {__name__}\) returned "
                  r"float32 \[\d+, 65, 2, 4\]; a core must return", record["error"]), record["error"]
  assert "\n" not in record["error"]
