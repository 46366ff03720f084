"""Reformer LSH attention: equals a float64 reference built from the definition (hash, sort by
(bucket, position), chunk + previous chunk, no self unless alone, rounds combined by logsumexp), with
padding at the end and in the middle, causal, several rounds and LRA's quirks; the key is ignored."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_zoo import reformer
from tests.attention_probe import create, effective_matrix, init_and_apply, random_qkv
from tests.dense_reference import padded_mask, run_core


def lsh_reference(q, v, mask, rotations, *, chunk, causal=False, mask_self=True, normalize_keys=True,
                  sqrt_d_quirk=False):
  """float64 numpy LSH attention of one batch: q [B, L, H, D], v [B, L, H, V], mask [B, L],
  rotations [H, D, R, U] -> [B, L, H, V] (rows of padded queries are not checked)."""
  q, v = np.asarray(q, np.float64), np.asarray(v, np.float64)
  rotations = np.asarray(rotations, np.float64)
  batch, length, heads, dim = q.shape
  rounds, half = rotations.shape[2:]
  padded = -(-length // chunk) * chunk
  q = np.concatenate([q, np.zeros((batch, padded - length, heads, dim))], 1)
  valid = np.concatenate([np.asarray(mask, bool), np.zeros((batch, padded - length), bool)], 1)
  keys = q / np.sqrt(np.mean(q * q, -1, keepdims=True) + 1e-6) if normalize_keys else q
  scale = np.sqrt(dim) if sqrt_d_quirk else 1 / np.sqrt(dim)
  out = np.zeros((batch, length, heads, v.shape[-1]))
  for b in range(batch):
    for h in range(heads):
      rotated = np.einsum("ld,dru->rlu", q[b, :, h], rotations[h])
      buckets = np.where(valid[b], np.argmax(np.concatenate([rotated, -rotated], -1), -1), 2 * half)
      seq = np.concatenate([sorted(range(padded), key=lambda i: (buckets[r, i], i)) for r in range(rounds)])
      chunks = seq.reshape(-1, chunk)
      for i in range(length):
        outs, lses = [], []
        for r in range(rounds):
          m = list(seq[r * padded:(r + 1) * padded]).index(i) // chunk + r * padded // chunk
          window = chunks[m] if len(chunks) == 1 else np.concatenate([chunks[m], chunks[m - 1]])
          ok = valid[b, window] & ((window <= i) if causal else True)
          logits = scale * keys[b, window, h] @ q[b, i, h]
          if mask_self:
            logits = np.where(window == i, -1e5, logits)
          if not ok.any():
            continue
          logits = np.where(ok, logits, -np.inf)
          lse = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
          outs.append(np.exp(logits - lse)[ok] @ v[b, window[ok], h])
          lses.append(lse)
        if lses:
          weights = np.exp(np.array(lses) - np.logaddexp.reduce(lses))
          out[b, i, h] = sum(w * o for w, o in zip(weights, outs))
  return out


def middle_and_end_mask(batch, length):
  mask = padded_mask(batch, length, 6)
  mask[-1, length // 3:length // 3 + 4] = False
  return mask


@pytest.mark.parametrize("length, overrides, scale", [
    (37, {"chunk_len": 8}, 1.0),
    (45, {"chunk_len": 6, "n_hashes": 2, "causal": True, "trax_causal": True}, 1.0),
    (41, {"chunk_len": 5, "n_hashes": 3, "n_buckets": 6}, 1.0),
    (41, {"chunk_len": None, "n_buckets": 4, "mask_self": False, "normalize_keys": False,
          "lra_sqrt_d_quirk": True}, 0.3),                                   # LRA's form
])
def test_matches_reference_from_the_definition(x64, length, overrides, scale):
  q, k, v = random_qkv(0, 2, length, 2, 4, 3, dtype=jnp.float64, scale=scale)
  mask = middle_and_end_mask(2, length)
  out, inter = run_core(create("reformer", **overrides), q, k, v, mask, intermediates=True)
  rotations = inter["rotations"][0]
  _, chunk, _ = reformer.lsh_sizes(length, overrides.get("n_buckets"), overrides.get("chunk_len", 64))
  expected = lsh_reference(q, v, mask, rotations, chunk=chunk, causal=overrides.get("causal", False),
                           mask_self=overrides.get("mask_self", True),
                           normalize_keys=overrides.get("normalize_keys", True),
                           sqrt_d_quirk=overrides.get("lra_sqrt_d_quirk", False))
  np.testing.assert_allclose(np.asarray(out)[mask], expected[mask], rtol=1e-9, atol=1e-12)


def test_key_argument_is_ignored():
  q, k, v = random_qkv(1, 1, 24, 2, 4, 3)
  core = create("reformer", chunk_len=4)
  np.testing.assert_array_equal(run_core(core, q, k, v), run_core(core, q, 5.0 * k + 1.0, v))


def test_support_is_within_two_chunks_and_excludes_self():
  """One round: every row has at most 2C - 1 non-zero keys (own chunk and the previous one, minus
  itself), never itself when it has company, and itself alone at causal position 0."""
  q, k, _ = random_qkv(2, 1, 32, 1, 4, 4, dtype=jnp.float32)
  p = effective_matrix(create("reformer", chunk_len=4), q, k)[0]
  assert np.all((p > 0).sum(-1) <= 7) and np.all(np.diag(p) == 0)
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
  p_causal = effective_matrix(create("reformer", chunk_len=4, causal=True, trax_causal=True), q, k)[0]
  assert p_causal[0, 0] == pytest.approx(1.0) and np.all(np.triu(p_causal, 1) == 0)


def test_rotations_come_from_the_attention_stream_or_the_fixed_seed():
  q, k, v = random_qkv(3, 1, 20, 1, 4, 2)
  core = create("reformer")

  def rotations(core, **rngs):
    return core.apply({}, q, k, v, rngs=rngs, mutable=["intermediates"])[1]["intermediates"]["rotations"][0]

  same = rotations(core, attention=jax.random.key(7)), rotations(core, attention=jax.random.key(7))
  np.testing.assert_array_equal(*same)
  assert not np.array_equal(same[0], rotations(core, attention=jax.random.key(8)))
  fixed = create("reformer", redraw="fixed")
  np.testing.assert_array_equal(rotations(fixed, attention=jax.random.key(7)), rotations(core))


def test_sizes_follow_the_length_and_configs_are_checked():
  assert reformer.lsh_sizes(4096, None, 64) == (64, 64, 4096)
  assert reformer.lsh_sizes(37, None, 64) == (2, 64, 64)
  assert reformer.lsh_sizes(1000, 10, None) == (10, 100, 1000)   # LRA: n_buckets chunks per round
  for bad in ({"n_buckets": 5}, {"n_hashes": 0}, {"chunk_len": None}, {"redraw": "sometimes"}):
    with pytest.raises(ValueError):
      create("reformer", **bad)


def test_plain_causal_is_refused_because_chunks_depend_on_the_future():
  q, k, v = random_qkv(0, 1, 16, 1, 4, 4)
  with pytest.raises(NotImplementedError, match="trax_causal"):
    init_and_apply(create("reformer", causal=True), q, k, v)
