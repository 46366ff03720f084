"""reports/ holds curated studies in one layout (docs/results.md, "The layout of reports/"): each folder has
README.md (the commands), results/ (the records) and, where there are records, report/ (what `lra-bench
report` writes from them); a parked run's archive only in parked/, named by the study's README; no code; a
heatmap only in a report whose study is about the patterns; and every relative link of a study's README
resolves."""

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORTS = os.path.join(REPO, "reports")
TOP = {"README.md", "results", "report", "parked"}
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")
CODE = (".py", ".sh", ".ipynb")
# Folders exempt from the heatmap and loose-file rules while a run writes into them (none now): a study's
# heatmap and loose logs move when its run ends, and the study leaves this set.
PENDING: set[str] = set()


def _is_study(path: str) -> bool:
  return os.path.isfile(os.path.join(path, "README.md")) and os.path.isdir(os.path.join(path, "results"))


def _studies() -> list[str]:
  """Every study folder, as a path relative to reports/ (a study may hold narrower studies of its own)."""
  found = []

  def walk(rel: str) -> None:
    found.append(rel)
    for name in sorted(os.listdir(os.path.join(REPORTS, rel))):
      if name not in TOP and _is_study(os.path.join(REPORTS, rel, name)):
        walk(f"{rel}/{name}")

  for name in sorted(os.listdir(REPORTS)):
    walk(name)
  return found


STUDIES = _studies()


def _files(rel: str) -> list[str]:
  """The files of a study (its nested studies apart), relative to it."""
  top = os.path.join(REPORTS, rel)
  nested = {os.path.join(REPORTS, s) for s in STUDIES if s.startswith(rel + "/")}
  out = []
  for root, dirs, files in os.walk(top):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in nested]
    out += [os.path.relpath(os.path.join(root, f), top) for f in files]
  return out


def test_there_are_studies():
  assert len(STUDIES) > 5 and "example_cpu" in STUDIES, STUDIES


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_has_the_one_layout(study):
  path = os.path.join(REPORTS, study)
  assert _is_study(path), f"reports/{study}: needs README.md (the commands) and results/ (the records)"
  nested = {s.split("/")[-1] for s in STUDIES if s.rsplit("/", 1)[0] == study and s != study}
  extra = sorted(set(os.listdir(path)) - TOP - nested - ({f for f in os.listdir(path) if f.endswith(".txt")}
                                                          if study in PENDING else set()))
  assert not extra, f"reports/{study}: {extra} belong in results/ (records, logs) or report/ (lra-bench report)"
  has_records = os.path.isfile(os.path.join(path, "results", "results.jsonl"))
  has_report = os.path.isfile(os.path.join(path, "report", "index.md"))
  assert has_records == has_report, (f"reports/{study}: report/ is `lra-bench report --results_dir "
                                     f"reports/{study}/results --out reports/{study}/report`; it exists iff "
                                     "results/results.jsonl does")


@pytest.mark.parametrize("study", STUDIES)
def test_no_code_and_archives_only_for_parked_runs(study):
  readme = open(os.path.join(REPORTS, study, "README.md"), encoding="utf-8").read()
  for rel in _files(study):
    assert not rel.endswith(CODE), f"reports/{study}/{rel}: a study's script lives in scripts/"
    if rel.endswith(ARCHIVES):
      assert os.path.dirname(rel) == "parked", f"reports/{study}/{rel}: an archive only in parked/ (docs/cluster.md)"
      assert os.path.basename(rel) in readme, (f"reports/{study}/{rel}: the README does not name this parked "
                                               "run; a finished or abandoned run's archive is deleted")


@pytest.mark.parametrize("study", STUDIES)
def test_a_heatmap_only_where_the_study_is_about_the_patterns(study):
  heatmaps = [rel for rel in _files(study) if os.path.basename(rel).startswith("attention_patterns.")]
  if not heatmaps or study in PENDING:
    return
  readme = open(os.path.join(REPORTS, study, "README.md"), encoding="utf-8").read()
  assert "attention_patterns" in readme and "--patterns" in readme, (
      f"reports/{study}: {heatmaps} in a study whose README neither discusses the patterns nor asks for them "
      "(--patterns); delete them and the index.md section, or regenerate the report without --patterns")


@pytest.mark.parametrize("study", STUDIES)
def test_every_relative_link_of_a_study_readme_resolves(study):
  page = os.path.join(REPORTS, study, "README.md")
  text = re.sub(r"^```.*?^```", "", open(page, encoding="utf-8").read(), flags=re.M | re.S)
  text = re.sub(r"`[^`\n]*`", "", text)
  bad = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    path = target.partition("#")[0]
    if not path or re.match(r"[a-z]+:", path):
      continue
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path))
    if os.path.relpath(resolved, REPO).startswith(os.pardir) or not os.path.exists(resolved):
      bad.append(target)
  assert not bad, f"reports/{study}/README.md: links that do not resolve: {bad}"


# An absolute path of the machine that made a report, in backquotes or after `--flag ` (a report names its files
# relative to where `lra-bench report` ran; docs/results.md).
MACHINE_PATH = re.compile(r"(?:`|--\w+[ =])/(?:work|tmp|root|home|Users|mnt|scratch)/")


@pytest.mark.parametrize("study", STUDIES)
def test_a_report_names_no_path_of_the_machine_that_made_it(study):
  found = []
  for rel in _files(study):
    if rel.startswith("report" + os.sep) and rel.endswith(".md"):
      with open(os.path.join(REPORTS, study, rel), encoding="utf-8") as f:
        found += [f"{rel}:{n}" for n, line in enumerate(f, 1) if MACHINE_PATH.search(line)]
  assert not found, found
