"""The published numbers (``reports/reference/*.csv``) and how our attentions map onto their rows.

``lra_paper_accuracy.csv`` / ``lra_paper_efficiency.csv``: LRA Table 1 (accuracy) and Table 2 (speed,
memory), plus the Combiner paper's Table 5; ``lra_followups_accuracy.csv``: rows published later
under other protocols (never merged into the LRA ranking). ``reports/reference/README.md`` describes
each file and its sources.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

import attention_zoo
from lra_bench import REPO_ROOT

DEFAULT_REFERENCE_DIR = os.path.join(REPO_ROOT, "reports", "reference")

# The LRA Table 1 columns, in its order; ``Avg`` is over the first five (Path-X failed for everyone).
TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
AVG_TASKS = TASK_ORDER[:5]
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder", "pathx": "Path-X"}
REFERENCE_COLUMN = {"pathx": "path_x"}  # our task name -> column of lra_paper_accuracy.csv

# Our attention names -> the model names of the LRA / Combiner papers (rows of the reference CSVs).
PAPER_NAMES = {"vanilla": "Transformer", "performer": "Performer", "bigbird": "BigBird",
               "sparse_fixed": "Sparse Trans.", "combiner_fixed": "Combiner-Fixed",
               "local": "Local Attention", "longformer": "Longformer", "linformer": "Linformer",
               "reformer": "Reformer", "sinkhorn": "Sinkhorn Trans.", "synthesizer": "Synthesizer",
               "linear_transformer": "Linear Trans."}
PAPER_PREFIXES = {"combiner_axial_": "Combiner-Axial"}

# Which published numbers a protocol is comparable with: (source, columns taken from it; None = all).
# The Combiner paper copies the LRA numbers except Pathfinder, which it reran on the intermediate
# difficulty; so under `lra` its Combiner rows are used for the four other tasks only.
COMPARABLE = {
    "lra": (("lra_paper_table1", None), ("combiner_paper_table5", ("listops", "text", "retrieval", "image"))),
    "combiner": (("combiner_paper_table5", None),),
}


def paper_name(attention: str) -> str | None:
  """The published model name of ``attention`` (its config's ``paper_name``, else the table above)."""
  try:
    declared = attention_zoo.attention_config(attention).paper_name
  except ValueError:  # a record of an attention that is not registered here
    declared = None
  if declared:
    return declared
  if attention in PAPER_NAMES:
    return PAPER_NAMES[attention]
  for prefix, name in PAPER_PREFIXES.items():
    if attention.startswith(prefix):
      return name
  return None


def comparable(protocol: str) -> bool:
  return protocol in COMPARABLE


def load_reference(reference_dir: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
  """(accuracy, efficiency) published numbers; empty frames if the files are missing."""
  reference_dir = reference_dir or DEFAULT_REFERENCE_DIR
  frames = []
  for name in ("lra_paper_accuracy.csv", "lra_paper_efficiency.csv"):
    path = os.path.join(reference_dir, name)
    frames.append(pd.read_csv(path, dtype=str, keep_default_na=False) if os.path.exists(path)
                  else pd.DataFrame(columns=["source", "model"]))
  return frames[0], frames[1]


def number(text: Any) -> float | None:
  try:
    value = float(text)
  except (TypeError, ValueError):
    return None
  return value if np.isfinite(value) else None


def reference_accuracy(reference: pd.DataFrame, protocol: str, attention: str,
                       task: str) -> tuple[float | None, str | None]:
  """(published accuracy %, source) for one cell; ``task="avg"`` for the average column."""
  model = "Chance" if attention == "__chance__" else paper_name(attention)
  if model is None or reference.empty:
    return None, None
  column = REFERENCE_COLUMN.get(task, task)
  for source, columns in COMPARABLE.get(protocol, COMPARABLE["lra"]):
    if model == "Chance" and source != "combiner_paper_table5":
      continue  # only the Combiner table has a chance row
    rows = reference[(reference["source"] == source) & (reference["model"] == model)]
    if rows.empty or column not in rows:
      continue
    if columns is not None and task not in columns:
      return None, None  # this model's only row is not comparable for this column
    return number(rows.iloc[0][column]), source
  return None, None


# Rows published later under other protocols (model names as printed there -> our attention names).
FOLLOWUPS_FILE = "lra_followups_accuracy.csv"
FOLLOWUP_NAMES = {"Nystromformer": "nystromformer", "Skyformer": "skyformer", "FNet": "fnet",
                  "Luna-256": "luna", "H-Transformer-1D": "h_transformer_1d", "Standard": "vanilla",
                  "Reformer (2 hashes)": "reformer", "Linformer (k=256)": "linformer",
                  "Performer (256)": "performer"}


def load_followups(reference_dir: str | None = None) -> pd.DataFrame:
  """The rows of ``lra_followups_accuracy.csv`` (columns source, protocol, model, the tasks, avg5)."""
  path = os.path.join(reference_dir or DEFAULT_REFERENCE_DIR, FOLLOWUPS_FILE)
  if not os.path.exists(path):
    return pd.DataFrame(columns=["source", "protocol", "model"])
  return pd.read_csv(path, dtype=str, keep_default_na=False)
