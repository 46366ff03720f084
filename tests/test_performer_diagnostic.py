"""scripts/performer_attention_diagnostic.py: its two attention forms are the ``performer`` core's
(default, and with Xiong et al.'s ``padded_keys="zeroed"`` + ``key_stabilizer="global"``), and its
statistics read what they say on inputs whose answer is known."""

import importlib.util
import os

import jax.numpy as jnp
import numpy as np

from tests.attention_probe import create, random_qkv
from tests.dense_reference import run_core

_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "scripts", "performer_attention_diagnostic.py")
_spec = importlib.util.spec_from_file_location("performer_attention_diagnostic", _PATH)
diagnostic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(diagnostic)


def test_both_forms_equal_the_cores(x64):
  q, k, v = random_qkv(5, 2, 33, 2, 8, 3, dtype=jnp.float64)
  k = k * 3.0
  mask = np.ones((2, 33), bool)
  mask[0, 21:] = False
  options = dict(nb_features=24, input_normalizations=2, numerical_stabilizer=1e-4, redraw="fixed")
  ours_out, sown = run_core(create("performer", **options), q, k, v, mask, intermediates=True)
  theirs_out = run_core(create("performer", padded_keys="zeroed", key_stabilizer="global", **options),
                        q, k, v, mask)
  w = np.asarray(sown["projection"][0], np.float64)
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  peak = diagnostic.global_peak(k, mask, w, True)
  for b in range(2):
    real = mask[b]
    for h in range(2):
      ours, theirs, _ = diagnostic.attention_weights(q[b, :, h], k[b, :, h], real, w, peak,
                                                     scale_twice=True, eps=1e-4)
      np.testing.assert_allclose((ours / ours.sum(-1, keepdims=True)) @ v[b, real, h],
                                 np.asarray(ours_out)[b, real, h], rtol=1e-9, atol=1e-12)
      zeroed_v = v[b, :, h] * real[:, None]
      np.testing.assert_allclose((theirs / theirs.sum(-1, keepdims=True)) @ zeroed_v,
                                 np.asarray(theirs_out)[b, real, h], rtol=1e-9, atol=1e-12)


def test_statistics_of_known_cases():
  rng = np.random.default_rng(0)
  w = rng.normal(size=(16, 8))
  q = rng.normal(size=(1, 40, 1, 8))
  mask = np.arange(40)[None] < 30                                       # 30 real, 10 padded
  # all keys zero: every key has the same feature, so both forms are uniform, padded keys take 10/40
  stats = diagnostic.layer_statistics(q, np.zeros_like(q), mask, w, scale_twice=False, eps=1e-4, max_examples=1)
  assert abs(stats["pad share"] - 0.25) < 1e-12
  for name in ("TV to uniform (ours)", "TV to uniform (theirs)", "TV ours vs theirs"):
    assert stats[name] < 1e-12, name
  # no ε: no ε share; large, spread keys with ε: theirs is mostly ε and near uniform, ours is not
  k = rng.normal(size=(1, 40, 1, 8)) * 4
  assert diagnostic.layer_statistics(q, k, mask, w, scale_twice=False, eps=0.0, max_examples=1)["eps share"] == 0
  spread = diagnostic.layer_statistics(q, k, mask, w, scale_twice=False, eps=1e-4, max_examples=1)
  assert spread["eps share"] > 0.5 and spread["TV to uniform (theirs)"] < spread["TV to uniform (ours)"]
