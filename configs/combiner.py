"""The Combiner protocol: the official LRA configs, with Pathfinder on the intermediate difficulty.

``pathfinder32_inter`` = contour length 9 (the release's ``curv_contour_length_9`` folder;
docs/lra_protocol.md §5, docs/generators.md §2.2).

  lra-bench data prepare pathfinder --protocol combiner
  lra-bench train --task pathfinder --attention combiner_fixed --protocol combiner --workdir runs/pf_comb
"""

from __future__ import annotations

import ml_collections

from configs import lra


# Per-attention settings: LRA's (the Combiner paper copies LRA's rows but Pathfinder; the Combiner cores
# have no released LRA settings: google-research's combiner/ code has no LRA configs).
attention_settings = lra.attention_settings
PUBLISHED_DIFFERENCES = lra.PUBLISHED_DIFFERENCES


def get_config(task: str = "listops") -> ml_collections.ConfigDict:
  c = lra.get_config(task)
  c.protocol = "combiner"
  if task == "pathfinder":
    c.data.options.contour_length = 9
    c.data.prepare.contour_length = 9
  return c
