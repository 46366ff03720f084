"""ListOps: generator semantics and format, reader validation, tokenizer determinism, batch shapes."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

import tasks
from tasks import listops
from tests.task_batches import dataset


@pytest.mark.parametrize("tree, label", [
    (("[MIN", [3, 7, 1]), 1),
    (("[MAX", [3, 7, 1]), 7),
    (("[MED", [1, 2, 3, 4]), 2),          # even count: mean of the middle two (2.5) truncated
    (("[MED", [9, 8, 1, 0]), 4),          # sorted 0 1 8 9 -> 4.5 -> 4
    (("[MED", [5, 1, 9]), 5),
    (("[SM", [9, 8, 7]), 4),              # 24 mod 10
    (("[MAX", [("[MIN", [4, 6]), ("[SM", [5, 6]), 2]), 4),  # MAX(4, 1, 2)
    (("[MED", [("[MAX", [1, 9]), 0, ("[SM", [3, 3])]), 6),  # MED(9, 0, 6)
])
def test_labels_by_hand(tree, label):
  assert listops.evaluate(tree) == label


def test_serialisation_matches_the_lra_form():
  assert listops.to_source(("[MAX", [2, 9])) == "( ( ( [MAX 2 ) 9 ) ] )"
  nested = listops.to_source(("[MIN", [("[SM", [1, 2]), 3]))
  assert nested == "( ( ( [MIN ( ( ( [SM 1 ) 2 ) ] ) ) 3 ) ] )"
  assert listops.num_tokens(nested) == 7  # [MIN [SM 1 2 ] 3 ]


def test_tree_lengths_count_tokens_without_parentheses():
  rng = random.Random(3)
  for _ in range(200):
    tree, length = listops.generate_tree(rng)
    assert listops.num_tokens(listops.to_source(tree)) == length


def test_generator_is_seeded_filtered_and_deduplicated():
  a = listops.generate(60, seed=7, min_length=10, max_expression_length=40, progress=False)
  b = listops.generate(60, seed=7, min_length=10, max_expression_length=40, progress=False)
  c = listops.generate(60, seed=8, min_length=10, max_expression_length=40, progress=False)
  assert a == b and a != c
  assert len({s for s, _ in a}) == 60
  assert all(10 < listops.num_tokens(s) < 40 for s, _ in a)
  assert all(0 <= y <= 9 for _, y in a)


def test_prepare_writes_the_release_format(tmp_path):
  root = str(tmp_path)
  task = tasks.get_task("listops")
  out = task.prepare(root, num_train=20, num_val=5, num_test=5, min_length=10, max_expression_length=50,
                     progress=False)
  assert out == os.path.join(root, "listops-1000")
  raw = open(os.path.join(out, "basic_train.tsv"), "rb").read()
  assert raw.startswith(b"Source\tTarget\r\n") and raw.count(b"\r\n") == 21
  for split, n in (("train", 20), ("val", 5), ("test", 5)):
    sources, labels = listops.read_tsv(os.path.join(out, f"basic_{split}.tsv"))
    assert len(sources) == n
  all_sources = [s for split in ("train", "val", "test")
                 for s in listops.read_tsv(os.path.join(out, f"basic_{split}.tsv"))[0]]
  assert len(set(all_sources)) == 30  # splits are disjoint
  mtime = os.path.getmtime(os.path.join(out, "basic_train.tsv"))
  task.prepare(root, num_train=20, num_val=5, num_test=5, min_length=10, max_expression_length=50,
               progress=False)
  assert os.path.getmtime(os.path.join(out, "basic_train.tsv")) == mtime  # idempotent
  with pytest.raises(tasks.DataError, match="other options"):
    task.prepare(root, num_train=21, num_val=5, num_test=5, min_length=10, max_expression_length=50,
                 progress=False)


def test_vocabulary_is_fixed():
  assert listops.VOCAB_SIZE == 17
  ids = listops.tokenize(["( ( ( [MAX 2 ) 9 ) ] )"], 8)[0]
  assert ids.tolist() == [2, 8, 15, 5, 0, 0, 0, 0]  # [MAX=2, '2'=8, '9'=15, X=5, pad


def test_tokenizer_ids_identical_across_processes():
  code = ("from tasks import listops; "
          "print(listops.tokenize(['( ( ( [MED 3 ) ( ( ( [SM 1 ) 0 ) ] ) ) ] )', '( ( [MIN 4 ) ] )'], 12).tolist())")
  outputs = set()
  for hash_seed in ("1", "12345"):
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(__file__)), check=True)
    outputs.add(proc.stdout.strip().splitlines()[-1])
  assert len(outputs) == 1, outputs


def _write(path, text):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", newline="") as f:
    f.write(text)


def test_reads_official_release_lines_with_lf(tmp_path):
  path = str(tmp_path / "listops-1000" / "basic_val.tsv")
  _write(path, "Source\tTarget\n( ( ( [MAX 2 ) 9 ) ] )\t9\n( ( [SM 4 ) ] )\t4\n")
  assert listops.read_tsv(path) == (["( ( ( [MAX 2 ) 9 ) ] )", "( ( [SM 4 ) ] )"], [9, 4])


@pytest.mark.parametrize("body, message", [
    ("( ( [SM 4 ) ] )\t4\n( ( [SM 4 ) ] )\n", r"basic_val.tsv:3: expected 2 tab-separated columns"),
    ("( ( [SM 4 ) ] )\t12\n", r"basic_val.tsv:2: Target 12 is outside 0..9"),
    ("( ( [SM 4 ) ] )\tfour\n", r"basic_val.tsv:2: Target 'four' is not an integer"),
    # tokens outside the vocabulary (they used to become the OOV id without a word)
    ("( ( [SM 4 ) ] )\t4\n( ( [SUM 4 ) ] )\t4\n", r"basic_val.tsv:3: Source token '\[SUM' is not in"),
    ("( ( [MAX 12 ) ] )\t2\n", r"basic_val.tsv:2: Source token '12' is not in"),
    ("( ( [MIN 4 ) X )\t4\n", r"basic_val.tsv:2: Source token 'X' is not in"),
    ("( ( [MIN 4(5 ) ] )\t4\n", r"basic_val.tsv:2: Source token '45' is not in"),
])
def test_malformed_lines_name_file_and_line(tmp_path, body, message):
  path = str(tmp_path / "listops-1000" / "basic_val.tsv")
  _write(path, "Source\tTarget\r\n" + body)
  with pytest.raises(tasks.DataError, match=message):
    listops.read_tsv(path)


def test_missing_data_names_path_and_command(tmp_path):
  with pytest.raises(tasks.MissingDataError) as err:
    dataset(tasks.get_task("listops"), str(tmp_path), "train", 4)
  text = str(err.value)
  assert os.path.join(str(tmp_path), "listops-1000", "basic_train.tsv") in text
  assert "lra-bench data prepare listops" in text


def test_long_sequences_are_truncated_and_counted(tmp_path):
  path = str(tmp_path / "listops-1000" / "basic_test.tsv")
  long_source = listops.to_source(("[SM", list(range(10))))  # 12 tokens
  _write(path, f"Source\tTarget\n{long_source}\t5\n( ( [SM 4 ) ] )\t4\n")
  ex = tasks.get_task("listops").examples(str(tmp_path), "test", max_length=8)
  assert (ex.num_examples, ex.num_truncated) == (2, 1)
  first = next(iter(ex.dataset))["inputs"].numpy()
  assert first.shape == (8,) and np.all(first > 0)


def test_batch_shapes_per_split(listops_dir):
  task = tasks.get_task("listops")
  train = dataset(task, listops_dir, "train", 8, max_length=64, seed=0, repeat=True, name="tiny")
  batch = next(iter(train))
  assert batch["inputs"].shape == (8, 64) and batch["inputs"].dtype.name == "int32"
  assert batch["targets"].shape == (8,) and batch["targets"].dtype.name == "int32"
  test_batches = list(dataset(task, listops_dir, "test", 8, max_length=64, name="tiny"))
  assert [b["inputs"].shape[0] for b in test_batches] == [8, 8, 8, 8, 5]  # 37 examples, none dropped
  again = next(iter(dataset(task, listops_dir, "train", 8, max_length=64, seed=0, repeat=True, name="tiny")))
  np.testing.assert_array_equal(batch["inputs"].numpy(), again["inputs"].numpy())  # seeded order


def test_batches_run_without_the_autotuner_that_stalls_iterator_teardown(listops_dir):
  # tf.data's model-based autotuner sleeps in periods growing to ~10 s, and destroying a training iterator
  # that ran that long waited for the sleep: 10 s at the end of every cell (a quarter of a cpu ListOps
  # cell). Every batched pipeline, training and evaluation, turns it off and stays deterministic.
  task = tasks.get_task("listops")
  for split, repeat in (("train", True), ("test", False)):
    options = dataset(task, listops_dir, split, 8, max_length=64, repeat=repeat, name="tiny").options()
    assert options.autotune.enabled is False and options.deterministic is True


def test_every_generated_token_is_in_the_vocabulary():
  sources = [source for source, _ in listops.generate(40, seed=3, min_length=10, max_expression_length=80,
                                                      progress=False)]
  for lineno, source in enumerate(sources, start=2):
    listops.check_tokens(source, "generated", lineno)  # raises on any token the tokenizer would map to OOV
  assert (listops.tokenize(sources, 80) != listops.OOV_ID).all()


@pytest.mark.parametrize("options, message", [
    (dict(num_train=-5), r"--num_train is -5; it must be >= 1"),
    (dict(num_val=-1), r"--num_val is -1"),
    (dict(num_val=0), r"--num_val is 0; it must be >= 1"),
    (dict(num_test=2.5), r"--num_test must be an integer >= 1, got 2.5"),
    (dict(num_train=True), r"--num_train must be an integer"),
    (dict(min_length=-1), r"--min_length is -1"),
    (dict(max_expression_length=1), r"--max_expression_length is 1; it must be >= 2"),
    (dict(min_length=50, max_expression_length=50), r"--min_length 50 must be below --max_expression_length 50"),
])
def test_prepare_refuses_bad_counts_before_writing(tmp_path, options, message):
  base = dict(num_train=4, num_val=2, num_test=2, min_length=10, max_expression_length=40, progress=False)
  with pytest.raises(tasks.DataError, match=message):
    tasks.get_task("listops").prepare(str(tmp_path), **{**base, **options})
  assert not os.path.exists(tmp_path / "listops-1000")


def _old_pipeline_examples(path, max_length):
  """The ListOps split as the pipeline built it before the tokenizing moved out of it: the same elements
  and structure, with ``tokenize_fn`` run per example (the reference for the pretokenized pipeline)."""
  from tasks.base import Examples, import_tf

  tf = import_tf()
  sources, labels = listops.read_tsv(path)
  tokenize = listops.tokenize_fn(max_length)
  ds = tf.data.Dataset.from_tensor_slices((sources, np.asarray(labels, np.int32)))
  ds = ds.map(lambda s, y: {"inputs": tokenize(s), "targets": y}, num_parallel_calls=tf.data.AUTOTUNE,
              deterministic=True)
  return Examples(ds, len(sources), 0, path)


@pytest.mark.parametrize("max_length", [8, 64])  # 8 truncates most sources
def test_pretokenized_pipeline_gives_the_tokenizers_batches(listops_dir, max_length):
  from tasks.base import batched, import_tf

  task = tasks.get_task("listops")
  for split in ("train", "test"):
    path = os.path.join(listops_dir, "listops-1000", f"tiny_{split}.tsv")
    old = batched(_old_pipeline_examples(path, max_length), 8, seed=1, repeat=split == "train")
    new = batched(task.examples(listops_dir, split, max_length=max_length, name="tiny"), 8, seed=1,
                  repeat=split == "train")
    for a, b in zip(list(old.take(20)), list(new.take(20))):
      np.testing.assert_array_equal(a["inputs"].numpy(), b["inputs"].numpy())
      np.testing.assert_array_equal(a["targets"].numpy(), b["targets"].numpy())
  # hand-written lines: parentheses glued to tokens, a repeated source, other whitespace
  sources = ["( ( ( [MAX 2 ) 9 ) ] )", "((([MIN 4) 7) ])", "( ( [SM 4 ) ] )", "( ( [SM 4 ) ] )",
             "( ( [MED\t1 ) 3 ) ]", listops.to_source(("[SM", list(range(10))))]
  tf = import_tf()
  fn, reference = listops.pretokenized_fn(sources, max_length), listops.tokenize_fn(max_length)
  for source in sources:
    np.testing.assert_array_equal(fn(tf.constant(source)).numpy(), reference(tf.constant(source)).numpy())


def test_an_iterator_state_saved_by_the_old_pipeline_resumes_in_the_new(listops_dir, tmp_path):
  """Runs that were checkpointed before the tokenizing moved out of the pipeline resume exactly."""
  from tasks.base import batched, import_tf

  tf = import_tf()
  path = os.path.join(listops_dir, "listops-1000", "tiny_train.tsv")
  old_iter = iter(batched(_old_pipeline_examples(path, 64), 8, seed=2, repeat=True))
  for _ in range(7):  # into the second epoch (120 examples), the shuffle buffer part-filled
    next(old_iter)
  prefix = tf.train.Checkpoint(iterator=old_iter).write(str(tmp_path / "iter"))
  expected = [next(old_iter) for _ in range(25)]
  new_iter = iter(batched(tasks.get_task("listops").examples(listops_dir, "train", max_length=64, name="tiny"),
                          8, seed=2, repeat=True))
  tf.train.Checkpoint(iterator=new_iter).read(prefix).assert_consumed()
  for want in expected:
    got = next(new_iter)
    np.testing.assert_array_equal(want["inputs"].numpy(), got["inputs"].numpy())
    np.testing.assert_array_equal(want["targets"].numpy(), got["targets"].numpy())
