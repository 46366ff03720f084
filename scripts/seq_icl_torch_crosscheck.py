"""Train berlino/seq_icl's own S4D, LRU or Transformer language model (its code at commit ec42595) on its own
induction-head or associative-recall data, as its configs say, in PyTorch on a CPU: a cross-check of the
`seq_icl` protocol, not part of lra-bench (reports/cpu_seq_icl/results/torch_crosscheck/README.md: its runs). Needs
PyTorch, which lra-bench does not install.

The files of the original that run here, unchanged, are loaded from a checkout of the repository:
``src/models/sequence/ssm/s4d.py`` (the standalone S4D), ``src/models/sequence/rnn/lru.py`` (its gated
"LRU" layer), ``src/models/sequence/simple_lm.py`` (the LM, its blocks, its MHA and ``_init_weights``) and
``src/dataloaders/synthetics.py`` (the data). The LRU's Triton scan runs only on a GPU; here
``complex_scan`` is the same recurrence, h_t = f_t h_{t-1} + x_t over complex numbers, as a loop that
autograd differentiates. What the original
gets from its training framework (hydra, PyTorch Lightning, train.py) is written out below from its
configs: AdamW 5e-4 with weight decay 0.1 on the ordinary parameters and a group without weight decay
for the parameters the layer marks ``_optim`` (train.py ``configure_optimizers``); per-step timm cosine
with a 10 % warm-up from 1e-6 and a floor of 0.1 x lr (IH) or a linear warm-up and decay (AR); batch 32,
400 epochs; cross-entropy over every next token; after each epoch the accuracy on the test split's
labelled answer (the original's validation), whose best value the original's table reports.

  python scripts/seq_icl_torch_crosscheck.py --repo /path/to/seq_icl --task induction_head --seed 0
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import sys
import time
import types

import numpy as np
import torch
import torch.nn.functional as F


def _load(name: str, path: str):
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def _stub(name: str, **attributes):
  module = types.ModuleType(name)
  module.__dict__.update(attributes)
  sys.modules[name] = module
  return module


class _NoStochasticDepth(torch.nn.Module):
  """torchvision's StochasticDepth at p = 0 (the blocks' default): the identity."""

  def __init__(self, p, mode):
    super().__init__()
    assert p == 0.0, p

  def forward(self, x):
    return x


def complex_scan(x_real, x_imag, f_real, f_imag):
  """h_t = f_t h_{t-1} + x_t (complex, h_{-1} = 0) over [B, L, C]: what the original's Triton kernel
  ``TritonSequentialScan_Complex`` computes, differentiated by autograd. The LRU layer's decay f is one
  value per channel, broadcast over batch and time, so h_t = sum_{s <= t} f^(t-s) x_s: a lower-triangular
  [L, L, C] matrix of powers (a CPU loop over L steps is 10x slower)."""
  f_r, f_i = f_real[0, 0], f_imag[0, 0]
  if not (torch.equal(f_real, f_r.expand_as(f_real)) and torch.equal(f_imag, f_i.expand_as(f_imag))):
    raise ValueError("complex_scan here needs a decay that is the same at every batch row and position")
  steps = torch.arange(x_real.shape[1])
  lag = (steps[:, None] - steps[None, :]).clamp(min=0)[..., None].to(x_real.dtype)      # [L, L, 1]
  causal = (steps[:, None] >= steps[None, :])[..., None]
  magnitude = torch.exp(lag * 0.5 * torch.log(f_r ** 2 + f_i ** 2))                        # |f|^(t-s)
  angle = lag * torch.atan2(f_i, f_r)
  k_r = torch.where(causal, magnitude * torch.cos(angle), torch.zeros_like(magnitude))
  k_i = torch.where(causal, magnitude * torch.sin(angle), torch.zeros_like(magnitude))
  mix = lambda k, x: torch.einsum("tsc,bsc->btc", k, x)
  return mix(k_r, x_real) - mix(k_i, x_imag), mix(k_r, x_imag) + mix(k_i, x_real)


def _loop_scan(x_real, x_imag, f_real, f_imag):
  """The same recurrence step by step (the reference ``complex_scan`` is checked against)."""
  h_real = torch.zeros_like(x_real[:, 0])
  h_imag = torch.zeros_like(x_imag[:, 0])
  out_real, out_imag = [], []
  for t in range(x_real.shape[1]):
    h_real, h_imag = (h_real * f_real[:, t] - h_imag * f_imag[:, t] + x_real[:, t],
                      h_real * f_imag[:, t] + h_imag * f_real[:, t] + x_imag[:, t])
    out_real.append(h_real)
    out_imag.append(h_imag)
  return torch.stack(out_real, 1), torch.stack(out_imag, 1)


def load_original(repo: str):
  """(S4D module, simple_lm module, synthetics module) from the checkout, with the framework imports they
  make (Lightning's rank_zero_only, torchvision's StochasticDepth, the repo's instantiate/registry and
  SequenceDataset base class) replaced by what they do here."""
  _stub("pytorch_lightning")
  _stub("pytorch_lightning.utilities", rank_zero_only=lambda f: f)
  _stub("torchvision")
  _stub("torchvision.ops", StochasticDepth=_NoStochasticDepth)
  for name in ("src", "src.models", "src.models.sequence", "src.models.sequence.rnn"):
    _stub(name)
  _stub("src.models.sequence.rnn.scan_triton", complex_scan=complex_scan)
  s4d = _load("seq_icl_s4d", f"{repo}/src/models/sequence/ssm/s4d.py")
  lru = _load("seq_icl_lru", f"{repo}/src/models/sequence/rnn/lru.py")
  layers = {"s4d": s4d.S4D, "lru": lru.LRULayer}

  def instantiate(registry, config, partial=False, **kwargs):  # the layer config -> partial(layer, ...)
    assert partial
    return functools.partial(layers[config["_name_"]], **{k: v for k, v in config.items() if k != "_name_"},
                             **kwargs)

  _stub("src.utils", instantiate=instantiate)
  _stub("src.utils.registry", layer={})
  _stub("src.dataloaders")
  _stub("src.dataloaders.base", SequenceDataset=object)
  simple_lm = _load("seq_icl_simple_lm", f"{repo}/src/models/sequence/simple_lm.py")
  synthetics = _load("seq_icl_synthetics", f"{repo}/src/dataloaders/synthetics.py")
  return s4d, simple_lm, synthetics


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repo", required=True, help="a checkout of berlino/seq_icl at commit ec42595")
  parser.add_argument("--task", default="induction_head", choices=["induction_head", "assoc_recall"])
  parser.add_argument("--layer", default="s4d", choices=["s4d", "lru", "transformer"])
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--epochs", type=int, default=400)
  args = parser.parse_args()
  torch.set_num_threads(1)
  torch.manual_seed(args.seed)
  np.random.seed(args.seed)
  _, simple_lm, synthetics = load_original(args.repo)
  check = [torch.randn(2, 42, 32, dtype=torch.float64) for _ in range(2)]
  decay = torch.rand(32, dtype=torch.float64) * 0.999, torch.rand(32, dtype=torch.float64) * 6.28
  f = [(decay[0] * torch.cos(decay[1])).expand(2, 42, 32), (decay[0] * torch.sin(decay[1])).expand(2, 42, 32)]
  for fast, slow in zip(complex_scan(*check, *f), _loop_scan(*check, *f)):
    torch.testing.assert_close(fast, slow)

  length = 30 if args.task == "induction_head" else 40        # configs/pipeline/*.yaml
  data = synthetics.ICLDataModule(num_examples=5000, num_test_examples=500, vocab_size=20,
                                  input_seq_len=length, copy_method=args.task)  # dataset seed 0, as there
  data.setup()
  train_x, train_y = data.dataset["train"].tensors
  test_x, test_y = data.dataset["test"].tensors
  if args.layer == "transformer":   # configs/experiment/synthetics/*/transformer.yaml
    mixer = dict(attn_layer_idx=[0, 1], attn_cfg={"num_heads": 1, "dropout": 0.1},
                 max_position_embeddings=length + 2)   # dataset.__l_max = input_seq_len + 2
  else:                             # configs/model/layer/{s4d,lru}.yaml
    mixer = dict(layer={"_name_": "s4d", "d_state": 64, "lr": 5e-4, "transposed": False, "return_state": False}
                 if args.layer == "s4d" else {"_name_": "lru"})
  model = simple_lm.SimpleLMHeadModel(
      d_model=32, n_layer=2, d_inner=128, vocab_size=20, resid_dropout=0.0, embed_dropout=0.1, **mixer)
  params = list(model.parameters())
  optimizer = torch.optim.AdamW([p for p in params if not hasattr(p, "_optim")], lr=5e-4, weight_decay=0.1)
  optimizer.add_param_group({"params": [p for p in params if hasattr(p, "_optim")], "lr": 5e-4,
                             "weight_decay": 0.0})
  per_epoch = math.ceil(len(train_x) / 32)
  total, warmup = per_epoch * args.epochs, per_epoch * math.ceil(args.epochs / 10)

  def learning_rate(step: int) -> float:
    if args.task == "assoc_recall":   # scheduler linear_warmup
      return 5e-4 * (step / warmup if step < warmup else max(0.0, (total - step) / (total - warmup)))
    if step < warmup:                 # cosine_warmup_timm: warmup_lr_init 1e-6, lr_min 0.1 x lr
      return 1e-6 + step * (5e-4 - 1e-6) / warmup
    return 5e-5 + 0.5 * (5e-4 - 5e-5) * (1 + math.cos(math.pi * step / total))

  print(f"seq_icl {args.layer} {args.task} seed {args.seed}: {sum(p.numel() for p in params)} parameters, "
        f"{total} steps", flush=True)
  generator = torch.Generator().manual_seed(args.seed)
  step, best, start = 0, 0.0, time.time()
  for epoch in range(args.epochs):
    model.train()
    order = torch.randperm(len(train_x), generator=generator)
    for first in range(0, len(order), 32):
      rows = order[first:first + 32]
      for group in optimizer.param_groups:
        group["lr"] = learning_rate(step)
      logits = model(train_x[rows])[0].logits
      loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), train_y[rows].reshape(-1), ignore_index=-100)
      optimizer.zero_grad()
      loss.backward()
      optimizer.step()
      step += 1
    model.eval()
    with torch.no_grad():
      labelled = test_y != -100
      accuracy = (model(test_x)[0].logits.argmax(-1)[labelled] == test_y[labelled]).float().mean().item()
    best = max(best, accuracy)
    if epoch % 10 == 0 or epoch == args.epochs - 1:
      print(f"epoch {epoch} step {step} loss {loss.item():.4f} test accuracy {accuracy:.4f} best {best:.4f} "
            f"({time.time() - start:.0f} s)", flush=True)
  print(f"final: {args.layer} {args.task} seed {args.seed}: last {accuracy:.4f}, best {best:.4f}")


if __name__ == "__main__":
  main()
