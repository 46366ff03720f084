"""The published numbers (``lra_bench/report/published/*.csv``, package data) and how our attentions map
onto their rows.

``lra_paper_accuracy.csv`` / ``lra_paper_efficiency.csv``: LRA Table 1 (accuracy) and Table 2 (speed,
memory), plus the Combiner paper's Table 5; ``lra_followups_accuracy.csv``: rows published later
under other protocols (never merged into the LRA ranking); ``modern_layers_accuracy.csv``: the modern
recurrent layers' published LRA rows (xLSTM Table 6, RWKV, HGRN, HGRN2, LION), each under its paper's own
recipe (``protocol``), read with the follow-ups; ``spt_accuracy.csv``: self-pretraining (SPT) against
training from scratch as published (``report.pretraining``); ``flash_attention_tflops.csv``,
``fla_op_timings.csv`` and ``device_peak_flops.csv``: the efficiency report's published anchors (FlashAttention-2
and -3's TFLOP/s, fla's op timings) and the devices' peak FLOP/s. ``published/README.md`` describes each file and
its sources. They are the report's input, so they ship with the package (``pyproject.toml``'s package data):
an installed lra-bench finds them without the repository.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

import attention_zoo
import tasks as tasks_lib

# Beside this module, in the package (declared as package data, so a wheel carries them).
DEFAULT_REFERENCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "published")

# The LRA Table 1 columns, in its order; ``Avg`` is over the first five (Path-X failed for everyone).
TASK_ORDER = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
AVG_TASKS = TASK_ORDER[:5]
TASK_TITLES = {"listops": "ListOps", "text": "Text", "retrieval": "Retrieval", "image": "Image",
               "pathfinder": "Pathfinder", "pathx": "Path-X"}
REFERENCE_COLUMN = {"pathx": "path_x"}  # our task name -> column of lra_paper_accuracy.csv

# Our attention names -> the model names of the LRA / Combiner papers (rows of the reference CSVs). A name
# match is not a settings match: ``published_settings`` says whether a protocol runs the original's.
PAPER_NAMES = {"vanilla": "Transformer", "performer": "Performer", "bigbird": "BigBird",
               "sparse_fixed": "Sparse Trans.", "combiner_fixed": "Combiner-Fixed",
               "local": "Local Attention", "longformer": "Longformer", "linformer": "Linformer",
               "reformer": "Reformer", "sinkhorn": "Sinkhorn Trans.", "synthesizer": "Synthesizer",
               "linear_transformer": "Linear Trans."}
PAPER_PREFIXES = {"combiner_axial_": "Combiner-Axial"}
# The Combiner paper's LRA code and configs are not released (google-research's combiner/ has a causal LM
# demo only); its "Combiner-Axial" row is one of the three axial cores, which one is not known (the
# released code's only model called "axial" is the row-major one).
UNKNOWN_SETTINGS = {
    "combiner_": "the Combiner paper's LRA settings are not released: the core's registered defaults ran",
    "combiner_axial_": ("which axial variant the Combiner paper ran on LRA is unknown (its LRA code is not "
                        "released; the released code's only \"axial\" model is row-major)"),
}

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
    declared = attention_zoo.layer_config(attention).paper_name
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


# The protocols are read from ``configs/`` itself (a ground-floor package, like ``tasks``): the report
# loads no config through training, so what a protocol presets is asked of its module directly.


def _protocols() -> list[str]:
  """The protocol modules of ``configs/`` (``lra-bench list protocols``)."""
  import configs

  return configs.list_protocols()


def protocol_module(protocol: str):
  """``configs.<protocol>``, or None where this checkout has no such protocol."""
  return importlib.import_module(f"configs.{protocol}") if protocol in _protocols() else None


def preset_problem(protocol: str, task: str) -> str | None:
  """Why ``protocol`` has no preset for ``task`` in this checkout (an unknown protocol; its
  ``get_config(task)`` refuses the task, e.g. ``smoke`` and Path-X), or None where it has one."""
  module = protocol_module(protocol)
  if module is None:
    return f"unknown protocol {protocol!r}; known protocols: {', '.join(_protocols())}"
  try:
    module.get_config(task)
  except ValueError as err:
    return str(err)
  return None


def preset_settings(protocol: str, task: str, attention: str) -> dict[str, Any] | None:
  """Config key -> value that ``protocol`` sets for ``attention`` on ``task`` (its module's
  ``attention_settings``; ``{}`` without one), or None where it has no such run here: no preset for the
  task, or a task or an attention not registered in this process."""
  module = protocol_module(protocol)
  if module is None or task not in tasks_lib.list_tasks():
    return None
  try:
    attention_zoo.layer_config(attention)
    config = module.get_config(task)
  except ValueError:  # an attention not registered here; a task the protocol has no config for
    return None
  config.model.attention = attention
  settings = getattr(module, "attention_settings", None)
  return dict(settings(config)) if settings is not None else {}


def published_differences(protocol: str) -> dict[str, str]:
  """attention -> what its runs under ``protocol`` still set differently from the published row ("" =
  the same settings): the protocol module's ``PUBLISHED_DIFFERENCES`` (``configs/<protocol>.py``)."""
  module = protocol_module(protocol)
  return {} if module is None else dict(getattr(module, "PUBLISHED_DIFFERENCES", {}))


def published_settings(protocol: str, attention: str) -> tuple[bool, str]:
  """(same settings as its published row?, what differs) for ``attention``'s runs under ``protocol``:
  never the same under a protocol that is not the paper's (``comparable``)."""
  if not comparable(protocol):
    return False, f"protocol `{protocol}` is not the paper's protocol"
  return preset_match(protocol, attention)


def preset_match(protocol: str, attention: str) -> tuple[bool, str]:
  """(same settings as the published row of ``protocol``'s source?, what differs).

  Same only where the protocol's per-attention preset is the original's (``PUBLISHED_DIFFERENCES[a]``
  is empty); an attention the protocol has no preset for ran its registered defaults, which are not
  known to be the original's."""
  differences = published_differences(protocol)
  if attention in differences:
    return differences[attention] == "", differences[attention]
  for prefix in sorted(UNKNOWN_SETTINGS, key=len, reverse=True):
    if attention.startswith(prefix):
      return False, UNKNOWN_SETTINGS[prefix]
  return False, f"protocol `{protocol}` has no preset of the original's settings: the registered defaults ran"


def settings_text(protocol: str, attention: str) -> str:
  """"same" or "differs" (the report's Settings column)."""
  return "same" if published_settings(protocol, attention)[0] else "differs"


def _format_settings(settings: dict[str, Any]) -> str:
  short = lambda key: key.replace("model.attention_kwargs.", "").replace("model.", "").replace("optimizer.", "")
  return ", ".join(f"{short(k)}={v}" for k, v in settings.items()) or "the task config (no change)"


def protocol_settings_notes(protocol: str, attentions: Sequence[str], tasks: Sequence[str],
                            row_name: Callable[[str], str | None] | None = None) -> list[str]:
  """The report's protocol notes: per attention, the settings the protocol's preset ran on each task
  (tasks with equal settings grouped), and for each published row whether it is the same model.
  ``row_name(attention)``: the model name of its published row (default ``paper_name``: LRA's)."""
  row_name = row_name or paper_name
  notes = []
  for attention in attentions:
    groups: dict[str, list[str]] = {}
    for task in tasks:
      settings = preset_settings(protocol, task, attention)
      if settings is not None:
        groups.setdefault(_format_settings(settings), []).append(TASK_TITLES.get(task, task))
    ran = "; ".join(f"{', '.join(names)}: {text}" for text, names in groups.items())
    same, differs = published_settings(protocol, attention)
    name = row_name(attention)
    row = ("" if name is None else
           f" Published row \"{name}\": {'same settings' if same else 'different settings — ' + differs}.")
    if row or any(text != _format_settings({}) for text in groups):
      notes.append(f"`{attention}` under `{protocol}` ran {ran or 'nothing (no task config)'}.{row}")
  if protocol in ("lra", "combiner") and attentions:
    notes.append("Where LRA's code differs from its paper, `lra` runs the code as LRA ran it: Sinkhorn's sort "
                 "was a no-op (`lra_noop_sort`: every sorted block sums all blocks, two softmaxes added), "
                 "Reformer multiplied its logits by √D (`lra_sqrt_d_quirk`), the Sparse Transformer was causal "
                 "with a CLS row and column of ones (`causal`, `cls_token`); `smoke` and the cores' defaults "
                 "are the papers' forms (docs/lra_protocol.md §7).")
  return notes


def comparable(protocol: str) -> bool:
  """Whether ``protocol`` runs the recipe of published rows: LRA Table 1's (``COMPARABLE``) or its own
  paper's (``OWN_PUBLISHED``)."""
  return protocol in COMPARABLE or protocol in OWN_PUBLISHED


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
  """(published accuracy %, source) for one cell; ``task="avg"`` for the average column.

  ``reference``: LRA Table 1's frame (``load_reference``), or a protocol's own published rows
  (``own_reference``: they carry an ``attention`` column, and every row is comparable)."""
  column = REFERENCE_COLUMN.get(task, task)
  if is_own(reference):
    row = _own_row(reference, attention)
    return (None, None) if row is None or column not in row else (number(row[column]), row["source"])
  model = "Chance" if attention == "__chance__" else paper_name(attention)
  if model is None or reference.empty:
    return None, None
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
                  "Performer (256)": "performer", "S4D-LegS": "s4d", "S5": "s5", "LRU": "lru", "Mega": "mega",
                  "Mega-chunk": "mega_chunk", "Self-Attention": "vanilla", "Kernelized Attention": "kernelized",
                  "Linformer": "linformer", "Informer": "informer", "Performer": "performer", "Reformer": "reformer",
                  "BigBird": "bigbird"}


# Which of our protocols reproduces a follow-up source's setup (its per-model settings in configs/).
FOLLOWUP_PROTOCOLS = {"xiong_2021_table3": "xiong"}
# The sequence models' rows: their recipe is a protocol of ours whichever paper printed the row.
FOLLOWUP_MODEL_PROTOCOLS = {"s4d": "s4", "s5": "s5", "lru": "lru", "mega": "mega", "mega_chunk": "mega"}


def row_protocol(source: str, model: str) -> str | None:
  """The protocol of ours that runs the recipe of a follow-up row (``FOLLOWUP_PROTOCOLS`` for a whole
  source, ``FOLLOWUP_MODEL_PROTOCOLS`` for a sequence model's row), or None."""
  return FOLLOWUP_PROTOCOLS.get(source) or FOLLOWUP_MODEL_PROTOCOLS.get(FOLLOWUP_NAMES.get(model, ""))


# The protocols whose own paper(s) published rows (the follow-up rows they reproduce): their accuracy
# tables put those rows beside the cells, with deltas, as ``lra`` does with LRA Table 1.
OWN_PUBLISHED = frozenset(FOLLOWUP_PROTOCOLS.values()) | frozenset(FOLLOWUP_MODEL_PROTOCOLS.values())


def own_reference(followups: pd.DataFrame, protocol: str) -> pd.DataFrame:
  """The follow-up rows published under ``protocol``'s recipe (``published_row_protocol``) that are one of
  our layers (``row_attention``), one per attention, with the columns ``attention`` (ours) and ``avg`` (the
  average over five tasks); empty when none."""
  if followups.empty:
    return pd.DataFrame(columns=["source", "model", "attention"])
  ours = {protocol, published_protocol(protocol)}
  attention = [row_attention(r) if published_row_protocol(r) in ours else None for _, r in followups.iterrows()]
  mine = followups[[a is not None for a in attention]].copy()
  mine["attention"] = [a for a in attention if a is not None]
  mine["avg"] = mine["avg5"] if "avg5" in mine else ""
  return mine.drop_duplicates("attention").reset_index(drop=True)


def own_published(followups: pd.DataFrame, protocol: str) -> bool:
  """Whether ``protocol`` runs the recipe of published rows of ours: ``OWN_PUBLISHED`` (the follow-ups'
  protocols), or a modern layer's row whose ``protocol`` is ``protocol``'s own or its ``PUBLISHED_PROTOCOL``
  (none today: their recipes are not protocols of ours)."""
  return protocol in OWN_PUBLISHED or not own_reference(followups, protocol).empty


def is_own(reference: pd.DataFrame) -> bool:
  """Whether ``reference`` is a protocol's own published rows (``own_reference``), not LRA Table 1's."""
  return "attention" in reference


def _own_row(reference: pd.DataFrame, attention: str) -> pd.Series | None:
  rows = reference[reference["attention"] == attention]
  return None if rows.empty else rows.iloc[0]


def published_model(reference: pd.DataFrame, attention: str) -> str | None:
  """The model name of ``attention``'s published row in ``reference`` (a protocol's own rows), else its
  LRA / Combiner paper name."""
  if is_own(reference):
    row = _own_row(reference, attention)
    return None if row is None else row["model"]
  return paper_name(attention)


def followup_settings(source: str, attention: str | None) -> str:
  """The follow-up table's "Our settings" cell: whether our protocol for that source runs the row's
  per-model settings ("same (`xiong`)"), what differs, or "—" (no protocol of ours reproduces it; so
  every modern layer's row, whose recipe is its paper's own)."""
  if source in MODERN_SOURCES:
    return "—"
  protocol = FOLLOWUP_PROTOCOLS.get(source) or FOLLOWUP_MODEL_PROTOCOLS.get(attention or "")
  if protocol is None or attention is None:
    return "—"
  same, differs = preset_match(protocol, attention)
  return f"same (`{protocol}`)" if same else f"differs (`{protocol}`): {differs}"


def load_followups(reference_dir: str | None = None) -> pd.DataFrame:
  """The rows of ``lra_followups_accuracy.csv`` (columns source, protocol, model, the tasks, avg5), then
  those of ``modern_layers_accuracy.csv`` (``load_modern``; they add ``avg_paper`` and ``note``, empty in
  the others' rows). Column ``file`` names the file of each row."""
  path = os.path.join(reference_dir or DEFAULT_REFERENCE_DIR, FOLLOWUPS_FILE)
  frames = [pd.read_csv(path, dtype=str, keep_default_na=False).assign(file=FOLLOWUPS_FILE)
            if os.path.exists(path) else pd.DataFrame(columns=["source", "protocol", "model", "file"])]
  modern = load_modern(reference_dir)
  if not modern.empty:
    frames.append(modern.assign(file=MODERN_FILE))
  return pd.concat(frames, ignore_index=True).fillna("")


# The modern recurrent layers' published LRA rows: each paper under its own recipe, named in the row's
# ``protocol`` (``xlstm_table6``, ``rwkv``, ``hgrn``, ``hgrn2``, ``lion``). A row sits beside our runs only
# under the same protocol (``published_row_protocol``): none of these recipes is a protocol of ours, so today
# they are listed with the follow-ups as published under other protocols, never ranked with ours.
MODERN_FILE = "modern_layers_accuracy.csv"
MODERN_COLUMNS = ["source", "protocol", "model", *[REFERENCE_COLUMN.get(t, t) for t in TASK_ORDER], "avg5",
                  "avg_paper", "note"]
MODERN_SOURCES = frozenset({"xlstm_2024_table6", "rwkv_2023_table4", "hgrn_2023", "hgrn2_2024_lra",
                            "lion_2025_table7", "lion_2025_table5"})

# A published model name -> the ``paper_name`` values a config of the same layer may declare (by default the
# published name itself). ``published_layer`` maps a row to the registered layer that declares one of them.
SAME_LAYER = {
    "Mamba2": ("Mamba-2",),
    "GDN": ("Gated DeltaNet",),
    # mLSTM blocks only: the layer of ``mlstm`` (whose config may name the xLSTM row it is part of)
    "xLSTM[1:0]": ("mLSTM", "xLSTM[1:0]", "xLSTM"),
    "Hawk": ("Hawk", "RG-LRU"),
}
# Published models that are none of our layers, whatever a config declares: context rows only.
NOT_OUR_LAYER = {
    "RWKV": "the RWKV paper's model is RWKV-4 (vector decay with a bonus, no matrix state); ours are RWKV-6/7",
    "RWKV-4": "RWKV-4 (vector decay with a bonus, no matrix state); ours are RWKV-6/7",
    "xLSTM": "the best of xLSTM[1:0] (mLSTM) and xLSTM[0:1] (sLSTM) per task: two layers",
    "xLSTM[0:1]": "sLSTM blocks only (scalar memory with memory mixing); ours is the mLSTM layer",
    "Griffin": "RG-LRU blocks interleaved with local attention (a hybrid); ``rg_lru`` is the recurrent block",
    "HGRN": "HGRN1's elementwise complex recurrence; ours is HGRN2's state-expanded (GLA-form) layer",
    "Llama": "a Llama-style Transformer (rotary, SwiGLU, RMSNorm), not our encoder's attention block",
    "LSTM": "an LSTM layer: none here",
    "LSTM (Block)": "an LSTM in a post up-projection block: none here",
    "LION-S": "LION's bidirectional linear attention with selective decay: not one of our layers",
    "LION-D": "LION's bidirectional linear attention with a fixed decay (RetNet's): not our retnet layer",
    "LION-LIT": "LION's bidirectional linear attention without decay: not one of our layers",
    "LION-S (w/o HiPPO)": "LION-S with random decay init: not one of our layers",
    "LION-D (w/o HiPPO)": "LION-D with random decay init: not one of our layers",
}


def _load(name: str, columns: list[str], reference_dir: str | None) -> pd.DataFrame:
  """``published/<name>`` (or ``reference_dir``'s) as text, empty where the paper has no number; an empty frame
  with ``columns`` if the file is missing."""
  path = os.path.join(reference_dir or DEFAULT_REFERENCE_DIR, name)
  if not os.path.exists(path):
    return pd.DataFrame(columns=columns)
  return pd.read_csv(path, dtype=str, keep_default_na=False)


def load_modern(reference_dir: str | None = None) -> pd.DataFrame:
  """The rows of ``modern_layers_accuracy.csv`` (columns ``MODERN_COLUMNS``; text, empty where the paper has
  no number); an empty frame if the file is missing."""
  return _load(MODERN_FILE, MODERN_COLUMNS, reference_dir)


def published_layer(model: str) -> str | None:
  """The registered layer that is the published ``model``'s layer: the one whose config declares a
  ``paper_name`` in ``SAME_LAYER[model]`` (by default ``model`` itself); None for a model that is none of
  ours (``NOT_OUR_LAYER``) or whose layer is not registered here."""
  if model in NOT_OUR_LAYER:
    return None
  names = SAME_LAYER.get(model, (model,))
  for name in attention_zoo.list_layers():
    try:
      declared = attention_zoo.layer_config(name).paper_name
    except (ValueError, TypeError):  # a layer whose config cannot be built with its defaults
      continue
    if declared in names:
      return name
  return None


def _is_modern(row: Any) -> bool:
  return row.get("file", "") == MODERN_FILE or row.get("source", "") in MODERN_SOURCES


def row_attention(row: Any) -> str | None:
  """Our layer of a follow-up row (a mapping with ``source``, ``model``): ``FOLLOWUP_NAMES`` for the
  follow-ups, ``published_layer`` (the configs' ``paper_name``) for a modern layer's row; None: not ours."""
  return published_layer(row["model"]) if _is_modern(row) else FOLLOWUP_NAMES.get(row["model"])


def published_protocol(protocol: str) -> str:
  """The protocol whose published rows sit beside ``protocol``'s runs: its module's ``PUBLISHED_PROTOCOL``
  (e.g. ``recall_cpu`` -> ``zoology``), else itself."""
  module = protocol_module(protocol)
  return getattr(module, "PUBLISHED_PROTOCOL", protocol) if module is not None else protocol


def published_row_protocol(row: Any) -> str | None:
  """The protocol whose recipe made a follow-up row: ``row_protocol`` for the follow-ups (a protocol of
  ours), the row's own ``protocol`` (its paper's recipe) for a modern layer's row."""
  return row["protocol"] if _is_modern(row) else row_protocol(row["source"], row["model"])


# Self-pretraining (Amos, Berant & Gupta, ICLR 2024): the paper's Transformer from scratch and after SPT.
SPT_FILE = "spt_accuracy.csv"
SPT_COLUMNS = ["source", "protocol", "model", "pretraining", *[REFERENCE_COLUMN.get(t, t) for t in TASK_ORDER],
               "avg", "note"]


def load_spt_reference(reference_dir: str | None = None) -> pd.DataFrame:
  """The rows of ``spt_accuracy.csv`` (columns ``SPT_COLUMNS``; text, empty where the paper has no
  number); an empty frame if the file is missing."""
  return _load(SPT_FILE, SPT_COLUMNS, reference_dir)


# The published anchors of the efficiency report (``report.efficiency``): FlashAttention-2's and -3's
# achieved TFLOP/s, fla's op timings, and the devices' peak FLOP/s (``published/README.md``).
FLASH_FILE = "flash_attention_tflops.csv"
FLASH_COLUMNS = ["source", "hardware", "setup", "implementation", "direction", "causal", "head_dim", "seq_len",
                 "tflops", "note"]
FLA_FILE = "fla_op_timings.csv"
FLA_COLUMNS = ["source", "hardware", "software", "op", "direction", "causal", "batch", "seq_len", "heads",
               "head_dim", "ms", "note"]
PEAK_FILE = "device_peak_flops.csv"
PEAK_COLUMNS = ["device_kind", "compute", "peak_tflops", "source", "note"]
# fla's op -> our registered layer of the same recurrence (fla's ops are causal chunked kernels; ours run
# bidirectional in the LRA encoder unless a protocol says otherwise).
FLA_LAYERS = {"chunk_retention": "retnet", "chunk_gla": "gla", "chunk_gdn": "gated_deltanet", "flash_attn": "flash"}
# Where each source's numbers were read (the CSVs' ``source`` column).
ANCHOR_SOURCES = {
    "dao_2023_fa2_fig4": "Dao, \"FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning\" "
                         "(arXiv 2307.08691, 2023), Fig. 4",
    "shah_2024_fa3_sec4_1": "Shah et al., \"FlashAttention-3: Fast and Accurate Attention with Asynchrony and "
                            "Low-precision\" (arXiv 2407.08608, 2024), §4.1",
    "fla_readme_benchmarks": "fla-org/flash-linear-attention README, \"Benchmarks\" (commit 01c4202)",
    "nvidia_h100_datasheet": "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)",
    "nvidia_h200_datasheet": "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)",
    "nvidia_a100_datasheet": "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)",
}


def load_flash_reference(reference_dir: str | None = None) -> pd.DataFrame:
  """``flash_attention_tflops.csv`` as text (``FLASH_COLUMNS``; ``tflops`` empty = not given, ``OOM``)."""
  return _load(FLASH_FILE, FLASH_COLUMNS, reference_dir)


def load_fla_reference(reference_dir: str | None = None) -> pd.DataFrame:
  """``fla_op_timings.csv`` as text (``FLA_COLUMNS``: one row per op, shape and direction, in ms)."""
  return _load(FLA_FILE, FLA_COLUMNS, reference_dir)


def load_device_peaks(reference_dir: str | None = None) -> pd.DataFrame:
  """``device_peak_flops.csv`` as text (``PEAK_COLUMNS``): dense peak TFLOP/s per device kind (the exact
  ``jax.Device.device_kind`` string) and compute (``bfloat16``, ``tf32``, ``float32``)."""
  return _load(PEAK_FILE, PEAK_COLUMNS, reference_dir)
