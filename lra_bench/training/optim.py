"""The optimizer and the learning-rate schedules of the LRA code (``lra_benchmarks/utils/train_utils.py``)."""

from __future__ import annotations

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
  protocol) the optimizer is exactly the single AdamW.
  """
  parts = []
  if opt.grad_clip_norm and opt.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt.grad_clip_norm))
  main = _adamw(opt, opt.learning_rate, opt.weight_decay)
  if opt.get("ssm_learning_rate") is None:
    parts.append(main)
  else:
    ssm = _adamw(opt, opt.ssm_learning_rate, opt.get("ssm_weight_decay", 0.0))

    def labels(params):
      return jax.tree_util.tree_map_with_path(lambda path, _: "ssm" if is_ssm_param(path) else "main", params)

    parts.append(optax.multi_transform({"main": main, "ssm": ssm}, labels))
  return optax.chain(*parts)
