"""``lra-bench new attention NAME [--style linen|nnx|function]``: the two files a researcher starts a new
core from.

``<dir>/<name>.py`` is a registered core that already works (exact softmax attention with the padding
and causal masks, every block to change marked REPLACE), written as a ``flax.linen`` module, a
``flax.nnx`` module or a plain parameter-free function (``attention_zoo.registry`` wraps the last two),
so the first ``lra-bench check`` passes and each edit after it can be checked against a green baseline.
``<dir>/test_<name>.py`` runs the conformance kit (``lra_bench.testing``) and a float64 reference test
of the placeholder's math, which the researcher replaces with their method's. Nothing is overwritten.
"""

from __future__ import annotations

import importlib.util
import keyword
import os
import re
import shlex

import attention_zoo
from lra_bench.errors import ConfigError

_NAME = re.compile(r"[a-z][a-z0-9_]*")

STYLES = ("linen", "nnx", "function")  # how the core is written (README "Add your own attention")

HEADER = '''\
"""{name}: REPLACE with one line saying what the method computes and the paper it comes from.

Axis legend: ``B`` batch, ``Q`` query positions, ``K`` key positions (both of length L), ``H`` heads,
``D`` query/key head dim, ``V`` value dim.

Written by ``lra-bench new attention {name} --style {style}`` ({style_doc}): the body is exact
softmax attention, a working placeholder, so ``lra-bench check {name} --plugin {name}`` passes before
the first edit. REPLACE the marked blocks with your method and keep the contract of an attention core:
padded keys get exactly zero weight, real outputs never depend on what padded positions hold,
``causal=True`` never looks ahead (or raises ``NotImplementedError`` saying why), randomness only from
the flax RNG streams ``dropout`` and ``attention``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar
{imports}
import jax
import jax.numpy as jnp
import numpy as np

from attention_zoo.registry import AttentionConfig, register_attention


@dataclasses.dataclass(frozen=True)
class {cls}Config(AttentionConfig):
  """Options of ``{name}`` (``causal`` and ``dropout_rate`` are inherited). Add fields here (e.g.
  ``window: int = 64``); a run sets them with ``--set model.attention_kwargs.<field>=<value>``."""

  # What the core promises about its effective attention matrix P (its output for value = identity)
  # on the rows of real queries; the conformance kit checks exactly these. REPLACE when your method
  # is not a softmax over keys (e.g. a kernel feature map or a low-rank projection: set them False).
  nonnegative: ClassVar[bool] = True        # P >= 0
  rows_sum_to_one: ClassVar[bool] = True    # every real row of P sums to 1
  paper_name: ClassVar[str | None] = None   # the model's row in a published LRA table, if it has one

  def support(self, length: int) -> np.ndarray | None:
    """bool [L, L] (query, key): the only pairs that may get non-zero weight, or None (no fixed
    pattern). REPLACE for a sparse method, e.g. a band ``abs(i - j) <= window``."""
    del length
    return None


'''

# The placeholder's math, one text for the three styles: {config} is where the style reads its config,
# {dropout} its attention dropout.
MATH = '''\
batch, length = query.shape[:2]
mask = jnp.ones((batch, length), bool) if mask is None else mask.astype(bool)
# Normalisation in float32 whatever the input dtype (bf16 runs), float64 in reference tests.
dtype = jnp.result_type(jnp.float32, query.dtype)

# ---- REPLACE from here: the placeholder, exact softmax attention --------------------------
logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=dtype)
logits = logits / math.sqrt(query.shape[-1])                               # [B, H, Q, K]
allowed = mask[:, None, None, :]                                           # padded keys: weight 0
if {config}.causal:
  allowed = allowed & (jnp.arange(length)[None, :] <= jnp.arange(length)[:, None])  # key j <= query i
logits = jnp.where(allowed, logits, -1e30)
peak = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
weights = jnp.exp(logits - peak) * allowed                                 # exact zeros where masked
total = jnp.sum(weights, axis=-1, keepdims=True)
weights = weights / jnp.where(total > 0, total, 1.0)                       # a fully padded row: zeros
{dropout}
out = jnp.einsum("bhqk,bkhv->bqhv", weights.astype(value.dtype), value, preferred_element_type=dtype)
# ---- to here ------------------------------------------------------------------------------
return out.astype(value.dtype)'''

LINEN = '''\
@register_attention("{name}", {cls}Config)
class {cls}(nn.Module):
  """REPLACE: the method in one paragraph (the placeholder is softmax(q k^T / sqrt(D) + masks) v)."""

  config: {cls}Config

  @nn.compact
  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] (True = real) -> [B, L, H, V]."""
{math}
'''

NNX = '''\
@register_attention("{name}", {cls}Config)
class {cls}(nnx.Module):
  """REPLACE: the method in one paragraph (the placeholder is softmax(q k^T / sqrt(D) + masks) v).

  An NNX module: lra-bench builds it as ``{cls}(config, rngs=rngs)`` inside its linen model (through
  ``flax.nnx.bridge.ToLinen``); ``rngs`` carries the model's ``dropout`` and ``attention`` streams.
  """

  def __init__(self, config: {cls}Config, *, rngs: nnx.Rngs):
    self.config = config
    # Method parameters are nnx.Param attributes (e.g. ``self.scale = nnx.Param(jnp.ones(()))``, read
    # as ``self.scale[...]``); they train with the rest of the model.
    self.dropout = nnx.Dropout(config.dropout_rate, rngs=rngs)  # inverted dropout, "dropout" stream

  def __call__(self, query: jax.Array, key: jax.Array, value: jax.Array,
               mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """query, key: [B, L, H, D]; value: [B, L, H, V]; mask: bool [B, L] (True = real) -> [B, L, H, V]."""
{math}
'''

FUNCTION = '''\
@register_attention("{name}", {cls}Config)
def {name}(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array, *,
           config: {cls}Config, dropout_rng: jax.Array | None = None) -> jax.Array:
  """REPLACE: the method in one paragraph (the placeholder is softmax(q k^T / sqrt(D) + masks) v).

  A parameter-free function: query, key [B, L, H, D]; value [B, L, H, V]; mask bool [B, L] (True =
  real) -> [B, L, H, V]. lra-bench passes the keywords it declares: ``config`` (causal,
  dropout_rate, your fields), ``dropout_rng`` (a key of the "dropout" stream; None when not training
  or when dropout_rate is 0) and ``deterministic``.
  """
{math}
'''

FUNCTION_DROPOUT = '''\
if dropout_rng is not None:  # training: inverted dropout, unbiased
  keep = jax.random.bernoulli(dropout_rng, 1.0 - config.dropout_rate, weights.shape)
  weights = jnp.where(keep, weights / (1.0 - config.dropout_rate), 0.0)'''

# style -> (extra import, the core's block, where the math reads the config, its dropout, in words)
_STYLES = {
    "linen": ("import flax.linen as nn", LINEN, "self.config",
              "weights = nn.Dropout(self.config.dropout_rate)(weights, deterministic=deterministic)"
              "  # unbiased", "a flax.linen module"),
    "nnx": ("from flax import nnx", NNX, "self.config",
            "weights = self.dropout(weights, deterministic=deterministic)", "a flax.nnx module"),
    "function": ("", FUNCTION, "config", FUNCTION_DROPOUT, "a plain function"),
}


def core_source(name: str, style: str = "linen") -> str:
  """The text of ``<name>.py``: a working core in ``style`` (one of ``STYLES``)."""
  imports, block, config, dropout, style_doc = _STYLES[style]
  cls = _class_name(name)
  indent = "  " if style == "function" else "    "
  lines = MATH.format(config=config, dropout=dropout).splitlines()
  body = "\n".join(indent + line if line else line for line in lines)
  header = HEADER.format(name=name, cls=cls, style=style, style_doc=style_doc,
                         imports=f"\n{imports}" if imports else "")
  return header + block.format(name=name, cls=cls, math=body)


TEST_TEMPLATE = '''\
"""Tests of the ``{name}`` attention core: the lra-bench conformance kit (shapes and dtypes, jit,
finite gradients, padding invariance, causality, determinism, unbiased dropout, the effective matrix
against the properties its config declares) and a float64 reference of its math.

Run: ``python -m pytest {test_file}`` (this file's directory must be importable: it is, when pytest
runs the file by path).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import attention_zoo
import {name}  # noqa: F401  (importing the module registers "{name}")
from lra_bench.testing import assert_conformant


def test_{name}_is_conformant():
  assert_conformant("{name}")


def _reference(q, k, v, mask, causal):
  """REPLACE with your method's math in plain numpy float64 (this is the placeholder's softmax)."""
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  allowed = np.broadcast_to(mask[:, None, None, :], logits.shape).copy()
  if causal:
    allowed &= np.tril(np.ones(logits.shape[-2:], bool))
  logits = np.where(allowed, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True)) * allowed
  return np.einsum("bhqk,bkhv->bqhv", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("causal", [False, True])
def test_{name}_matches_float64_reference(causal):
  jax.config.update("jax_enable_x64", True)
  try:
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 2, 11, 2, 8))
    v = rng.normal(size=(2, 11, 2, 5))
    mask = np.ones((2, 11), bool)
    mask[0, 8:] = False  # the first example has 3 padded positions
    core = attention_zoo.create_attention("{name}", causal=causal)
    variables = core.init(jax.random.key(0), q, k, v, jnp.asarray(mask))
    got = np.asarray(core.apply(variables, q, k, v, jnp.asarray(mask)))
  finally:
    jax.config.update("jax_enable_x64", False)
  np.testing.assert_allclose(got[mask], _reference(q, k, v, mask, causal)[mask], rtol=1e-10, atol=1e-12)
'''


def _check_syntax(name: str) -> None:
  if not _NAME.fullmatch(name) or keyword.iskeyword(name):
    raise ConfigError(f"new attention: {name!r} is not a valid name; use lower-case letters, digits and "
                      f"underscores, starting with a letter (e.g. my_attention)")


def _check_free(name: str) -> None:
  """A name neither the registry nor ``--plugin`` (a module import) would confuse with another."""
  if name in attention_zoo.list_attentions():
    raise ConfigError(f"new attention: {name!r} is already registered by "
                      f"{attention_zoo.defining_module(name)}; choose another name")
  if importlib.util.find_spec(name) is not None:
    raise ConfigError(f"new attention: a Python module named {name!r} already exists "
                      f"({importlib.util.find_spec(name).origin}); --plugin {name} would import it, "
                      f"so choose another name")


def _class_name(name: str) -> str:
  camel = "".join(part[:1].upper() + part[1:] for part in name.split("_"))
  return camel if camel.endswith("Attention") else camel + "Attention"


def _write_new(path: str, text: str) -> None:
  """Writes ``path`` atomically (temporary file, then rename) after the caller checked it is new."""
  from lra_bench import files

  files.write_atomic(path, text, prefix=".new-", suffix=".py")


def _shown(path: str) -> str:
  """``path`` as the user would type it: relative to the current directory when below it."""
  rel = os.path.relpath(path)
  return shlex.quote(path if rel.startswith(os.pardir) else rel)


def new_attention(name: str, directory: str = ".", style: str = "linen") -> str:
  """Writes ``<directory>/<name>.py`` (the core, written in ``style``: a linen module, an NNX module or
  a plain function) and ``<directory>/test_<name>.py``; returns what to print: the files written and
  the next three commands. Raises ``ConfigError`` (one line) for a bad or taken name, an unknown style
  or when either file exists (nothing is written then)."""
  if style not in STYLES:
    raise ConfigError(f"new attention: unknown --style {style!r}; expected one of {', '.join(STYLES)}")
  _check_syntax(name)
  directory = os.path.abspath(directory)
  core_path = os.path.join(directory, f"{name}.py")
  test_path = os.path.join(directory, f"test_{name}.py")
  existing = [p for p in (core_path, test_path) if os.path.exists(p)]
  if existing:
    raise ConfigError(f"new attention: {', '.join(existing)} already exists; not overwriting "
                      f"(remove it, or choose another name or --dir)")
  _check_free(name)
  os.makedirs(directory, exist_ok=True)
  _write_new(core_path, core_source(name, style))
  _write_new(test_path, TEST_TEMPLATE.format(name=name, test_file=f"test_{name}.py"))
  return _next_steps(name, directory, core_path, test_path)


def _next_steps(name: str, directory: str, core_path: str, test_path: str) -> str:
  env = "" if directory == os.getcwd() else f"PYTHONPATH={_shown(directory)} "
  results = shlex.quote(os.path.join("results", name))
  return "\n".join([
      f"wrote {_shown(core_path)}  (the core: exact softmax as a placeholder; edit the REPLACE blocks)",
      f"wrote {_shown(test_path)}  (the conformance kit and a float64 reference test)",
      "",
      "next (check and suite train on the smoke ListOps data; make it once with "
      "`lra-bench data prepare listops --protocol smoke`):",
      f"  {env}lra-bench check {name} --plugin {name}",
      f"  {env}python -m pytest {_shown(test_path)}",
      f"  {env}lra-bench suite --protocol smoke --tasks listops --attentions {name} "
      f"--results_dir {results} --plugin {name}",
      "",
      f"then `{env}lra-bench report --results_dir {results} --plugin {name}` shows its row.",
  ])
