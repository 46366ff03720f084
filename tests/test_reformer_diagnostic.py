"""scripts/reformer_window_diagnostic.py (which hashes with the ``reformer`` core's own ``hash_buckets``): its
window counts are what a slot-by-slot count of the sorted, chunked rounds gives, in both forms."""

import importlib.util
import os

import numpy as np

_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "reformer_window_diagnostic.py")
_spec = importlib.util.spec_from_file_location("reformer_window_diagnostic", _PATH)
diagnostic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diagnostic)


def _example(padded=96, heads=2, dim=8, rounds=2, half_buckets=3, real_length=57, seed=0):
  rng = np.random.default_rng(seed)
  vecs = rng.standard_normal((padded, heads, dim))
  real = np.arange(padded) < real_length
  rotations = rng.standard_normal((heads, dim, rounds, half_buckets))
  return vecs, real, rotations


def _brute_force(ids, real, chunk):
  """Slot by slot: for every real query slot, the real keys other than itself in its chunk and the
  previous one."""
  heads, rounds, padded = ids.shape
  counts = []
  for h in range(heads):
    slots = []
    for r in range(rounds):
      slots += sorted(range(padded), key=lambda p: (ids[h, r, p], p))
    chunks = [slots[i:i + chunk] for i in range(0, len(slots), chunk)]
    per_head = []
    for m, members in enumerate(chunks):
      window = members + (chunks[m - 1] if len(chunks) > 1 else [])
      for i, query in enumerate(members):
        if real[query]:
          keys = [key for j, key in enumerate(window) if j != i and real[key]]
          per_head.append(len(keys))
    counts.append(np.array(per_head))
  return counts


def test_window_counts_match_a_slot_by_slot_count_in_both_forms():
  for seed in range(3):
    vecs, real, rotations = _example(seed=seed)
    for hash_padding in (False, True):
      ids = diagnostic.buckets(vecs, rotations, real, hash_padding=hash_padding)
      for got, want in zip(diagnostic.window_real_keys(ids, real, 16), _brute_force(ids, real, 16)):
        np.testing.assert_array_equal(got, want)


def test_padding_hashed_like_real_positions_takes_window_slots():
  vecs, real, rotations = _example(padded=128, real_length=64)
  stats = diagnostic.statistics(vecs, real, [rotations], 16)
  # ours: padding sorts to the end, so a real query's window is full of real keys but at the ends of
  # the real run (the first chunk of a round looks back into the previous round's padding)
  assert stats["real keys (ours)"] > stats["real keys (theirs)"]
  assert 0.0 < stats["pad share (theirs)"] < 1.0
  all_real = np.ones(128, bool)
  full = diagnostic.statistics(vecs, all_real, [rotations], 16)
  assert full["real keys (ours)"] == full["real keys (theirs)"] == 2 * 16 - 1
  assert full["pad share (theirs)"] == 0.0
