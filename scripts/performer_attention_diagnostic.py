"""What Xiong et al.'s Performer call does to the attention of a trained `xiong` ListOps model.

Xiong et al.'s Performer (the ``xiong`` protocol's "Performer (256)" row, published at 18.80 % on ListOps)
called performer_pytorch's FAVOR+ with ``K * mask`` and ``V * mask`` (padded keys stay in the sums as
zero vectors) and that library's key stabilizer (one max of x̃Wᵀ over the whole batch, heads, keys and
features, ε = 1e-4). This harness's ``performer`` masks padded keys out and takes one max of z per batch
and head (``attention_zoo/performer.py``; the two quirks are ``padded_keys="zeroed"`` and
``key_stabilizer="global"``). This script loads a ``performer`` run directory (its last checkpoint),
runs one validation batch through the model, captures every layer's q, k and projection W, and computes
in float64, for each layer, the attention matrix each form implies (a_ij = φ(q_i)·φ(k_j), normalized over
keys), averaged over the real queries of the batch:

- ``pad share``: the part of a query's weight on padded keys (zero values: it scales the output down);
- ``eps share``: the part of its weight on real keys that comes from their ε term (the same for every
  key: weight that does not depend on the key); ``eps share (ours)``: the same with this harness's
  stabilizer;
- ``TV to uniform``: total variation between the attention restricted to real keys and the uniform
  distribution over them (0: the layer averages its values; 1: one key takes all);
- ``TV ours vs theirs``: total variation between the two forms' attention over real keys.

  python scripts/performer_attention_diagnostic.py --workdir runs/xiong/performer_s0 --data_dir DIR

The run directory is only read: it is copied to a temporary folder first (unless ``--no_copy``), so a
running training's checkpoints are never touched. The settings are the run's own (``--set`` as given to
``lra-bench train``); the quirks are applied here, to the same parameters.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lra_bench
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the study's shared part, beside this file

import trained_core_calls as probe


def log_features(x, w, scale_twice):
  """z = x̃Wᵀ − |x̃|²/2 (float64) of x [L, D] with W [M, D]."""
  x = scaled(x, x.shape[-1], scale_twice)
  return x @ w.T - 0.5 * np.sum(x * x, -1, keepdims=True)


def features(x, w, *, is_query, scale_twice, eps, peak=None):
  """FAVOR+ features (float64) of x [L, D] with W [M, D]; queries: own max over features; keys: minus
  ``peak``."""
  z = log_features(x, w, scale_twice)
  if is_query:
    return (np.exp(z - z.max(-1, keepdims=True)) + eps) / np.sqrt(w.shape[0])
  return (np.exp(z - peak) + eps) / np.sqrt(w.shape[0])


def scaled(x, dim, scale_twice):
  """x̃: x·D^{-1/4}, twice with ``input_normalizations=2``."""
  return x * dim ** -0.25 * (dim ** -0.25 if scale_twice else 1.0)


def global_peak(k, mask, w, scale_twice):
  """Theirs: one max of x̃Wᵀ over k [B, L, H, D] with padded keys zeroed (their zeros included)."""
  return float(np.max(scaled(k * mask[:, :, None, None], k.shape[-1], scale_twice) @ w.T))


def attention_weights(q, k, real, w, peak, *, scale_twice, eps):
  """One example and head: q, k [L, D], real bool [L]. Returns the unnormalized weights of the real
  queries: ours [n, n] (real keys, one max of z over them) and theirs [n, L] (every key, padded ones
  zeroed, minus the batch-wide ``peak``), and theirs' ε part per query [n]."""
  phi_q = features(q[real], w, is_query=True, scale_twice=scale_twice, eps=eps)
  own_peak = np.max(log_features(k[real], w, scale_twice))
  ours = phi_q @ features(k[real], w, is_query=False, scale_twice=scale_twice, eps=eps, peak=own_peak).T
  theirs = phi_q @ features(k * real[:, None], w, is_query=False, scale_twice=scale_twice, eps=eps,
                            peak=peak).T
  eps_part = phi_q.sum(-1) * eps / np.sqrt(w.shape[0]) * real.sum()       # Σ_real j φ(q)·(ε/√M)·1
  return ours, theirs, eps_part


def layer_statistics(q, k, mask, w, *, scale_twice, eps, max_examples):
  """q, k [B, L, H, D] float64, mask bool [B, L], W [M, D] -> the statistics, means over the first
  ``max_examples`` examples, the heads and the real queries."""
  peak = global_peak(k, mask, w, scale_twice)
  names = ("pad share", "eps share", "eps share (ours)", "TV to uniform (ours)", "TV to uniform (theirs)",
           "TV ours vs theirs")
  sums = {name: [] for name in names}
  for b in range(min(max_examples, q.shape[0])):
    real = mask[b]
    uniform = 1.0 / real.sum()
    for h in range(q.shape[2]):
      ours, theirs, eps_part = attention_weights(q[b, :, h], k[b, :, h], real, w, peak,
                                                 scale_twice=scale_twice, eps=eps)
      sums["eps share (ours)"].append(np.mean(eps_part / ours.sum(-1)))      # same ε term, own max
      ours = ours / ours.sum(-1, keepdims=True)
      on_real = theirs[:, real].sum(-1)
      sums["pad share"].append(np.mean(1.0 - on_real / theirs.sum(-1)))
      sums["eps share"].append(np.mean(eps_part / on_real))
      theirs_real = theirs[:, real] / on_real[:, None]
      sums["TV to uniform (ours)"].append(np.mean(0.5 * np.abs(ours - uniform).sum(-1)))
      sums["TV to uniform (theirs)"].append(np.mean(0.5 * np.abs(theirs_real - uniform).sum(-1)))
      sums["TV ours vs theirs"].append(np.mean(0.5 * np.abs(ours - theirs_real).sum(-1)))
  return {name: float(np.mean(values)) for name, values in sums.items()}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  probe.add_run_arguments(parser, "performer")
  args = parser.parse_args(argv)

  from attention_zoo.performer import PerformerAttention, PerformerConfig

  def grab(module, call_args, call_kwargs):
    q, k = call_args[0], call_args[1]
    w = module.projection(q.shape[-1], np.float32)
    return (np.asarray(q, np.float64), np.asarray(k, np.float64), np.asarray(w, np.float64),
            np.asarray(probe.core_mask(call_args, call_kwargs)))

  cfg, step, captured = probe.capture_core_calls(args, "performer", PerformerAttention, grab)
  kwargs = cfg.model.attention_kwargs
  scale_twice = kwargs.get("input_normalizations", PerformerConfig.input_normalizations) == 2
  eps = kwargs.get("numerical_stabilizer", PerformerConfig.numerical_stabilizer)
  stats = {}
  for layer, (q, k, w, mask) in enumerate(captured):
    stats[f"layer {layer}"] = layer_statistics(q, k, mask.astype(bool), w, scale_twice=scale_twice, eps=eps,
                                               max_examples=args.examples)
  lengths = captured[0][3].shape[0]
  probe.print_table(args, step, f"validation batch of {lengths} examples, first {args.examples} used; "
                    f"real lengths {[int(m.sum()) for m in captured[0][3][:args.examples]]}", stats)
  return 0


if __name__ == "__main__":
  sys.exit(main())
