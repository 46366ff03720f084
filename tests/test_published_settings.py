"""The report calls a published row "the same model" only where the protocol ran the original's settings
(``configs/<protocol>.py`` ``PUBLISHED_DIFFERENCES``), marks the others with what differs, and its protocol
notes list the per-core settings each protocol ran."""

from lra_bench.report import accuracy, reference
from tests.test_report import REFERENCE, train_record

RECORDS = [train_record("vanilla", "listops", 0, 0.36), train_record("performer", "listops", 0, 0.20),
           train_record("bigbird", "image", 0, 0.40), train_record("combiner_axial_vertical", "listops", 0, 0.3),
           train_record("combiner_fixed", "listops", 0, 0.3), train_record("nystromformer", "listops", 0, 0.3)]


def test_same_settings_only_where_the_preset_is_the_originals():
  assert reference.published_settings("lra", "vanilla") == (True, "")
  assert reference.published_settings("lra", "performer") == (True, "")
  assert reference.published_settings("lra", "sparse_fixed") == (True, "")
  same, why = reference.published_settings("lra", "bigbird")
  assert not same and "num_head" in why
  for axial in ("combiner_axial_vertical", "combiner_axial_horizontal", "combiner_axial_rowmajor"):
    same, why = reference.published_settings("combiner", axial)
    assert not same and "unknown" in why
  same, why = reference.published_settings("lra", "combiner_fixed")
  assert not same and "not released" in why
  # a protocol that is not the paper's never runs the paper's model
  assert reference.published_settings("smoke", "vanilla")[0] is False
  # ``xiong`` is Xiong et al.'s recipe: its rows are theirs (Table 3), where the presets are the originals'
  assert reference.published_settings("xiong", "vanilla") == (True, "")
  assert reference.published_settings("xiong", "bigbird")[0] is False


def test_published_table_marks_each_row_and_lists_the_settings_that_ran():
  rep = accuracy.accuracy_report(RECORDS, "lra", REFERENCE)
  column = rep.published.columns.index("Settings")
  marks = {r[1]: r[column] for r in rep.published.rows}
  expected = {"vanilla": "same", "performer": "same", "bigbird": "differs", "reformer": "differs",
              "combiner_axial_vertical": "differs", "combiner_fixed": "differs", "sinkhorn": "same"}
  assert {a: marks[a] for a in expected} == expected
  assert "same models" not in rep.published.caption
  notes = "\n".join(rep.published.notes)
  assert "`performer` under `lra` ran ListOps: kernel=softmax, nb_features=2" in notes
  assert "Image: block_size=64, num_rand_blocks=3, rand_block_span=1024" in notes
  assert 'Published row "Combiner-Axial": different settings — which axial variant' in notes
  assert "lra_noop_sort" in notes and "lra_sqrt_d_quirk" in notes   # code-as-run forms are named


def test_smoke_report_marks_every_row_different():
  rep = accuracy.accuracy_report([train_record("vanilla", "listops", 0, 0.1, protocol="smoke")], "smoke",
                                 REFERENCE)
  column = rep.published.columns.index("Settings")
  assert rep.published.rows and {r[column] for r in rep.published.rows} == {"differs"}


def test_followups_say_whether_our_xiong_runs_are_the_same_model():
  table = accuracy.followups_table(reference.load_followups())
  source = table.columns.index("Source")
  ours = {(r[0], r[source]): r[-1] for r in table.rows}
  xiong = {model: cell for (model, src), cell in ours.items() if src == "xiong_2021_table3"}
  assert xiong["Standard"] == "same (`xiong`)" and xiong["Nystromformer"] == "same (`xiong`)"
  assert xiong["Linformer (k=256)"] == "same (`xiong`)"
  # reports/cpu_xiong_listops traces these two rows' deltas to details of Xiong et al.'s calls the preset does
  # not copy (padded keys and the batch-wide stabilizer of performer_pytorch; padding in transformers' buckets)
  assert xiong["Performer (256)"].startswith("differs (`xiong`)") and "stabilizer" in xiong["Performer (256)"]
  assert xiong["Reformer (2 hashes)"].startswith("differs (`xiong`)")
  assert ours["FNet", "s4_paper_table4"] == "—"
  # Skyformer's rows (the same 2 x 64 model, 50 000 steps, 128 features): no protocol of ours runs them
  assert ours["Nystromformer", "chen_2021_skyformer"] == "—" and ours["Performer", "chen_2021_skyformer"] == "—"
