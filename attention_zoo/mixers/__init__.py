"""Sequence mixers: the second layer contract beside the attention core (docs/ARCHITECTURE.md, CONTRACT 4).

A *sequence mixer* replaces the whole multi-head attention sub-layer of an encoder block (the
projections included): ``x [B, L, D], mask bool [B, L] -> [B, L, D]`` in ``x``'s dtype. State-space
models (S4D, S5, LRU) and Mega's gated EMA attention are mixers: they own their input and output maps,
their gates and activations, so the attention core's ``query, key, value`` contract does not fit them.

A mixer is a ``flax.linen.Module`` whose single field is ``config``, a frozen dataclass deriving from
``attention_zoo.registry.MixerConfig``, registered by name in the one registry of sequence layers
(``attention_zoo/registry.py``)::

    from attention_zoo.registry import MixerConfig, register_mixer


    @register_mixer("my_ssm", MySSMConfig)
    class MySSM(nn.Module):
      config: MySSMConfig
      @nn.compact
      def __call__(self, x, mask, deterministic=True): ...

Names share one namespace with the attention cores: ``--attentions``, ``model.attention`` and the
records' ``attention`` field name either kind; records also store ``layer_kind``.
``model.attention_kwargs`` are the mixer's config overrides.

What the encoder does around a mixer (``lra_bench.training.models.EncoderBlock``):

- it zeroes the padded positions of ``x`` before the call (``x * mask``); a mixer must keep the outputs
  at real positions independent of what the padded positions held and of how many there are (a mixer
  that adds a bias before a scan must mask again; a bidirectional scan runs through the zeroed tail);
- ``config.dropout_rate`` is the model's ``dropout_rate`` unless ``attention_kwargs`` sets it (the
  mixer's own dropout, e.g. after S4's activation); dropout draws from the ``dropout`` RNG stream;
- ``config.causal`` is True in next-token models: the output at ``i`` must not depend on ``j > i``
  (a bidirectional option is then off); a mixer with no causal form sets ``no_causal_form``;
- a mixer with ``gated_residual = True`` (a trait of ``LayerConfig``; Mega: ``x + φ ⊙ (h − x)``) is called with
  ``residual=``
  (the block's input before its normalisation) and returns the update the block adds unchanged
  (no residual dropout), so the gate sees the un-normalised input as in the original;
- a parameter whose name starts with ``ssm_`` is an SSM parameter (Λ/A, B, Δ): trained at
  ``optimizer.ssm_learning_rate`` with ``optimizer.ssm_weight_decay`` when the config sets them
  (the S4/S5/LRU recipes), else like every other parameter.

Mixers defined outside this package register the same way from a plugin module (``--plugin``,
``$LRA_BENCH_PLUGINS``, the ``lra_bench.attentions`` entry points): the plugin mechanism imports modules,
and a module may register cores, mixers or both.
"""

import importlib as _importlib
import pkgutil as _pkgutil

# This package only imports its files (one file per mixer; ``_helpers`` register nothing): each registers
# its mixer in ``attention_zoo.registry``.
for _info in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
  if not _info.name.startswith("_"):
    _importlib.import_module(f"{__name__}.{_info.name}")
