"""The shared LRA encoder and classifier heads; the attention core comes from the registry by name.

Matches the Transformer of google-research/long-range-arena (``lra_benchmarks/models/transformer``,
its ``layers/common_layers.py`` and ``classifier_head``): token embedding N(0, 1), sinusoidal or learned
(N(0, 0.02)) positions, optional learned CLS vector prepended, pre-LN blocks [LN -> multi-head attention
-> dropout -> residual; LN -> Dense -> GELU -> dropout -> Dense -> dropout -> residual], final LayerNorm,
pooling (CLS / MEAN / SUM / MAX), head Dense(mlp) -> ReLU -> Dense(classes). Two-input tasks share one
encoder and classify [u, v, u*v, u-v] (the LRA paper's dual encoder, eq. 1; the LRA code's default head
concatenated [u, v] only and its Retrieval runs crashed: docs/lra_protocol.md §3.5). Model facts:
docs/lra_protocol.md §3.

Axis legend: ``B`` batch, ``T`` tokens, ``E`` embedding, ``H`` heads, ``D`` head dim, ``C`` classes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import attention_zoo

POOLINGS = ("CLS", "MEAN", "SUM", "MAX")
POSITIONS = ("sinusoidal", "learned", "none")


def sinusoidal_positions(length: int, dim: int, max_scale: float = 10_000.0) -> np.ndarray:
  """[T, E] fixed sin/cos table (first half sin, second half cos), as the LRA code."""
  position = np.arange(length)[:, None]
  half = dim // 2
  scale = np.exp(-np.log(max_scale) * np.arange(half) / max(half - 1, 1))
  table = np.zeros((length, dim), np.float32)
  table[:, :half] = np.sin(position * scale)
  table[:, half:2 * half] = np.cos(position * scale)
  return table


class CoreOutputError(ValueError):
  """An attention core returned something other than ``[B, L, H, V]`` in the dtype of its values."""


def check_core_output(name: str, out: Any, value: jax.Array) -> None:
  """Raises ``CoreOutputError`` naming the core and its module unless ``out`` has ``value``'s shape
  ``[B, L, H, V]`` and dtype (CONTRACT 1). Runs at trace time: the shapes are static."""
  _check_output(out, value, f"attention {name!r} (module {attention_zoo.defining_module(name)})",
                "a core must return [B, L, H, V]", "the values' dtype", name)


def _check_output(out: Any, like: jax.Array, who: str, contract: str, dtype_text: str, name: str) -> None:
  shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
  if shape is not None and tuple(shape) == tuple(like.shape) and dtype == like.dtype:
    return
  got = f"{type(out).__name__}" if shape is None else f"{dtype} {list(shape)}"
  raise CoreOutputError(f"{who} returned {got}; {contract} = {list(like.shape)} in {dtype_text} {like.dtype}; "
                        f"`lra-bench check {name}` runs the conformance checks")


def dense_inits(config) -> tuple[Any, Any]:
  """(kernel init of a block's input-side Dense layers, kernel init of its residual-side output layers).

  ``model.dense_init_std`` (optional): N(0, std²) for the attention's Q/K/V and the MLP's first layer,
  and N(0, (std / sqrt(2 · num_layers))²) for the attention's output and the MLP's second layer when
  ``model.residual_init_rescale`` is on (GPT-2's scheme, as Zoology's and seq_icl's ``_init_weights``;
  std otherwise). Absent: ``(None, None)``, each layer keeps its own default (xavier-uniform for the
  attention, LeCun normal for the MLP).
  """
  std = config.get("dense_init_std")
  if std is None:
    return None, None
  out_std = std / math.sqrt(2 * config.num_layers) if config.get("residual_init_rescale", False) else std
  return nn.initializers.normal(std), nn.initializers.normal(out_std)


class MultiHeadAttention(nn.Module):
  """Q/K/V/out projections (xavier-uniform unless ``kernel_init``/``out_kernel_init`` are given:
  ``dense_inits``) around a registered attention core. No biases, as LRA's; ``use_bias``
  (``model.attention_bias``) adds zero-initialised ones to all four projections, as the PyTorch MHA of
  Zoology and seq_icl (``nn.Linear(..., bias=True)`` whose ``_init_weights`` zeroes the biases)."""

  num_heads: int
  qkv_dim: int
  attention: str
  attention_kwargs: Mapping[str, Any]
  dropout_rate: float
  dtype: Any = jnp.float32
  shared_core: nn.Module | None = None  # a core owned by the encoder, the same in every layer
  kernel_init: Any = None      # Q/K/V kernels; None: xavier-uniform
  out_kernel_init: Any = None  # the output kernel; None: xavier-uniform
  use_bias: bool = False       # zero-initialised biases on Q/K/V/out

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    """x: [B, T, E]; mask: bool [B, T] -> [B, T, E]."""
    if self.qkv_dim % self.num_heads:
      raise ValueError(f"qkv_dim {self.qkv_dim} is not divisible by num_heads {self.num_heads}")
    head_dim = self.qkv_dim // self.num_heads
    dense = lambda name: nn.DenseGeneral((self.num_heads, head_dim), use_bias=self.use_bias, name=name,
                                         kernel_init=self.kernel_init or nn.initializers.xavier_uniform(),
                                         dtype=self.dtype)
    q, k, v = dense("query")(x), dense("key")(x), dense("value")(x)        # [B, T, H, D]
    core = self.shared_core
    if core is None:
      core = attention_zoo.create_layer(self.attention, dropout_rate=self.dropout_rate,
                                        **dict(self.attention_kwargs)).clone(parent=self, name="core")
    out = core(q, k, v, mask=mask, deterministic=deterministic)
    check_core_output(self.attention, out, v)
    return nn.DenseGeneral(x.shape[-1], axis=(-2, -1), use_bias=self.use_bias, name="out",
                           kernel_init=self.out_kernel_init or nn.initializers.xavier_uniform(),
                           dtype=self.dtype)(out)


NORMS = ("layer", "batch", "scale")
NORM_POSITIONS = ("pre", "post")
MLP_ACTIVATIONS = {"gelu": nn.gelu, "silu": nn.silu}
HEADS = ("mlp", "linear")
# ``model.head_activation``: the mlp head's hidden activation (LRA's ReLU; S4's and S5's retrieval heads and
# Mega's classifier use GELU): "gelu" is the erf form, torch's nn.GELU (S4, Mega; S5's flax head used the tanh
# form, within 1e-3 of it).
HEAD_ACTIVATIONS = {"relu": nn.relu, "gelu": lambda x: nn.gelu(x, approximate=False)}
# ``model.dual_features``: the two-input tasks' features of the pooled u, v: "nli" [u, v, u*v, u-v] (the LRA
# paper's, S4's and S5's retrieval heads) or "concat" [u, v] (Mega's ``fairseq/models/lra/model.py``).
DUAL_FEATURES = ("nli", "concat")
# ``model.token_embedding``: "lookup" (an embedding table, N(0, embed_init_std²)) or "onehot_dense" (a Dense
# layer with bias applied to one-hot tokens, LeCun normal over the vocabulary: S5's and minimal-LRU's encoder
# ``nn.Dense(d_model)`` on one-hot inputs; computed as a row lookup plus the bias).
TOKEN_EMBEDDINGS = ("lookup", "onehot_dense")


class ScaleNorm(nn.Module):
  """Mega's ScaleNorm: ``x / sqrt(mean(x²) + eps) · g`` over the features with one learned scalar ``g``
  (initialised to 1)."""

  epsilon: float = 1e-5
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    g = self.param("scalar", nn.initializers.ones, (1,))
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + self.epsilon) * g
    return y.astype(self.dtype)


def make_norm(kind: str, dtype, name: str | None = None, momentum: float = 0.9):
  """The normalisation ``model.norm`` names, as ``norm(x, mask, deterministic)``: ``layer`` (LayerNorm,
  LRA's; auto-named as before, so the LRA models' parameter trees are unchanged), ``batch`` (BatchNorm
  over batch and length, the S4 / S5 / LRU recipes; statistics over real positions only, running
  averages with ``momentum`` (``model.batch_norm_momentum``, default 0.9 = PyTorch's 0.1: S4, Mega; S5's
  scripts 0.95 or 0.9, minimal-LRU flax's default 0.99), used when ``deterministic``) or ``scale`` (Mega's
  ScaleNorm). Call it inside a compact method."""
  if kind == "layer":
    layer_norm = nn.LayerNorm(dtype=dtype, name=name)
    return lambda x, mask, deterministic: layer_norm(x)
  if kind == "scale":
    scale_norm = ScaleNorm(dtype=dtype, name=name)
    return lambda x, mask, deterministic: scale_norm(x)
  if kind == "batch":
    batch_norm = nn.BatchNorm(momentum=momentum, epsilon=1e-5, dtype=dtype, name=name)
    return lambda x, mask, deterministic: batch_norm(
        x, use_running_average=deterministic, mask=jnp.broadcast_to(mask[..., None], x.shape))
  raise ValueError(f"unknown model.norm {kind!r}; expected one of {NORMS}")


def _norm(c, dtype, name: str | None = None):
  """``make_norm`` of the model config ``c`` (its ``norm`` and ``batch_norm_momentum``)."""
  return make_norm(c.get("norm", "layer"), dtype, name, c.get("batch_norm_momentum", 0.9))


def _dropout(c, rate: float):
  """Dropout of the block; ``model.dropout_broadcast_time``: one mask per example shared over the length
  axis (S4 / S5's "dropout tied over time")."""
  return nn.Dropout(rate, broadcast_dims=(1,) if c.get("dropout_broadcast_time", False) else ())


class EncoderBlock(nn.Module):
  """One block: the sequence sub-layer (multi-head attention around a registered core, or a registered
  sequence mixer: ``attention_zoo.mixers``), then the MLP sub-layer (``model.mlp``, default on).

  Optional model keys (absent from the LRA protocols' configs, whose models are unchanged): ``norm``
  (``NORMS``, default ``layer``), ``norm_position`` (``pre``: norm -> sub-layer -> dropout -> residual,
  LRA's; ``post``: sub-layer -> dropout -> residual -> norm), ``mlp_activation`` (``gelu``; Mega's ``silu``),
  ``dropout_broadcast_time`` (False), ``residual_dropout`` (True: the sub-layer's output is dropped before
  the residual add, as LRA's and S4's blocks do; False: added as it is, as S5's and minimal-LRU's
  ``SequenceLayer``, whose layers end in their own dropout), ``mlp_hidden_dropout_rate`` (the FFN's dropout
  after its activation; default ``dropout_rate``; Mega's ``act_dropout`` 0), ``identity_state_mixer`` (False;
  with ``mlp`` False: the MLP sub-layer is the identity, x + dropout(norm(x)), Zoology's ``TransformerBlock``
  with ``state_mixer`` Identity, whose block adds ``norm2(residual)`` to the residual stream).
  """

  config: Any  # the ``model`` ConfigDict
  dtype: Any = jnp.float32
  shared_core: nn.Module | None = None  # ``model.share_attention_core``: the encoder's one core

  def _sublayer(self, x, mask, deterministic, fn, gated=False):
    c = self.config
    post = c.get("norm_position", "pre") == "post"
    norm = _norm(c, self.dtype)
    y = x if post else norm(x, mask, deterministic)
    if gated or not c.get("residual_dropout", True):  # gated: the sub-layer gates its own residual (Mega)
      x = x + fn(y, x)
    else:
      x = x + _dropout(c, c.dropout_rate)(fn(y, x), deterministic=deterministic)
    return norm(x, mask, deterministic) if post else x

  @nn.compact
  def __call__(self, x, mask, deterministic: bool):
    c = self.config
    in_init, out_init = dense_inits(c)
    layer, gated = sequence_layer(self, c, mask, deterministic, dtype=self.dtype, shared_core=self.shared_core,
                                  kernel_init=in_init, out_kernel_init=out_init)
    x = self._sublayer(x, mask, deterministic, layer, gated)
    if not c.get("mlp", True):  # sequence-layer-only blocks (the SSM recipes, the CPU recall models)
      if c.get("identity_state_mixer", False):  # Zoology's block: its Identity state mixer still adds norm2(x)
        return self._sublayer(x, mask, deterministic, lambda y, _: y)
      return x
    activation = MLP_ACTIVATIONS[c.get("mlp_activation", "gelu")]
    hidden_rate = c.get("mlp_hidden_dropout_rate", c.dropout_rate)

    def mlp(y, _):
      y = nn.Dense(c.mlp_dim, dtype=self.dtype, kernel_init=in_init or nn.linear.default_kernel_init)(y)
      y = _dropout(c, hidden_rate)(activation(y), deterministic=deterministic)
      return nn.Dense(x.shape[-1], dtype=self.dtype, kernel_init=out_init or nn.linear.default_kernel_init)(y)

    return self._sublayer(x, mask, deterministic, mlp)


def sequence_layer(block: nn.Module, c, mask, deterministic: bool, *, dtype=jnp.float32,
                   shared_core: nn.Module | None = None, kernel_init=None, out_kernel_init=None):
  """The one factory of an encoder block's sequence sub-layer, called inside ``block``'s compact method:
  ``(layer, gated)`` where ``layer(y, residual) -> [B, T, E]`` maps the normalised block input ``y [B, T, E]``
  (``residual``: the block input before the normalisation) and ``gated`` says the layer gates its own
  residual (``LayerConfig.gated_residual``: the block adds its output as it is).

  The layer named ``c.attention`` is either kind of ``attention_zoo``'s one registry: an attention core
  inside :class:`MultiHeadAttention` (the harness owns Q/K/V/out; auto-named ``MultiHeadAttention_0`` as
  always), or a sequence mixer (it owns its projections; named ``mixer``), called with the padded positions
  of ``y`` zeroed (the mixer contract) and ``residual=`` when gated. Either way its output is checked once:
  ``[B, T, E]`` in ``y``'s dtype, else :class:`CoreOutputError` naming the layer and its module.
  """
  name = c.attention
  kwargs = dict(c.attention_kwargs)
  if attention_zoo.layer_kind(name) == "mixer":
    mixer = attention_zoo.create_layer(name, **{"dropout_rate": c.dropout_rate, **kwargs})
    mixer = mixer.clone(parent=block, name="mixer")
    gated = bool(type(mixer.config).gated_residual)

    def call(y, residual):
      zeroed = y * mask[..., None].astype(y.dtype)  # the contract: padded inputs are zero
      return mixer(zeroed, mask, deterministic, **({"residual": residual} if gated else {}))
  else:
    attention = MultiHeadAttention(c.num_heads, c.qkv_dim, name, c.attention_kwargs, c.attention_dropout_rate,
                                   dtype, shared_core=shared_core, kernel_init=kernel_init,
                                   out_kernel_init=out_kernel_init, use_bias=c.get("attention_bias", False))
    gated = False
    call = lambda y, residual: attention(y, mask, deterministic)

  def layer(y, residual):
    out = call(y, residual)
    check_layer_output(name, out, y)
    return out

  return layer, gated


# What the records' ``attention_implementation`` says of a ``flash`` model whose answer is "cudnn" when the
# compiled program holds no cuDNN fused-attention call (XLA's custom-call targets ``__cudnn$fmha...``).
CUDNN_NOT_FOUND = "cudnn (not found in compiled program)"
CUDNN_FMHA_TARGET = "__cudnn$fmha"


def core_dropout_rate(c) -> float:
  """The attention dropout rate of ``model`` config ``c``'s attention core: ``attention_kwargs.dropout_rate``,
  else ``attention_dropout_rate``."""
  return float(c.attention_kwargs.get("dropout_rate", c.attention_dropout_rate))


def attention_implementation(c, dtype, *, training: bool, compiled=None, compiled_text: str | None = None,
                             backend: str | None = None) -> str | None:
  """What computes the attention of a model whose layer is ``flash`` (the records' ``attention_implementation``);
  None for every other layer. ``c``: the ``model`` ConfigDict; ``dtype``: the compute dtype.

  The answer is ``attention_zoo.flash.resolve_implementation(core config, dtype, backend)`` ("cudnn", "pallas",
  "xla", "blockwise", "explicit (training dropout)"), asked of the core as the model builds it: with its
  attention dropout when ``training`` (the train step), without it otherwise (evaluation is deterministic).
  "cudnn" is checked against ``compiled_text``, or the text of the compiled program ``compiled`` (read only for
  a ``flash`` model), when given: without a cuDNN fused-attention custom call there, ``CUDNN_NOT_FOUND``.
  """
  if c.attention != "flash":
    return None
  from attention_zoo import flash  # the one layer this describes; imported where it is asked about

  kwargs = {k: v for k, v in c.attention_kwargs.items() if k != "dropout_rate"}
  core = attention_zoo.layer_config("flash", dropout_rate=core_dropout_rate(c) if training else 0.0, **kwargs)
  name = flash.resolve_implementation(core, dtype, backend)
  if compiled_text is None and compiled is not None:
    compiled_text = compiled.as_text()
  if name == "cudnn" and compiled_text is not None and CUDNN_FMHA_TARGET not in compiled_text:
    return CUDNN_NOT_FOUND
  return name


def check_layer_output(name: str, out: Any, x: jax.Array) -> None:
  """Raises ``CoreOutputError`` unless a sequence layer returned ``[B, L, E]`` in its input's dtype."""
  config = attention_zoo.layer_config(name)
  _check_output(out, x, f"{type(config).noun} {name!r} (module {attention_zoo.defining_module(name)})",
                "a sequence layer must return [B, L, E]", "its input's dtype", name)


def causal_form_problem(config) -> str | None:
  """Why the layer of a run ``config`` cannot run as configured causal (its ``causal=True`` raises
  ``NotImplementedError`` when the block its factory builds is traced at the config's shapes), else None
  (also when it is not causal). Traced with ``jax.eval_shape``, never compiled: milliseconds per layer."""
  if config.model.attention_kwargs.to_dict().get("causal") is not True:
    return None
  keys = {name: jax.random.PRNGKey(i) for i, name in enumerate(("params", "dropout", "attention"))}
  x = jax.ShapeDtypeStruct((1, config.data.max_length, config.model.emb_dim), jnp.float32)
  mask = jax.ShapeDtypeStruct((1, config.data.max_length), jnp.bool_)
  block = EncoderBlock(config.model)
  try:
    jax.eval_shape(lambda x, m: block.init(keys, x, m, deterministic=True), x, mask)
  except NotImplementedError as err:
    return str(err).split("\n")[0]
  return None


class OneHotDense(nn.Module):
  """A Dense layer (with bias) applied to one-hot tokens: ``kernel[ids] + bias`` [B, T, E], kernel [V, E]
  LeCun normal over the V inputs, zero bias (flax's ``nn.Dense`` on ``one_hot(ids, V)``, the token encoder of
  S5 and minimal-LRU), without materialising the one-hot array."""

  vocab_size: int
  features: int

  @nn.compact
  def __call__(self, ids):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (self.vocab_size, self.features))
    bias = self.param("bias", nn.initializers.zeros, (self.features,))
    return jnp.take(kernel, ids, axis=0) + bias


class Encoder(nn.Module):
  """Inputs [B, T] -> (features [B, T', E], mask [B, T']) with T' = T + 1 when a CLS is prepended.

  ``model.input_kind``: ``tokens`` (int ids, embedded; id 0 is padding — pixel tasks shift pixels by one
  so black is not padding) or ``pixels`` (float values, one per position, through a dense projection;
  nothing is padding). Optional keys: ``first_real_id`` (1: ids below it are padding; 2 makes black pixels,
  id 1, padding as Xiong et al.'s ``mask = input_ids != 0`` on raw pixel ids), ``token_embedding``
  (``TOKEN_EMBEDDINGS``), ``final_norm`` (True: with pre-norm blocks a norm after the last one, as LRA's, S4's
  and Mega's encoders; False: none, as S5's and minimal-LRU's ``StackedEncoderModel``).
  """

  config: Any
  vocab_size: int
  dtype: Any = jnp.float32
  embed: nn.Module | None = None  # a shared embedding (a language model's tied output layer); else its own

  @nn.compact
  def __call__(self, inputs, deterministic: bool, pixel_mask=None):
    """``pixel_mask`` (bool [B, T], float pixels only; the masked self-pretraining stage): the masked
    positions (their inputs zeroed by the caller) get a learned vector ``pixel_mask_embedding`` added to
    their projection: the same function as the SPT paper's dense projection of [x·(1 − m), m], whose mask
    column is that vector; fine-tuning, without a mask, leaves it out."""
    c = self.config
    if c.get("input_kind", "tokens") == "pixels":  # the kind was checked by training.config.validate
      mask = jnp.ones(inputs.shape, bool)
      x = nn.Dense(c.emb_dim, dtype=self.dtype, name="pixel_projection")(inputs[..., None].astype(self.dtype))
      if pixel_mask is not None:
        vector = self.param("pixel_mask_embedding", nn.initializers.normal(0.02), (c.emb_dim,))
        x = x + pixel_mask[..., None].astype(self.dtype) * vector.astype(self.dtype)
    else:
      if not jnp.issubdtype(inputs.dtype, jnp.integer):
        raise TypeError(f"model.input_kind='tokens' needs integer inputs, got {inputs.dtype}")
      mask = inputs >= c.get("first_real_id", 1)
      if self.embed is None and c.get("token_embedding", "lookup") == "onehot_dense":
        x = OneHotDense(self.vocab_size, c.emb_dim, name="embed")(inputs).astype(self.dtype)
      else:
        embed = self.embed if self.embed is not None else nn.Embed(
            self.vocab_size, c.emb_dim, name="embed",
            embedding_init=nn.initializers.normal(c.get("embed_init_std", 1.0)))
        x = embed(inputs).astype(self.dtype)
    if c.pooling == "CLS":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, c.emb_dim))
      x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, c.emb_dim)).astype(self.dtype), x], 1)
      mask = jnp.concatenate([jnp.ones_like(mask[:, :1]), mask], axis=1)
    length = x.shape[1]
    if c.positions == "sinusoidal":
      x = x + jnp.asarray(sinusoidal_positions(length, c.emb_dim), self.dtype)[None]
    elif c.positions == "learned":
      x = x + self.param("positions", nn.initializers.normal(0.02), (1, length, c.emb_dim)).astype(self.dtype)
    elif c.positions != "none":
      raise ValueError(f"unknown positions {c.positions!r}; expected one of {POSITIONS}")
    x = nn.Dropout(c.get("embed_dropout_rate", c.dropout_rate))(x, deterministic=deterministic)
    shared = None
    if c.get("share_attention_core", False):  # one core (its parameters, e.g. Linformer's E) for all layers
      if not type(attention_zoo.layer_config(c.attention)).shareable:
        raise ValueError(f"model.share_attention_core applies to layers one instance of which may serve every "
                         f"block (attention cores); {c.attention!r} is not one")
      shared = attention_zoo.create_layer(c.attention, dropout_rate=c.attention_dropout_rate,
                                          **dict(c.attention_kwargs)).clone(parent=self, name="shared_core")
    # ``model.remat``: each block's activations are recomputed in the backward pass instead of kept (the
    # parameters, their names and the values are the same); ``deterministic`` (argument 3, after the module
    # itself) is static, a Python bool that picks the dropout branches
    block = nn.remat(EncoderBlock, static_argnums=(3,)) if c.get("remat", False) else EncoderBlock
    for i in range(c.num_layers):
      x = block(c, self.dtype, name=f"block_{i}", shared_core=shared)(x, mask, deterministic)
    if c.get("norm_position", "pre") == "post":  # every block ended in a norm (S4's encoder has no final one)
      return x, mask
    if not c.get("final_norm", True):  # S5's and minimal-LRU's encoders end with the last block
      return x, mask
    return _norm(c, self.dtype, name="encoder_norm")(x, mask, deterministic), mask


def pool(x, mask, how: str):
  """[B, T, E] -> [B, E] over real tokens."""
  weights = mask[..., None].astype(x.dtype)
  if how == "CLS":
    return x[:, 0]
  if how == "MEAN":
    return jnp.sum(x * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1.0)
  if how == "SUM":
    return jnp.sum(x * weights, 1)
  if how == "MAX":
    return jnp.max(jnp.where(mask[..., None], x, jnp.finfo(x.dtype).min), 1)
  raise ValueError(f"unknown pooling {how!r}; expected one of {POOLINGS}")


class Classifier(nn.Module):
  """The LRA model: one encoder, one or two inputs, classifier head -> logits [B, C] (float32)."""

  config: Any
  vocab_size: int
  num_classes: int
  dual_input: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True):
    c = self.config
    encoder = Encoder(c, self.vocab_size, self.dtype, name="encoder")
    if self.dual_input:
      u = pool(*encoder(batch["inputs1"], deterministic), c.pooling)
      v = pool(*encoder(batch["inputs2"], deterministic), c.pooling)
      pair = [u, v] if c.get("dual_features", "nli") == "concat" else [u, v, u * v, u - v]
      features = jnp.concatenate(pair, axis=-1)
    else:
      features = pool(*encoder(batch["inputs"], deterministic), c.pooling)
    if c.get("head", "mlp") == "linear":  # the S4 / S5 / LRU decoder: one linear layer after pooling
      return nn.Dense(self.num_classes, dtype=self.dtype, name="head_out")(features).astype(jnp.float32)
    hidden = nn.Dense(c.mlp_dim, dtype=self.dtype, name="head_hidden")(features)
    # Mega's classifier: Linear -> dropout -> GELU (model.head_dropout_rate, absent: none, as LRA's head)
    hidden = nn.Dropout(c.get("head_dropout_rate", 0.0))(hidden, deterministic=deterministic)
    hidden = HEAD_ACTIVATIONS[c.get("head_activation", "relu")](hidden)
    return nn.Dense(self.num_classes, dtype=self.dtype, name="head_out")(hidden).astype(jnp.float32)


class LanguageModel(nn.Module):
  """The next-token model of the recall tasks (``tasks.base``: objective ``"next_token"``).

  The same encoder, its attention cores causal (``model.attention_kwargs.causal = True``, required by
  ``config.validate``), then the vocabulary layer evaluated only at ``batch["positions"]`` [B, Q] ->
  logits [B, Q, V] (float32). ``model.tie_embeddings``: the output layer is the input embedding's
  transpose (Zoology's tied LM head), else a Dense layer with bias. Optional model keys (absent from
  the LRA protocols' configs, so their configs and hashes are unchanged): ``mlp`` (False: attention-only
  blocks), ``embed_init_std`` (1.0, LRA's N(0, 1); Zoology 0.02), ``embed_dropout_rate`` (default
  ``dropout_rate``), ``tie_embeddings`` (False).
  """

  config: Any
  vocab_size: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True):
    c = self.config
    embed = nn.Embed(self.vocab_size, c.emb_dim, name="embed",
                     embedding_init=nn.initializers.normal(c.get("embed_init_std", 1.0)))
    x, _ = Encoder(c, self.vocab_size, self.dtype, embed=embed, name="encoder")(batch["inputs"], deterministic)
    positions = jnp.clip(batch["positions"], 0, x.shape[1] - 1)
    h = jnp.take_along_axis(x, positions[..., None], axis=1)              # [B, Q, E]
    if c.get("tie_embeddings", False):
      return embed.attend(h.astype(jnp.float32)).astype(jnp.float32)
    return nn.Dense(self.vocab_size, dtype=self.dtype, name="lm_head")(h).astype(jnp.float32)


class Pretrainer(nn.Module):
  """The self-pretraining model (``lra_bench.training.objectives``: masked and causal pretraining): the
  classifier's encoder (the same ``encoder`` parameters, so fine-tuning starts from them) with a prediction
  head at every position instead of pooling and classifying.

  Token inputs: logits [B, T, V] over the task's vocabulary (``vocab_size``; the encoder's embedding has
  one more row, the mask id ``vocab_size``). Float pixels: one value per position [B, T] (the regression
  of the masked, or next, pixel). Two-input tasks: both documents, outputs concatenated along the length.
  A prepended CLS vector's output is dropped (it predicts nothing).
  """

  config: Any
  vocab_size: int
  dual_input: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True):
    c = self.config
    pixels = c.get("input_kind", "tokens") == "pixels"
    encoder = Encoder(c, self.vocab_size + (0 if pixels else 1), self.dtype, name="encoder")
    names = ("inputs1", "inputs2") if self.dual_input else ("inputs",)
    features = []
    for name in names:
      x, _ = encoder(batch[name], deterministic, pixel_mask=batch.get(f"{name}_pixel_mask"))
      features.append(x[:, 1:] if c.pooling == "CLS" else x)
    h = jnp.concatenate(features, axis=1)
    if pixels:
      return nn.Dense(1, dtype=self.dtype, name="pixel_head")(h)[..., 0].astype(jnp.float32)
    return nn.Dense(self.vocab_size, dtype=self.dtype, name="token_head")(h).astype(jnp.float32)
