"""Image-Local: the blockwise core equals dense float64 attention under the Image Transformer's local
masks written from their definition (1-D blocks + flange, 2-D rectangles + flange, causal), with padding
at the end and in the middle; declared support; sizes clipped to short inputs."""

import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import image_local
from tests.attention_probe import create, random_qkv
from tests.dense_reference import dense_masked_attention, key_and_causal_mask, run_core


def local_1d_mask(length, block, flange):
  """bool [L, L]: key j lies in [s − f, s + b + f) with s = the start of query i's block."""
  start = (np.arange(length) // block * block)[:, None]
  j = np.arange(length)[None, :]
  return (j >= start - flange) & (j < start + block + flange)


def local_2d_mask(length, width, shape, flange):
  """bool [L, L]: pixel j lies in the rectangle of query i's (qh×qw) block grown by (fh, fw)."""
  row, col = np.arange(length) // width, np.arange(length) % width
  top, left = row // shape[0] * shape[0], col // shape[1] * shape[1]
  rows_ok = (row[None, :] >= top[:, None] - flange[0]) & (row[None, :] < top[:, None] + shape[0] + flange[0])
  cols_ok = (col[None, :] >= left[:, None] - flange[1]) & (col[None, :] < left[:, None] + shape[1] + flange[1])
  return rows_ok & cols_ok


def holes_mask(batch, length):
  mask = np.ones((batch, length), bool)
  mask[0, length - 5:] = False
  mask[1, 12:17] = False
  return mask


CASES = [
    (45, {"block_len": 8, "memory_flange": 3}, lambda n: local_1d_mask(n, 8, 3)),
    (45, {"block_len": 8, "memory_flange": 11, "causal": True}, lambda n: local_1d_mask(n, 8, 11)),
    (59, {"image_width": 7, "query_shape": (2, 3), "flange_2d": (1, 2)},   # partial last row,
     lambda n: local_2d_mask(n, 7, (2, 3), (1, 2))),                      # 7 not a multiple of 3
    (59, {"image_width": 7, "query_shape": (3, 4), "flange_2d": (2, 1), "causal": True},
     lambda n: local_2d_mask(n, 7, (3, 4), (2, 1))),
]


@pytest.mark.parametrize("length, overrides, pattern", CASES)
def test_matches_dense_reference_under_definition_mask(x64, length, overrides, pattern):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64)
  mask = holes_mask(2, length)
  causal = overrides.get("causal", False)
  out = run_core(create("image_local", **overrides), q, k, v, mask)
  allowed = pattern(length) & key_and_causal_mask(mask, causal)
  np.testing.assert_allclose(np.asarray(out)[mask], dense_masked_attention(q, k, v, allowed)[mask],
                             rtol=1e-10, atol=1e-12)
  support = image_local.ImageLocalConfig(**overrides).support(length)
  np.testing.assert_array_equal(support, np.tril(pattern(length)) if causal else pattern(length))


def test_sizes_clip_to_short_inputs():
  config = image_local.ImageLocalConfig()
  assert image_local.geometry(config, 1000) == (1000, (1, 256), (0, 128))
  assert image_local.geometry(config, 40) == (40, (1, 40), (0, 40))        # dense at L <= b
  assert image_local.geometry(image_local.ImageLocalConfig(image_width=32), 1024) == (32, (8, 16), (8, 16))
  assert image_local.geometry(image_local.ImageLocalConfig(image_width=8), 20) == (8, (3, 8), (3, 8))
  assert config.support(40).all()


def test_memory_is_linear_in_length():
  """Memory slots per block do not grow with L: N·M ≈ L·(b + 2f)/b."""
  for length in (1024, 4096):
    queries, memory = image_local.block_tables(length, *image_local.geometry(image_local.ImageLocalConfig(), length))
    assert queries.shape == (length // 256, 256) and memory.shape == (length // 256, 512)


def test_bfloat16_inputs_stay_finite():
  q, k, v = random_qkv(5, 2, 40, 2, 16, 8, dtype=jnp.bfloat16, scale=4.0)
  out = run_core(create("image_local", image_width=8, query_shape=(2, 4), flange_2d=(1, 2)), q, k, v,
                 holes_mask(2, 40))
  assert out.dtype == jnp.bfloat16 and np.all(np.isfinite(np.asarray(out, np.float32)))
