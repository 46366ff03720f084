"""How many real keys a real query of a trained `xiong` ListOps Reformer sees, hashed both ways.

Xiong et al.'s "Reformer (2 hashes)" row (published at 19.05 % on ListOps) ran transformers'
``LSHSelfAttention``, which hashes padded positions like real ones and only masks them as keys: a padded
position takes a slot in its bucket's sorted run, so a real query's window (its chunk of 64 sorted slots
and the previous chunk) holds fewer real keys the more padding hashes near it. This harness's ``reformer``
gives padded positions a sentinel bucket that sorts them to the end of every round, so windows of real
queries hold real keys only (``attention_zoo/reformer.py``). This script loads a ``reformer`` run directory
(its last checkpoint), runs one validation batch through the model, captures every layer's shared-QK
vectors (padded positions included, as the model computes them) and the padding mask, draws LSH rotations
(``--draws`` independent draws, as transformers draws them anew on every call), and counts, per layer:

- ``real keys (ours)`` / ``real keys (theirs)``: real keys other than the query itself in a real
  query's window, per round, averaged over the real queries, rounds, heads, examples and draws (at most
  2·64 − 1 = 127);
- ``pad share (theirs)``: the part of those windows' slots held by padded positions;
- ``queries under 64 (theirs)``: the share of real (query, round) pairs whose window holds fewer than
  64 real keys (half of what a full window holds).

  python scripts/reformer_window_diagnostic.py --workdir runs/xiong/reformer_s0 --data_dir DIR

Positions past the model's length (2 000 for ListOps here; transformers ran 2 048) are padded in both forms
and sorted to the end in both: the difference measured is that of the padded positions the model has.
The run directory is only read: it is copied to a temporary folder first (unless ``--no_copy``).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lra_bench
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the study's shared part, beside this file

import trained_core_calls as probe


def buckets(vecs, rotations, real, *, hash_padding):
  """Bucket ids int [H, R, P] of ``vecs`` [P, H, D] with ``rotations`` [H, D, R, U]: the core's own
  ``hash_buckets`` (padding gets its sentinel 2U), or with every position hashed (transformers' form)."""
  from attention_zoo.reformer import hash_buckets

  hashed = real if not hash_padding else np.ones_like(real)
  return np.asarray(hash_buckets(vecs[None], np.asarray(rotations, np.float32), hashed[None]))[0]


def window_real_keys(ids, real, chunk):
  """Real keys (not the query itself) in each real query's window, per round: a list of int arrays,
  one per head, of length R·(real queries). The R sorted rounds are concatenated and cut into chunks of
  ``chunk`` slots; a chunk looks at itself and the previous chunk (circular, none with one chunk)."""
  from attention_zoo.reformer import sort_order

  order = np.asarray(sort_order(ids))                                # [H, R, P]: the core's stable sort
  counts = []
  for h in range(ids.shape[0]):
    slots = order[h].reshape(-1)
    real_slot = real[slots].reshape(-1, chunk)                       # [M, C]
    per_chunk = real_slot.sum(-1)
    window = per_chunk + (np.roll(per_chunk, 1) if per_chunk.shape[0] > 1 else 0)
    counts.append(np.broadcast_to((window - 1)[:, None], real_slot.shape)[real_slot])
  return counts


def statistics(vecs, real, rotation_draws, chunk):
  """The statistics of the module docstring for one example: vecs [P, H, D], real bool [P]."""
  out = {"real keys (ours)": [], "real keys (theirs)": [], "pad share (theirs)": [],
         "queries under 64 (theirs)": []}
  window = 2 * chunk if real.shape[0] > chunk else chunk
  for rotations in rotation_draws:
    ours = np.concatenate(window_real_keys(buckets(vecs, rotations, real, hash_padding=False), real, chunk))
    theirs = np.concatenate(window_real_keys(buckets(vecs, rotations, real, hash_padding=True), real, chunk))
    out["real keys (ours)"].append(ours.mean())
    out["real keys (theirs)"].append(theirs.mean())
    out["pad share (theirs)"].append(1.0 - (theirs + 1).mean() / window)
    out["queries under 64 (theirs)"].append((theirs < chunk).mean())
  return {name: float(np.mean(values)) for name, values in out.items()}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  probe.add_run_arguments(parser, "reformer")
  parser.add_argument("--draws", type=int, default=4, help="independent rotation draws")
  parser.add_argument("--seed", type=int, default=0, help="seed of the rotation draws")
  args = parser.parse_args(argv)

  from attention_zoo.reformer import ReformerAttention, lsh_sizes

  def grab(module, call_args, call_kwargs):
    core = module.config
    return (np.asarray(call_args[0], np.float64), np.asarray(probe.core_mask(call_args, call_kwargs), bool),
            core.n_hashes, core.n_buckets, core.chunk_len)

  _, step, captured = probe.capture_core_calls(args, "reformer", ReformerAttention, grab)
  rng = np.random.default_rng(args.seed)
  stats = {}
  for layer, (q, mask, n_hashes, n_buckets, chunk_len) in enumerate(captured):
    length, heads, dim = q.shape[1:]
    n_buckets, chunk, padded = lsh_sizes(length, n_buckets, chunk_len)
    draws = [rng.standard_normal((heads, dim, n_hashes, n_buckets // 2)) for _ in range(args.draws)]
    rows = []
    for b in range(min(args.examples, q.shape[0])):
      vecs = np.zeros((padded, heads, dim))
      vecs[:length] = q[b]
      real = np.zeros(padded, bool)
      real[:length] = mask[b]
      rows.append(statistics(vecs, real, draws, chunk))
    stats[f"layer {layer}"] = {name: float(np.mean([row[name] for row in rows])) for name in rows[0]}
  real_lengths = [int(m.sum()) for m in captured[0][1][:args.examples]]
  probe.print_table(args, step, f"first {args.examples} examples of a validation batch (real lengths "
                    f"{real_lengths}), {args.draws} rotation draws", stats, draws=args.draws,
                    real_lengths=real_lengths)
  return 0


if __name__ == "__main__":
  sys.exit(main())
