"""``model.remat``: every encoder block rematerialised (``models.Encoder``) computes the same loss and gradients
with less live memory in the train step."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest

from lra_bench.training import config as config_lib
from lra_bench.training import objectives, optim, steps, xla_stats
from tests import seam_fingerprint

# (protocol, task, layer, overrides): attention cores and sequence mixers, bidirectional (classifier) and causal
# (next-token language model), one core shared by every block (Xiong's Linformer); dropout on, so the recomputed
# forward must draw the same masks
CELLS = (
    ("smoke", "listops", "vanilla", ("model.dropout_rate=0.1", "model.attention_dropout_rate=0.1")),
    ("smoke", "listops", "s5", ("model.dropout_rate=0.1",)),
    ("xiong", "listops", "linformer", ("data.max_length=64", "model.attention_kwargs.k=16")),  # one shared core
    ("zoology", "mqar", "vanilla", ("data.max_length=64",)),
    ("zoology", "mqar", "s4d", ("data.max_length=64",)),
)


def _loss_and_grads(protocol, task, layer, overrides, remat: bool):
  config = config_lib.load_config(protocol, task, [*overrides, f"model.remat={remat}"], attention=layer, seed=0)
  objective = objectives.select(config, objectives.TRAIN)
  length = min(int(config.data.max_length), seam_fingerprint.MAX_LENGTH)
  batch = seam_fingerprint._batch(objective.task, length, np.random.default_rng(0))
  model = objective.create_model()
  state = steps.init_state(config, model, optim.make_optimizer(config.optimizer), batch)
  rngs = {"dropout": jax.random.key(1), "attention": jax.random.key(2)}

  def loss(params):
    outputs, _ = model.apply({"params": params, **state.model_state}, batch, deterministic=False, rngs=rngs,
                             mutable=[*state.model_state, steps.AUX_LOSSES])
    return steps.mean_loss_and_accuracy(*objective.terms(outputs, batch))[0]

  return jax.jit(jax.value_and_grad(loss))(state.params)


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: "/".join(c[:3]))
def test_remat_keeps_loss_and_gradients(cell):
  """Same parameters (names and values), same loss and gradients to float32 rounding (the recomputation may
  fuse differently: 1e-5 relative, 1e-7 absolute for gradients near 0)."""
  loss_off, grads_off = _loss_and_grads(*cell, remat=False)
  loss_on, grads_on = _loss_and_grads(*cell, remat=True)
  assert jax.tree.structure(grads_on) == jax.tree.structure(grads_off)
  np.testing.assert_allclose(float(loss_on), float(loss_off), rtol=1e-6)
  for on, off in zip(jax.tree.leaves(grads_on), jax.tree.leaves(grads_off), strict=True):
    np.testing.assert_allclose(np.asarray(on), np.asarray(off), rtol=1e-5, atol=1e-7)
  assert any(float(np.abs(g).max()) > 0 for g in jax.tree.leaves(grads_on))


def _smoke_vanilla(remat: bool, length: int, layers: int):
  """(config, objective, model) of the ``vanilla`` smoke model at ``length`` with ``layers`` blocks, batch 2."""
  overrides = [f"data.max_length={length}", f"model.num_layers={layers}", "batch_size=2", f"model.remat={remat}"]
  config = config_lib.load_config("smoke", "listops", overrides, attention="vanilla", seed=0)
  objective = objectives.select(config, objectives.TRAIN)
  return config, objective, objective.create_model()


def _residual_bytes(remat: bool, length: int = 1024, layers: int = 4) -> int:
  """Bytes the backward pass of the loss keeps from the forward pass (the residuals of ``jax.vjp``, abstract:
  nothing is computed), where the [B, H, L, L] attention weights of every block dominate without remat."""
  config, objective, model = _smoke_vanilla(remat, length, layers)
  batch = {"inputs": np.ones((2, length), np.int32), "targets": np.zeros((2,), np.int32)}
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), batch, deterministic=True))["params"]

  def residuals(params):
    loss = lambda p: steps.mean_loss_and_accuracy(*objective.terms(model.apply({"params": p}, batch), batch))[0]
    return jax.tree.leaves(jax.vjp(loss, params)[1])

  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.eval_shape(residuals, params))


def _train_step_temp_bytes(remat: bool, length: int = 1024, layers: int = 4) -> int:
  """The compiled train step's temporary memory (``xla_stats.cost_analysis``: ``temp_size_in_bytes``)."""
  config, objective, model = _smoke_vanilla(remat, length, layers)
  tx = optim.make_optimizer(config.optimizer)
  batch = {"inputs": jax.ShapeDtypeStruct((2, length), np.int32), "targets": jax.ShapeDtypeStruct((2,), np.int32)}
  example = {"inputs": np.ones((2, length), np.int32), "targets": np.zeros((2,), np.int32)}
  state = jax.eval_shape(steps.state_initializer(config, model, tx, example))
  step = jax.jit(functools.partial(steps.train_step, model=model, tx=tx, terms=objective.terms))
  return xla_stats.cost_analysis(step.lower(state, batch).compile())["temp_bytes"]


def test_remat_keeps_only_block_inputs_for_the_backward_pass():
  """What the backward pass keeps: without remat every block's [B, H, L, L] attention weights (4 blocks x 2
  examples x 2 heads x 1025² floats, and their softmax's), with remat each block's input [B, L, E] and no L²
  tensor. A memory bound, not a timing: at least 10 times less at L = 1024 (measured: docs/usage.md)."""
  without, with_remat = _residual_bytes(False), _residual_bytes(True)
  square = 4 * 2 * 2 * 1025 * 1025 * 4  # one [B, H, L+1, L+1] float32 tensor per block
  assert without > square, without
  assert with_remat * 10 < without, (with_remat, without)


@pytest.mark.skipif(jax.default_backend() == "cpu", reason="XLA's CPU compiler schedules a rematerialised block's "
                    "recomputation with the forward pass, so its temp memory does not drop (L=1024, 4 blocks: "
                    "182 MB with remat, 165 MB without); GPU/TPU schedules keep it in the backward pass")
def test_remat_lowers_train_step_temp_memory():
  """The compiled train step's temp memory (``memory_analysis().temp_size_in_bytes``) on an accelerator: at
  least a third less with remat where the attention weights dominate (vanilla, L = 1024, 4 blocks)."""
  without, with_remat = _train_step_temp_bytes(False), _train_step_temp_bytes(True)
  assert with_remat < 0.67 * without, (with_remat, without)
