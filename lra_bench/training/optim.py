"""The optimizer and the learning-rate schedules of the LRA code (``lra_benchmarks/utils/train_utils.py``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_collections
import optax

# The factors of ``optimizer.schedule`` (``learning_rate_schedule`` multiplies them; ``config.validate``
# refuses any other word).
SCHEDULE_FACTORS = ("constant", "linear_warmup", "rsqrt_decay", "linear_decay", "cosine_decay", "timm_cosine")


def learning_rate_schedule(opt: ml_collections.ConfigDict) -> optax.Schedule:
  """The LRA ``create_learning_rate_scheduler``: a product of named factors.

  ``constant`` (times learning_rate), ``linear_warmup`` (min(1, step/warmup)), ``rsqrt_decay``
  (1/sqrt(max(step, warmup))), ``linear_decay`` (clip((cycle - step)/(cycle - warmup), 0, 1)),
  ``cosine_decay`` (0.5(1 + cos(pi·((step-warmup)/cycle mod 1)))), ``timm_cosine`` (timm's
  ``CosineLRScheduler`` as the safari / seq_icl recipes use it: 1 during the warm-up, then
  f + (1 - f)·0.5(1 + cos(pi·min(step/cycle, 1))) with the cosine counted from step 0, not from the end
  of the warm-up, and f = ``optimizer.cosine_floor`` (timm's ``lr_min`` / lr; default 0); with
  ``linear_warmup`` before it, timm's warm-up from ``warmup_lr_init`` ≈ 0).
  """
  factors = [f.strip() for f in opt.schedule.split("*")]
  warmup = float(opt.warmup_steps)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    lr = jnp.ones([], jnp.float32)
    for factor in factors:
      if factor == "constant":
        lr = lr * opt.learning_rate
      elif factor == "linear_warmup":
        lr = lr * jnp.minimum(1.0, step / max(warmup, 1.0))
      elif factor == "rsqrt_decay":
        lr = lr / jnp.sqrt(jnp.maximum(step, max(warmup, 1.0)))
      elif factor == "linear_decay":  # to 0 at steps_per_cycle (PyTorch OneCycle, linear anneal)
        span = max(float(opt.steps_per_cycle) - warmup, 1.0)
        lr = lr * jnp.clip((float(opt.steps_per_cycle) - step) / span, 0.0, 1.0)
      elif factor == "cosine_decay":
        progress = jnp.maximum(0.0, (step - warmup) / float(opt.steps_per_cycle))
        lr = lr * 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0)))
      elif factor == "timm_cosine":
        floor = float(opt.get("cosine_floor", 0.0))
        progress = jnp.minimum(step / float(opt.steps_per_cycle), 1.0)
        lr = lr * jnp.where(step < warmup, 1.0, floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress)))
    return lr

  return schedule


SSM_PREFIX = "ssm_"  # parameters named so are a sequence mixer's SSM parameters (attention_zoo.mixers)


def is_ssm_param(path) -> bool:
  """Whether the parameter at ``path`` (a ``jax.tree_util`` key path) is an SSM parameter: its own name
  starts with ``ssm_`` (Λ/A, B, Δ of S4D, S5, LRU)."""
  leaf = path[-1] if path else None
  name = getattr(leaf, "key", getattr(leaf, "name", None))
  return isinstance(name, str) and name.startswith(SSM_PREFIX)


# ``optimizer.param_groups``: "pattern=rate/decay, ..." — the first rule whose pattern matches a parameter sets
# its peak rate ("main": optimizer.learning_rate; "ssm": optimizer.ssm_learning_rate) and its weight decay
# ("main": optimizer.weight_decay; "0": none). A pattern is a category (``PARAM_CATEGORIES``) or a parameter's
# own name (``ssm_log_dt``, ``C``). Parameters no rule matches keep the default split (``is_ssm_param``: SSM
# rate and ``ssm_weight_decay``; the others: main rate and ``weight_decay``). The originals' groupings:
# S4's per-parameter ``_optim`` (``src/models/sequence/kernels/kernel.py`` ``register``) with
# ``src/utils/optim_groups.py`` ``add_optimizer_hooks`` (no decay on biases, norms, embeddings); S5's
# ``opt_config`` / ``dt_global`` (``s5/train_helpers.py`` ``create_train_state``). configs/s4.py, configs/s5.py.
PARAM_CATEGORIES = ("norm", "bias", "embedding")
PARAM_RATES = ("main", "ssm")
PARAM_DECAYS = ("main", "0")
_NORM_MODULE = re.compile(r"^(BatchNorm|LayerNorm|ScaleNorm)_\d+$|^encoder_norm$")


def parse_param_groups(text: str) -> list[tuple[str, str, str]]:
  """``optimizer.param_groups`` as (pattern, rate, decay) rules; ValueError names what is wrong."""
  rules = []
  for item in (part.strip() for part in str(text).split(",")):
    if not item:
      continue
    pattern, sep, value = item.partition("=")
    rate, slash, decay = value.strip().partition("/")
    pattern, rate, decay = pattern.strip(), rate.strip(), decay.strip()
    if not sep or not slash or not pattern:
      raise ValueError(f"rule {item!r} is not of the form pattern=rate/decay (e.g. ssm_log_dt=main/0)")
    if rate not in PARAM_RATES:
      raise ValueError(f"rule {item!r}: rate {rate!r} is not one of {PARAM_RATES}")
    if decay not in PARAM_DECAYS:
      raise ValueError(f"rule {item!r}: decay {decay!r} is not one of {PARAM_DECAYS}")
    rules.append((pattern, rate, decay))
  return rules


def _names(path) -> list[str]:
  return [str(getattr(entry, "key", getattr(entry, "name", entry))) for entry in path]


def param_matches(pattern: str, path) -> bool:
  """Whether the parameter at ``path`` (a key path) is ``pattern``: a category (``norm``: inside a norm module;
  ``bias``: named bias; ``embedding``: the token embedding, module ``embed``) or its own name."""
  names = _names(path)
  if not names:
    return False
  if pattern == "norm":
    return any(_NORM_MODULE.match(name) for name in names[:-1])
  if pattern == "bias":
    return names[-1] == "bias"
  if pattern == "embedding":
    return "embed" in names[:-1]
  return names[-1] == pattern


def param_group(rules: list[tuple[str, str, str]], path, ssm_group: bool = True) -> tuple[str, str]:
  """(rate, decay) of the parameter at ``path`` under ``rules`` (``parse_param_groups``); unmatched, the
  default split (``ssm_group``: whether an SSM rate is set), decay "ssm" being ``ssm_weight_decay``."""
  for pattern, rate, decay in rules:
    if param_matches(pattern, path):
      return rate, decay
  return ("ssm", "ssm") if ssm_group and is_ssm_param(path) else ("main", "main")


def _adamw(opt: ml_collections.ConfigDict, learning_rate: float, weight_decay: float):
  schedule_config = ml_collections.ConfigDict(opt.to_dict())
  schedule_config.learning_rate = learning_rate
  return optax.adamw(learning_rate_schedule(schedule_config), b1=opt.b1, b2=opt.b2, eps=opt.eps,
                     weight_decay=weight_decay)


def make_optimizer(opt: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW(b1, b2, eps) with decoupled, lr-scaled weight decay on all parameters (as flax.optim Adam).

  With ``optimizer.ssm_learning_rate`` set (the S4 / S5 / LRU recipes), the SSM parameters
  (:func:`is_ssm_param`) get their own AdamW: the same schedule at that peak rate and
  ``optimizer.ssm_weight_decay`` (default 0); gradient clipping stays global. Without it (every other
  protocol) the optimizer is exactly the single AdamW. ``optimizer.param_groups`` (``parse_param_groups``)
  moves named parameters between the rates and weight decays (the S4 and S5 recipes).
  """
  parts = []
  if opt.grad_clip_norm and opt.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt.grad_clip_norm))
  main = _adamw(opt, opt.learning_rate, opt.weight_decay)
  if opt.get("param_groups") is not None:
    rules = parse_param_groups(opt.param_groups)
    rates = {"main": opt.learning_rate, "ssm": opt.get("ssm_learning_rate")}
    decays = {"main": opt.weight_decay, "0": 0.0, "ssm": opt.get("ssm_weight_decay", 0.0)}
    groups = {f"{rate}:{decay}": (rate, decay) for rate in PARAM_RATES for decay in decays
              if rates[rate] is not None}

    def group_labels(params):
      has_ssm = rates["ssm"] is not None
      return jax.tree_util.tree_map_with_path(lambda path, _: ":".join(param_group(rules, path, has_ssm)), params)

    transforms = {label: _adamw(opt, rates[rate], decays[decay]) for label, (rate, decay) in groups.items()}
    parts.append(optax.multi_transform(transforms, group_labels))
    return optax.chain(*parts)
  if opt.get("ssm_learning_rate") is None:
    parts.append(main)
  else:
    ssm = _adamw(opt, opt.ssm_learning_rate, opt.get("ssm_weight_decay", 0.0))

    def labels(params):
      return jax.tree_util.tree_map_with_path(lambda path, _: "ssm" if is_ssm_param(path) else "main", params)

    parts.append(optax.multi_transform({"main": main, "ssm": ssm}, labels))
  return optax.chain(*parts)
