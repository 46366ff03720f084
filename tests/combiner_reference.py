"""Naive Combiner reference, straight from the definitions: plain Python loops over queries and spans.

A *partition function* ``partition(i) -> (direct, spans)`` lists, for query position ``i``, the direct
key positions and the spans (each a list of key positions, or ``(positions, anchor)`` for row-major
spans whose local query is the one at ``anchor``). Positions are of the unpadded sequence; padded keys
are dropped here, empty spans skipped. :func:`reference` then builds every direct and span logit
explicitly, applies one softmax per query and expands spans with their own within-span softmax. O(L^2)
or worse per query on purpose: nothing is shared with the implementation.
"""

from __future__ import annotations

import math

import numpy as np


# ----------------------------------------------------------------------------- partitions


def fixed_partition(length, *, block, num_summary=1, direct="sparse", causal=False):
  c = min(num_summary, block) if direct == "sparse" else 0
  blocks = -(-length // block)
  is_summary = lambda j: j % block >= block - c

  def partition(i):
    own = i // block
    near = [j for j in range(length) if j // block == own and (not causal or j <= i)]
    cols = [j for j in range(length) if j // block != own and is_summary(j)
            and (not causal or j // block < own)]
    spans = [[j for j in range(length) if j // block == z and not is_summary(j)]
             for z in range(blocks) if z != own and (not causal or z < own)]
    return near + cols, spans

  return partition


def logsparse_partition(length, *, causal=False):
  levels = (length - 1).bit_length()

  def partition(i):
    spans = []
    for level in range(levels):
      c = i >> level
      if c % 2 == 1:
        spans.append(list(range((c - 1) << level, c << level)))
      elif not causal and (c + 1) << level < length:
        spans.append(list(range((c + 1) << level, min((c + 2) << level, length))))
    return [i], spans

  return partition


def grid_width(length, width=None):
  return width or math.ceil(math.sqrt(length))


def axial_partition(length, *, family, width=None, causal=False):
  """family: "vertical", "horizontal", "both" (mixture, joint) or "row" (row-major, anchored spans)."""
  m = grid_width(length, width)
  n = -(-length // m)
  at = lambda z, t: z * m + t if z * m + t < length else None
  keep = lambda xs: [x for x in xs if x is not None]

  def partition(i):
    r, c = divmod(i, m)
    row = keep(at(r, t) for t in range(m) if not causal or t <= c)
    if family == "row":
      rows = [z for z in range(n) if z != r and (not causal or z < r)]
      return row, [(keep(at(z, t) for t in range(m)), at(z, c)) for z in rows]
    column = keep(at(z, c) for z in range(n) if z != r and (not causal or z < r))
    spans = []
    if family in ("vertical", "both"):
      for t in range(m):
        if t != c:
          spans.append(keep(at(z, t) for z in range(r)))
          if not causal:
            spans.append(keep(at(z, t) for z in range(r + 1, n)))
    if family in ("horizontal", "both"):
      for z in range(n):
        if z != r and (not causal or z < r):
          spans.append(keep(at(z, t) for t in range(c)))
          spans.append(keep(at(z, t) for t in range(c + 1, m)))
    return row + column, spans

  return partition


def learnable_partition(q, k, mask, means, chunk):
  """Per (batch, head) partition functions from the centroids ``means`` [H, K, D] (float64 numpy)."""
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)
  feats = unit(unit(q) + unit(k))                                   # [B, L, H, D]
  batch, length, heads = q.shape[:3]
  table = {}
  for b in range(batch):
    for h in range(heads):
      cluster = [int(np.argmax(means[h] @ feats[b, i, h])) if mask[b, i] else len(means[h])
                 for i in range(length)]
      order = sorted(range(length), key=lambda i: (cluster[i], i))  # stable sort by cluster
      chunk_of = {pos: rank // chunk for rank, pos in enumerate(order)}
      chunks = {}
      for pos in order:
        chunks.setdefault(chunk_of[pos], []).append(pos)

      def partition(i, chunk_of=chunk_of, chunks=chunks):
        own = chunk_of[i]
        return chunks[own], [members for cid, members in chunks.items() if cid != own]

      table[b, h] = partition
  return table


def multiplicity(partition, length, valid):
  """count [L, L]: how many terms (direct or span) of query i cover real key j."""
  count = np.zeros((length, length), int)
  for i in range(length):
    direct, spans = partition(i)
    for j in direct:
      count[i, j] += valid[j]
    for span in spans:
      members = span[0] if isinstance(span, tuple) else span
      for j in members:
        count[i, j] += valid[j]
  return count


# ----------------------------------------------------------------------------- attention


def _softmax(logits):
  w = np.exp(np.asarray(logits) - np.max(logits))
  return w / w.sum()


def _pool(x, kind):
  return x.max(0) if kind == "max" else x.mean(0)


def reference(q, k, v, mask, partition, *, kind="max", phi_q=None, phi_k=None, row_summary=None,
              proj=None):
  """out [B, L, H, V] (real query rows; padded rows left 0).

  partition: one function, or a dict {(b, h): function}. kind: "max" or "mean"; phi_q/phi_k: DeepSets
  kernels [D, D] (ReLU(x W) before pooling) or None. row_summary/proj: row-major spans ("wsum", "proj"
  with kernel ``proj``, or "pool").
  """
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  mask = np.asarray(mask, bool)
  batch, length, heads, dim = q.shape
  phi = lambda x, w: x if w is None else np.maximum(x @ w, 0.0)
  out = np.zeros(v.shape)
  for b in range(batch):
    real = mask[b]
    for h in range(heads):
      part = partition[b, h] if isinstance(partition, dict) else partition
      for i in range(length):
        if not real[i]:
          continue
        direct, spans = part(i)
        logits, values = [], []
        for j in direct:
          if real[j]:
            logits.append(q[b, i, h] @ k[b, j, h] / math.sqrt(dim))
            values.append(v[b, j, h])
        for span in spans:
          members, anchor = span if isinstance(span, tuple) else (span, None)
          members = [j for j in members if real[j]]
          if not members:
            continue
          keys, vals = k[b, members, h], v[b, members, h]
          if row_summary is None:
            q_hat = _pool(phi(q[b, members, h], phi_q), kind)
            k_hat = _pool(phi(keys, phi_k), kind)
            local = _softmax(keys @ q_hat / math.sqrt(dim))
          else:  # row-major: the query at the anchor (or the row's max query), weighted keys
            q_row = q[b, anchor, h] if anchor is not None and real[anchor] else q[b, members, h].max(0)
            local = _softmax(keys @ q_row / math.sqrt(dim))
            if row_summary == "pool":
              k_hat = _pool(phi(keys, phi_k), kind)
            else:
              k_hat = local @ keys
              if row_summary == "proj":
                k_hat = k_hat + k_hat @ proj
          logits.append(q[b, i, h] @ k_hat / math.sqrt(dim))
          values.append(local @ vals)
        out[b, i, h] = _softmax(logits) @ np.stack(values)
  return out
