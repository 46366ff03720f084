"""Does a small Transformer leave chance on Pathfinder within a CPU budget? (docs/cpu_protocol.md)

Trains the `smoke` protocol's Pathfinder model (2 layers, emb 32, 2 heads, MEAN pooling, sinusoidal
positions) on generated Pathfinder-32 images, optionally max-pooled to a lower resolution (``--side 16``:
each 2x2 block keeps its brightest pixel, so the 1-pixel contours survive), with AdamW and a warm-up +
cosine schedule, batches drawn with a seeded numpy generator; prints train and held-out accuracy every
100 steps. The data must exist first, e.g.:

  lra-bench data prepare pathfinder --data_dir /tmp/d --name exp --contour_length 6 --num_images 12000
  python scripts/pathfinder_learnability.py --data /tmp/d/exp/pathfinder32/curv_baseline --side 16 --steps 1500

The last 1000 images are held out; the rest are the training pool.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from configs import smoke
from lra_bench.training import models
from tasks import pathfinder


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data", required=True, help="a generated pathfinder32 difficulty folder")
  parser.add_argument("--side", type=int, default=32, choices=(8, 16, 32))
  parser.add_argument("--attention", default="vanilla")
  parser.add_argument("--steps", type=int, default=1500)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--learning_rate", type=float, default=1e-3)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()

  pixels, labels = pathfinder.load(args.data, 32)
  images = pixels.reshape(-1, 32, 32)
  f = 32 // args.side
  images = images.reshape(-1, args.side, f, args.side, f).max(axis=(2, 4))
  tokens = images.reshape(len(images), -1).astype(np.int32) + 1   # 0 is padding: pixels shift by one
  held = 1000
  train_x, train_y, test_x, test_y = tokens[:-held], labels[:-held], tokens[-held:], labels[-held:]

  config = smoke.get_config("pathfinder")
  config.model.attention, config.model.num_layers = args.attention, args.layers
  model = models.Classifier(config.model, 257, 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, args.learning_rate, args.steps // 10, args.steps)
  tx = optax.adamw(schedule, weight_decay=0.0)
  params = model.init(jax.random.PRNGKey(args.seed), {"inputs": train_x[:2]})["params"]
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, x, y):
    def loss_fn(p):
      logits = model.apply({"params": p}, {"inputs": x})
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), logits
    (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, (logits.argmax(-1) == y).mean()

  @jax.jit
  def predict(params, x):
    return model.apply({"params": params}, {"inputs": x}).argmax(-1)

  rng = np.random.default_rng(args.seed)
  start, train_acc = time.time(), []
  print(f"side {args.side}, {len(train_x)} train / {held} held-out images, attention {args.attention}")
  for s in range(1, args.steps + 1):
    idx = rng.integers(0, len(train_x), args.batch_size)
    params, opt_state, acc = step(params, opt_state, train_x[idx], train_y[idx])
    train_acc.append(float(acc))
    if s % 100 == 0 or s == args.steps:
      pred = np.concatenate([np.asarray(predict(params, test_x[i:i + 250])) for i in range(0, held, 250)])
      print(f"step {s} train_acc {np.mean(train_acc[-100:]):.3f} test_acc {np.mean(pred == test_y):.3f} "
            f"t {time.time() - start:.0f}s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
