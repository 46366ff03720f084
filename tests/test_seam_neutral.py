"""The layer seam (one registry, one factory, one kit) and the objective seam (one module per objective) moved
nothing they should not have: the fingerprints of a fixed set of cells (``tests/seam_fingerprint.py``: config
hash, parameter tree, initial parameter sums, three train steps' loss / accuracy / gradient norm; for the
self-pretraining cells also the pretraining config's hash, one evaluation's sums and what the classifier takes
from the pretrained parameters) equal those pinned from the commit before each seam was cut; and the two bugs the
forked layer seam had are gone."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

import attention_zoo
from attention_zoo import registry
from tests import seam_fingerprint

ROOT = pathlib.Path(__file__).resolve().parents[1]
PINNED = {cell["cell"]: cell for cell in json.loads((ROOT / "tests/data/seam_fingerprints.json").read_text())}


def _assert_unchanged(now: dict) -> dict:
  before = PINNED[now["cell"]]
  assert now["config_hash"] == before["config_hash"]
  assert now["params"] == before["params"]
  assert (now["param_sum"], now["param_sq"]) == pytest.approx((before["param_sum"], before["param_sq"]), rel=1e-6)
  for got, want in zip(now["steps"], before["steps"], strict=True):
    assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
  return before


@pytest.mark.parametrize("cell", seam_fingerprint.CELLS, ids=lambda c: "/".join(c[:3]))
def test_cell_fingerprint_is_unchanged(cell):
  _assert_unchanged(seam_fingerprint.fingerprint(*cell))


@pytest.mark.parametrize("cell", seam_fingerprint.PRETRAIN_CELLS, ids=lambda c: "/".join((*c[:3], c[3][0])))
def test_pretraining_cell_fingerprint_is_unchanged(cell):
  """The pretraining objectives' models, batch transforms (masks keyed by the example's index; the next-pixel
  shift) and terms (cross-entropy over tokens; L1 on float pixels) are those the ``stage`` string picked."""
  now = seam_fingerprint.pretrain_fingerprint(*cell)
  before = _assert_unchanged(now)
  assert now["pretrain_config_hash"] == before["pretrain_config_hash"]
  assert now["eval"] == pytest.approx(before["eval"], rel=1e-4, abs=1e-5)
  assert (now["taken"], now["kept"]) == (before["taken"], before["kept"])


def test_mixers_are_reported_in_their_own_family():
  """Was "other": the efficiency tables asked the attention registry only."""
  from lra_bench.report import efficiency

  record = {"kind": "bench", "attention": "s5", "max_length": 256, "status": "ok", "task": "text",
            "protocol": "bench", "seed": 0, "config": {}}
  assert efficiency.bench_frame([record])["family"].tolist() == ["ssm"]
  assert attention_zoo.layer_family("mega") == "gated-ema"
  assert registry.FAMILIES.index("ssm") < registry.FAMILIES.index("other")


def test_the_kind_question_is_asked_in_two_places():
  """Outside the registry (where kinds are defined), only the model's factory and the kit's dispatch ask
  which kind a layer is; records store it (``results.layer_kind``) without branching on it."""
  asked = []
  for path in sorted((ROOT / "lra_bench").rglob("*.py")) + sorted((ROOT / "configs").rglob("*.py")):
    for number, line in enumerate(path.read_text().splitlines(), 1):
      if re.search(r"layer_kind\(|is_mixer\(|list_mixers\(\)|mixer_config\(|create_mixer\(", line):
        asked.append(f"{path.relative_to(ROOT)}:{number}")
  places = {entry.split(":")[0] for entry in asked}
  assert places <= {"lra_bench/training/models.py", "lra_bench/testing.py", "lra_bench/experiments/results.py",
                    "lra_bench/cli.py"}, asked
  assert sum(entry.startswith(("lra_bench/training/models.py", "lra_bench/testing.py")) for entry in asked) == 2
