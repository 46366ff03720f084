"""The optimizer and the learning-rate schedules of the LRA code (``lra_benchmarks/utils/train_utils.py``)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax

# The factors of ``optimizer.schedule`` (``learning_rate_schedule`` multiplies them; ``config.validate``
# refuses any other word).
SCHEDULE_FACTORS = ("constant", "linear_warmup", "rsqrt_decay", "linear_decay", "cosine_decay")


def learning_rate_schedule(opt: ml_collections.ConfigDict) -> optax.Schedule:
  """The LRA ``create_learning_rate_scheduler``: a product of named factors.

  ``constant`` (times learning_rate), ``linear_warmup`` (min(1, step/warmup)), ``rsqrt_decay``
  (1/sqrt(max(step, warmup))), ``linear_decay`` (clip((cycle - step)/(cycle - warmup), 0, 1)),
  ``cosine_decay`` (0.5(1 + cos(pi·((step-warmup)/cycle mod 1)))).
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
    return lr

  return schedule


def make_optimizer(opt: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW(b1, b2, eps) with decoupled, lr-scaled weight decay on all parameters (as flax.optim Adam)."""
  parts = []
  if opt.grad_clip_norm and opt.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(opt.grad_clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(opt), b1=opt.b1, b2=opt.b2, eps=opt.eps,
                           weight_decay=opt.weight_decay))
  return optax.chain(*parts)
