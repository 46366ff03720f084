"""Every bad config value and flag value is refused before anything runs, in one line naming it.

Config keys go through ``training.config.load_config`` (what train, suite and bench call before the
first step); flags through ``cli.parse`` (argparse types: the process exits 2 before a command runs).
"""

from __future__ import annotations

import os

import pytest

from lra_bench import cli
from lra_bench.training import config as config_lib


@pytest.mark.parametrize("override, message", [
    ("eval_every=0", "eval_every=0 is not allowed; expected an integer >= 1"),
    ("log_every=0", "log_every=0 is not allowed"),
    ("checkpoint_every=-5", "checkpoint_every=-5 is not allowed"),
    ("num_train_steps=0", "num_train_steps=0 is not allowed; expected an integer >= 1"),
    ("batch_size=0", "batch_size=0 is not allowed"),
    ("accumulate_steps=0", "accumulate_steps=0 is not allowed"),
    ("num_eval_batches=0", "num_eval_batches=0 is not allowed; expected an integer -1 (all) or >= 1"),
    ("seed=-1", "seed=-1 is not allowed"),
    ("seed=4294967296", "seed=4294967296 is not allowed"),
    ("model.num_layers=0", "model.num_layers=0 is not allowed"),
    ("model.num_heads=0", "model.num_heads=0 is not allowed"),
    ("model.num_heads=3", "model.qkv_dim=32 is not allowed with model.num_heads=3"),
    ("model.emb_dim=0", "model.emb_dim=0 is not allowed"),
    ("model.qkv_dim=-2", "model.qkv_dim=-2 is not allowed"),
    ("model.mlp_dim=0", "model.mlp_dim=0 is not allowed"),
    ("model.dropout_rate=1.0", "model.dropout_rate=1.0 is not allowed; expected a number in [0, 1)"),
    ("model.dropout_rate=-0.1", "model.dropout_rate=-0.1 is not allowed"),
    ("model.attention_dropout_rate=1.5", "model.attention_dropout_rate=1.5 is not allowed"),
    ("model.pooling=FIRST", "model.pooling='FIRST' is not allowed; expected one of CLS, MEAN, SUM, MAX"),
    ("model.positions=rotary", "model.positions='rotary' is not allowed"),
    ("model.attention_kwargs.dropout_rate=1.0", "model.attention_kwargs.dropout_rate=1.0 is not allowed"),
    ("data.max_length=0", "data.max_length=0 is not allowed"),
    ("data.shuffle_buffer=0", "data.shuffle_buffer=0 is not allowed"),
    ("data.options.nme=smoke", "unknown config key data.options.nme; data.options takes: name"),
    ("data.prepare.num_train=-3", "data.prepare.num_train=-3 is not allowed"),
    ("data.prepare.num_tran=3", "unknown config key data.prepare.num_tran"),
    ("data.prepare.min_length=200", "min_length=200 and max_expression_length=128 leave no length"),
    ("optimizer.learning_rate=0", "optimizer.learning_rate=0.0 is not allowed; expected a number > 0"),
    ("optimizer.learning_rate=nan", "optimizer.learning_rate=nan is not allowed"),
    ("optimizer.warmup_steps=-1", "optimizer.warmup_steps=-1 is not allowed"),
    ("optimizer.steps_per_cycle=0", "optimizer.steps_per_cycle=0 is not allowed"),
    ("optimizer.weight_decay=-0.1", "optimizer.weight_decay=-0.1 is not allowed"),
    ("optimizer.b1=1.0", "optimizer.b1=1.0 is not allowed"),
    ("optimizer.b2=-0.5", "optimizer.b2=-0.5 is not allowed"),
    ("optimizer.eps=0", "optimizer.eps=0.0 is not allowed"),
    ("optimizer.grad_clip_norm=-1", "optimizer.grad_clip_norm=-1.0 is not allowed"),
    ("optimizer.schedule=constant * warp", "unknown schedule factor(s) ['warp']"),
    # protocol and task name the preset: never overrides (issue 30); validate's checks of their values
    # are in test_values_of_the_wrong_type_are_refused (a config changed in code)
    ("task=nope", "'task' cannot be overridden"),
    ("protocol=", "'protocol' cannot be overridden"),
])
def test_bad_config_value_is_refused_before_the_first_step(override, message):
  with pytest.raises(config_lib.ConfigError) as err:
    config_lib.load_config("smoke", "listops", [override])
  assert message in str(err.value)
  assert "\n" not in str(err.value)


@pytest.mark.parametrize("key, value, message", [
    ("batch_size", True, "batch_size=True is not allowed; expected an integer >= 1"),
    ("eval_every", True, "eval_every=True is not allowed"),
    ("seed", False, "seed=False is not allowed"),
    ("task", "nope", "task='nope' is not allowed; expected one of assoc_recall, image, in_context_recall"),
    ("protocol", "", "protocol='' is not allowed"),
])
def test_values_of_the_wrong_type_are_refused(key, value, message):
  """``True`` is an int to Python (it trained with batch 1); a config built in code is checked too."""
  with pytest.raises(config_lib.ConfigError, match=message.replace("(", r"\(")):
    config_lib.load_config("smoke", "listops", extend=lambda c: setattr(c, key, value))


@pytest.mark.parametrize("override, message", [
    ("bench.repeats=0", "bench.repeats=0 is not allowed"),
    ("bench.warmup_steps=-1", "bench.warmup_steps=-1 is not allowed"),
    ("bench.mode=backward", "bench.mode='backward' is not allowed; expected one of train, inference"),
])
def test_bad_bench_values_are_refused(override, message):
  from lra_bench.experiments import bench

  with pytest.raises(config_lib.ConfigError, match=message):
    bench.bench_config("vanilla", 64, overrides=[override])


def test_open_sections_are_checked_against_the_task_and_the_core():
  with pytest.raises(config_lib.ConfigError, match="data.options.limit=-1 is not allowed"):
    config_lib.load_config("smoke", "text", ["data.options.limit=-1"])

  def kwargs(c):
    c.model.attention_kwargs.block_size = 2.5
    c.model.attention_kwargs.causal = 1

  with pytest.raises(config_lib.ConfigError, match="model.attention_kwargs.block_size=2.5 is not allowed"):
    config_lib.load_config("smoke", "listops", attention="local", extend=kwargs)


def test_every_shipped_config_is_valid():
  """Every task of every protocol, and every point of its sweep; a task a protocol has no config for
  fails with that reason."""
  import importlib

  from lra_bench.experiments import suite
  import tasks

  for protocol in config_lib.list_protocols():
    module = importlib.import_module(f"configs.{protocol}")
    excluded = getattr(module, "EXCLUDED", {})
    configured = getattr(module, "TASKS", None) or ("listops", "text", "retrieval", "image", "pathfinder")
    for task in tasks.list_tasks():
      if task == "pathx" and task not in configured:
        continue  # protocols without a Path-X preset of their own (smoke, xiong ...) derive it from lra's
      if task in excluded or task not in configured:  # no config for that task: said, with its reason
        with pytest.raises(config_lib.ConfigError, match=f"has no config for task '{task}'"):
          config_lib.load_config(protocol, task)
        continue
      for sets, _ in suite.sweep_variants(protocol, task, {}, ()):
        config_lib.validate(config_lib.load_config(protocol, task, sets))


# ----------------------------------------------------------------------------------------------------
# Flags


def parse_error(capsys, *argv) -> str:
  with pytest.raises(SystemExit) as exit_:
    cli.parse(["lra-bench", *argv])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.startswith("error: "), err
  return err


@pytest.mark.parametrize("argv, message", [
    (["bench", "--results_dir=R", "--repeats=0"], "error: --repeats: 0 is not allowed; expected an integer >= 1"),
    (["bench", "--results_dir=R", "--batch_size=0"], "--batch_size: 0 is not allowed"),
    (["bench", "--results_dir=R", "--warmup_steps=-1"], "--warmup_steps: -1 is not allowed"),
    (["bench", "--results_dir=R", "--lengths=1024,0"], "--lengths: in '1024,0': 0 is not allowed"),
    (["bench", "--results_dir=R", "--lengths=1024,,2048"], "--lengths: '1024,,2048' has an empty item"),
    (["bench", "--results_dir=R", "--lengths="], "--lengths: '' has an empty item"),
    (["bench", "--results_dir=R", "--timeout=0"], "--timeout: 0 is not allowed; expected a finite number > 0"),
    (["bench", "--results_dir=R", "--timeout=inf"], "--timeout: inf is not allowed"),
    (["bench", "--results_dir=R", "--compile_only_from=0"], "--compile_only_from: 0 is not allowed"),
    (["bench", "--results_dir=R", "--mode=backward"], "--mode: invalid choice: 'backward'"),
    (["bench", "--results_dir=R", "--attentions="], "--attentions: '' has an empty name"),
    (["bench", "--results_dir=R", "--set=nokey"], "--set: 'nokey' is not of the form key=value"),
    (["bench"], "the following arguments are required: --results_dir"),
    (["viz", "attention", "vanilla", "--length=0"], "--length: 0 is not allowed"),
    (["viz", "attention", "vanilla", "--out=x.pdf"], "--out: 'x.pdf' is not allowed; expected a file name"),
    (["report", "--results_dir=R", "--length=-1"], "--length: -1 is not allowed"),
    (["data", "prepare", "listops", "--num_train=-5"], "--num_train: -5 is not allowed"),
    (["data", "prepare", "listops", "--num_val=0"], "--num_val: 0 is not allowed"),
    (["data", "prepare", "listops", "--num_test=x"], "--num_test: 'x' is not an integer"),
    (["data", "prepare", "listops", "--min_length=-1"], "--min_length: -1 is not allowed"),
    (["data", "prepare", "listops", "--max_expression_length=1"], "--max_expression_length: 1 is not allowed"),
    (["data", "prepare", "listops", "--seed=-1"], "--seed: -1 is not allowed"),
    (["data", "prepare", "pathfinder", "--num_images=0"], "--num_images: 0 is not allowed"),
    (["data", "prepare", "pathfinder", "--images_per_batch=0"], "--images_per_batch: 0 is not allowed"),
    (["data", "prepare", "pathfinder", "--workers=0"], "--workers: 0 is not allowed"),
    (["data", "prepare", "pathfinder", "--resolution=0"], "--resolution: 0 is not allowed"),
    (["data", "prepare", "pathfinder", "--contour_length=0"], "--contour_length: 0 is not allowed"),
    (["data", "download", "lra-release", "--url="], "--url: an empty value is not allowed"),
    (["train", "--task=listops", "--seed=-3"], "--seed: -3 is not allowed"),
    (["train", "--task=listops", "--seed=2147483648"], "--seed: 2147483648 is not allowed"),
    (["train", "--task=listops", "--num_processes=0"], "--num_processes: 0 is not allowed"),
    (["train", "--task=listops", "--process_id=-1"], "--process_id: -1 is not allowed"),
    (["train"], "the following arguments are required: --task"),
    (["suite", "--results_dir=R", "--seeds=0,-1"], "--seeds: in '0,-1': -1 is not allowed"),
    (["suite", "--results_dir=R", "--seeds="], "--seeds: '' has an empty item"),
    (["suite", "--results_dir=R", "--tasks=listops,"], "--tasks: 'listops,' has an empty name"),
    (["suite", "--results_dir=R", "--launcher=cloud"], "--launcher: invalid choice: 'cloud'"),
    (["suite", "--results_dir=R", "--workers=0"], "--workers: 0 is not allowed"),
    (["suite", "--results_dir=R", "--time_limit=0"], "--time_limit: 0 is not allowed"),
    (["suite", "--results_dir=R", "--gpus_per_task=-1"], "--gpus_per_task: -1 is not allowed"),
    (["suite", "--results_dir=R", "--array_size=0"], "--array_size: 0 is not allowed"),
    (["suite", "--results_dir=R", "--cpus_per_task=0"], "--cpus_per_task: 0 is not allowed"),
    (["check", "vanilla", "--lengths=256,0"], "--lengths: in '256,0': 0 is not allowed"),
    (["check", "vanilla", "--steps=0"], "--steps: 0 is not allowed"),
    (["check", "vanilla", "--lengths=256"], "--lengths: '256' is not allowed; expected at least 2 different"),
    (["list", "--repeats=3"], "lra-bench list: unrecognized arguments: --repeats=3"),
    (["train", "--task=listops", "--lengths=256"], "unrecognized arguments: --lengths=256"),
    (["report", "--results_dir=R", "--isolate"], "unrecognized arguments: --isolate"),
    (["frobnicate"], "unknown command 'frobnicate'; commands: 'list', 'data'"),
    (["viz", "heatmap"], "unknown command 'viz heatmap'"),
])
def test_bad_flag_value_is_one_line_before_anything_runs(capsys, argv, message):
  assert message in parse_error(capsys, *argv)


@pytest.mark.parametrize("command", [
    ["train", "--task=listops", "--workdir={bad}"],
    ["train", "--task=listops", "--results_dir={bad}"],
    ["suite", "--results_dir={bad}"],
    ["suite", "--results_dir=R", "--log_dir={bad}"],
    ["bench", "--results_dir={bad}"],
    ["report", "--results_dir=R", "--out={bad}"],
    ["viz", "attention", "vanilla", "--out={bad}/a.png"],
    ["check", "vanilla", "--out={bad}"],
    ["new", "attention", "mine", "--dir={bad}"],
    ["data", "prepare", "listops", "--data_dir={bad}"],
])
def test_output_directories_that_cannot_be_made_are_refused_up_front(capsys, tmp_path, command):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  bad = str(blocker / "sub")
  err = parse_error(capsys, *[word.format(bad=bad) for word in command])
  assert f"{bad} cannot be created: {blocker} is a file" in err


def test_paths_are_made_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  args = cli.parse(["lra-bench", "train", "--task=listops", "--workdir=runs/demo", "--data_dir=data"])
  assert args.workdir == str(tmp_path / "runs" / "demo") and args.data_dir == str(tmp_path / "data")


def test_seed_bound_is_the_configs():
  assert cli.MAX_SEED == config_lib.MAX_SEED


def test_report_refuses_a_missing_or_empty_results_dir(tmp_path, capsys):
  missing = tmp_path / "nope"
  args = cli.parse(["lra-bench", "report", f"--results_dir={missing}"])
  assert cli.main(args) == 2
  assert f"--results_dir: {missing} does not exist" in capsys.readouterr().err
  assert not missing.exists()
  args = cli.parse(["lra-bench", "report", f"--results_dir={tmp_path}"])
  assert cli.main(args) == 2
  assert "has no records (results.jsonl is missing or empty)" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "report")


def test_prepare_checks_the_merged_options(tmp_path, capsys):
  """Flags that pass one by one but not together (and protocol options) are checked before generating."""
  args = cli.parse(["lra-bench", "data", "prepare", "listops", f"--data_dir={tmp_path}", "--min_length=50",
                    "--max_expression_length=20"])
  assert cli.main(args) == 2
  assert "min_length=50 and max_expression_length=20 leave no length" in capsys.readouterr().err
  assert not os.listdir(tmp_path)
