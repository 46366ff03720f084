"""The pure train and eval steps (jitted at the call site) and the initial train state.

What a step minimises and counts is its objective's (``training.objectives``): both steps take the objective's
``terms(outputs, batch) -> (loss, correct, weight)`` per label slot and, where it has one, its batch transform
``prepare``; the model is whatever the objective built. A step never looks at the model to choose a loss.

Auxiliary losses: an attention core (or any module of the model) may ``self.sow("losses", name, scalar)``;
the train step applies the model with the ``losses`` collection mutable and adds the sum of every sown
value to the objective's loss it differentiates (nothing sown: exactly that loss). The sown values
are per-call outputs, never state: they are dropped after the step. Other non-trainable collections
(e.g. the EMA centroids of ``combiner_learnable``) are ``TrainState.model_state`` and are carried.
"""

from __future__ import annotations

from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from lra_bench.training import xla_stats

AUX_LOSSES = "losses"  # the flax collection auxiliary losses are sown into
PREPARE_STREAM = 1 << 20  # fold_in of a step's key that ``prepare`` draws from (dropout uses the key itself)


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  model_state: Any  # non-trainable flax collections (e.g. EMA centroids); often empty
  rng: jax.Array    # base key (raw uint32); the key of step s is fold_in(rng, s)


def _variables(params, model_state):
  return {"params": params, **model_state}


# (outputs, batch) -> (loss, correct, weight) per label slot: an objective's ``terms``
Terms = Callable[[jax.Array, dict[str, jax.Array]], tuple[jax.Array, jax.Array, jax.Array]]


def mean_loss_and_accuracy(loss: jax.Array, correct: jax.Array, weight: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Mean loss and accuracy over the labels of a batch, from its per-slot terms (classification: over its
  examples; next-token and pretraining: over its labelled slots, as Zoology's token-level mean)."""
  total = jnp.maximum(jnp.sum(weight), 1.0)
  return jnp.sum(loss * weight) / total, jnp.sum(correct * weight) / total


def with_aux_losses(loss: jax.Array, variables) -> jax.Array:
  """``loss`` plus every value sown into the ``losses`` collection of ``variables`` (summed in float32).

  Nothing sown: ``loss`` itself (no operation is added, so the step is the same program as without
  auxiliary losses).
  """
  leaves = jax.tree.leaves(variables.get(AUX_LOSSES, {}))
  return loss + sum(jnp.sum(leaf, dtype=jnp.float32) for leaf in leaves) if leaves else loss


def _micro_batches(batch: dict[str, jax.Array], accumulate_steps: int) -> dict[str, jax.Array]:
  """[B, ...] -> [A, B/A, ...]; micro-batch ``a`` holds rows a, a + A, a + 2A, ...

  Strided rather than contiguous so that a batch sharded over devices along B stays where it is: every
  device's rows split into A local micro-batches, and no example moves between devices.
  """
  def split(x):
    return jnp.swapaxes(x.reshape(x.shape[0] // accumulate_steps, accumulate_steps, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: nn.Module,
               tx: optax.GradientTransformation, terms: Terms, accumulate_steps: int = 1,
               prepare=None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on ``batch``; dropout/attention randomness from fold_in(state.rng, step).

  ``terms``: the objective's (loss, correct, weight) per label slot of the model's outputs; the step
  differentiates their weighted mean (``mean_loss_and_accuracy``). ``prepare(batch, key)``: the objective's
  pure transform of the batch before the model sees it, with its own key (fold_in(key of the step, 1 << 20)):
  the self-pretraining objectives mask or shift the inputs and replace the targets there.

  With ``accumulate_steps = A > 1`` the batch is A equal micro-batches (``_micro_batches``) run one
  after another in a ``lax.scan`` (so only one micro-batch's activations are alive); their mean
  gradients are averaged in float32 (= the gradient of the mean loss over the batch) and the optimizer
  steps once. Micro-batch ``a`` draws its randomness from fold_in(key of the step, a).
  """
  step_rng = jax.random.fold_in(state.rng, state.step)
  if prepare is not None:
    batch = prepare(batch, jax.random.fold_in(step_rng, PREPARE_STREAM))
  mutable = [*state.model_state, AUX_LOSSES]

  def grads_of(params, model_state, micro_batch, rng):
    dropout_rng, attention_rng = jax.random.split(rng)

    def loss_fn(params):
      logits, updated = model.apply(_variables(params, model_state), micro_batch, deterministic=False,
                                    rngs={"dropout": dropout_rng, "attention": attention_rng},
                                    mutable=mutable)
      task_loss, accuracy = mean_loss_and_accuracy(*terms(logits, micro_batch))
      loss = with_aux_losses(task_loss, updated)
      return loss, (accuracy, {name: updated[name] for name in model_state})

    (loss, (accuracy, new_model_state)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return grads, new_model_state, loss, accuracy

  if accumulate_steps == 1:
    grads, new_model_state, loss, accuracy = grads_of(state.params, state.model_state, batch, step_rng)
  else:
    def body(carry, inputs):
      grad_sum, model_state, loss_sum, accuracy_sum = carry
      index, micro_batch = inputs
      grads, model_state, loss, accuracy = grads_of(state.params, model_state, micro_batch,
                                                    jax.random.fold_in(step_rng, index))
      grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
      return (grad_sum, model_state, loss_sum + loss, accuracy_sum + accuracy), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    init = (zeros, state.model_state, jnp.zeros([], jnp.float32), jnp.zeros([], jnp.float32))
    (grad_sum, new_model_state, loss_sum, accuracy_sum), _ = jax.lax.scan(
        body, init, (jnp.arange(accumulate_steps), _micro_batches(batch, accumulate_steps)))
    grads = jax.tree.map(lambda g, p: (g / accumulate_steps).astype(p.dtype), grad_sum, state.params)
    loss, accuracy = loss_sum / accumulate_steps, accuracy_sum / accumulate_steps

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {"loss": loss, "accuracy": accuracy, "grad_norm": optax.global_norm(grads)}
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            model_state=new_model_state)
  return new_state, metrics


def eval_step(params, model_state, batch: dict[str, jax.Array], *, model: nn.Module, terms: Terms,
              prepare=None, prepare_key=None, num_classes: int = 0) -> dict[str, jax.Array]:
  """Sums over the real examples of ``batch`` (``weights`` [B] marks them): loss, correct and count over
  their labels (the objective's ``terms``: one per example in classification; the labelled slots in
  next-token tasks and in pretraining), and ``examples``. ``prepare``: as ``train_step``'s, with the fixed
  key ``prepare_key`` (every evaluation masks an example the same way). ``num_classes > 0`` (a task whose
  metric is ``macro``) adds per-class counts over the labels: ``class_labels`` (labels of the class),
  ``class_predicted`` (predictions of it) and ``class_correct`` (both), float32 [num_classes]."""
  if prepare is not None:
    batch = prepare(batch, prepare_key)
  logits = model.apply(_variables(params, model_state), batch, deterministic=True)
  weights = batch["weights"]
  ce, correct, weight = terms(logits, batch)
  weight = weight * weights.reshape(weights.shape + (1,) * (weight.ndim - 1))
  sums = {"loss": jnp.sum(ce * weight), "correct": jnp.sum(correct * weight), "count": jnp.sum(weight),
          "examples": jnp.sum(weights)}
  if num_classes:
    targets = jnp.where(batch["targets"] >= 0, batch["targets"], 0)
    label = jax.nn.one_hot(targets, num_classes, dtype=jnp.float32) * weight[..., None]
    predicted = jax.nn.one_hot(jnp.argmax(logits, -1), num_classes, dtype=jnp.float32) * weight[..., None]
    flat = lambda x: x.reshape(-1, num_classes).sum(0)
    sums.update(class_labels=flat(label), class_predicted=flat(predicted), class_correct=flat(label * predicted))
  return sums


# ``precision="auto"``: the compute dtype per backend (``jax.default_backend()``); any other backend: float32.
AUTO_PRECISION = {"gpu": "bfloat16", "tpu": "bfloat16", "cpu": "float32"}


def backend() -> str:
  """The platform the run computes on (``jax.default_backend()``; one function, so tests can replace it)."""
  return jax.default_backend()


def resolve_precision(precision: str, platform: str | None = None) -> str:
  """The dtype name ``precision`` means on ``platform`` (default: ``backend()``): "auto" is bfloat16 on a GPU or
  TPU and float32 on the CPU (``AUTO_PRECISION``); "float32" and "bfloat16" are themselves."""
  if precision != "auto":
    return precision
  return AUTO_PRECISION.get(platform or backend(), "float32")


def compute_dtype(config: ml_collections.ConfigDict):
  """Activation/matmul dtype of ``config.precision``, resolved on this backend (``resolve_precision``);
  parameters, optimizer state, softmax, norms and the loss stay float32."""
  return jnp.dtype(resolve_precision(config.precision))


def matmul_precision(platform: str | None = None) -> str:
  """What multiplies a run's float32 matmuls (the records' ``matmul_precision``; docs/usage.md, "Precision"):

  - ``jax_default_matmul_precision`` when it is set (``--jax_default_matmul_precision``, ``JAX_DEFAULT_MATMUL_
    PRECISION`` or ``jax.default_matmul_precision(...)``): its value, e.g. "highest", "tensorfloat32";
  - else "default (<what>)": ``cpu: float32`` (XLA's CPU multiplies float32 in float32); ``tf32 on gpu`` (an
    NVIDIA GPU of compute capability >= 8.0: XLA runs float32 dots in TF32 at the default precision);
    ``gpu: float32`` (an older GPU); ``tpu: bfloat16 passes`` (the TPU's default precision); the backend's
    name otherwise.

  The compute dtype is its own field: a bfloat16 run's dense layers multiply bfloat16 inputs whatever the
  setting; the setting decides every dot of a float32 run and a bfloat16 run's float32 dots (the cores and
  heads that compute in float32).
  """
  setting = jax.config.jax_default_matmul_precision
  if setting:
    return str(setting).lower()
  platform = platform or backend()
  if platform == "gpu":
    capability = getattr(jax.devices()[0], "compute_capability", None)
    try:
      major = int(str(capability).split(".")[0])
    except ValueError:  # an unknown (non-NVIDIA) GPU
      return "default (gpu)"
    return "default (tf32 on gpu)" if major >= 8 else "default (gpu: float32)"
  return {"cpu": "default (cpu: float32)", "tpu": "default (tpu: bfloat16 passes)"}.get(platform,
                                                                                        f"default ({platform})")


def precision_fields(config: ml_collections.ConfigDict) -> dict[str, str]:
  """The records' ``compute_dtype`` (the resolved dtype's name) and ``matmul_precision`` of ``config`` on this
  backend."""
  return {"compute_dtype": compute_dtype(config).name, "matmul_precision": matmul_precision()}


def example_batch(element_spec, batch_size: int) -> dict[str, np.ndarray]:
  """Zeros shaped like one batch of a dataset with ``element_spec`` (for init and compiling)."""
  return {key: np.zeros((batch_size, *spec.shape[1:]), getattr(spec.dtype, "as_numpy_dtype", spec.dtype))
          for key, spec in element_spec.items()}  # a tf.TensorSpec's dtype, or a numpy one (ArraySpec)


# Programs that run once (the initial state, the report's attention probes) are compiled on CPU without
# LLVM's optimizations: about half the compile time (the init program took ~1.5 s of a ~10 s smoke run).
# The random bits are the same (integer threefry); a float may differ from the optimized program's in
# its last bit (measured on the smoke models' initial parameters: <= 3e-7 relative, in a few dozen
# entries of a dense kernel), the same way every time. Other backends compile as usual.
# What a run that cannot fit in memory can change (xla_stats.check_fits names the sizes).
MEMORY_FIX = ("lower data.max_length or batch_size (or raise accumulate_steps), or use an attention whose "
              "memory grows more slowly with the length")
RUN_ONCE_COMPILER_OPTIONS = {"cpu": {"xla_backend_optimization_level": 0}}


def compile_run_once(fn, *args, out_shardings=None):
  """``jax.jit(fn)`` compiled for ``args`` with ``RUN_ONCE_COMPILER_OPTIONS`` (for a program run once)."""
  options = RUN_ONCE_COMPILER_OPTIONS.get(jax.default_backend())
  return jax.jit(fn, out_shardings=out_shardings).lower(*args).compile(compiler_options=options)


def state_initializer(config, model, tx, batch: dict[str, np.ndarray]):
  """The pure function that creates the initial ``TrainState`` (parameters from PRNGKey(seed));
  ``batch`` only provides shapes. ``jax.eval_shape`` of it is the abstract state."""
  def create():
    rng = jax.random.PRNGKey(config.seed)
    params_rng, dropout_rng, attention_rng, train_rng = jax.random.split(rng, 4)
    variables = dict(model.init({"params": params_rng, "dropout": dropout_rng, "attention": attention_rng},
                                batch, deterministic=True))
    params = variables.pop("params")
    variables.pop(AUX_LOSSES, None)  # per-call outputs, not state
    return TrainState(step=jnp.asarray(0, jnp.int32), params=params, opt_state=tx.init(params),
                      model_state=variables, rng=train_rng)
  return create


def init_state(config, model, tx, batch: dict[str, np.ndarray], *, shardings=None) -> TrainState:
  """The initial state (``state_initializer``), compiled and run; ``batch`` only provides shapes.

  ``shardings``: None (default placement), or a function from the abstract state to its shardings
  (``partial(parallel.state_shardings, mesh=...)``); the state is then created where it lives.
  """
  create = state_initializer(config, model, tx, batch)
  out_shardings = shardings(jax.eval_shape(create)) if shardings else None
  compiled = compile_run_once(create, out_shardings=out_shardings)
  xla_stats.check_fits(compiled, "parameter initialisation (one forward pass)", MEMORY_FIX)
  return compiled()
