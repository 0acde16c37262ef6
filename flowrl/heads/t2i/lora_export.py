"""A full fine-tune shipped as a LoRA: each weight matrix's change, truncated to rank r by SVD.

Full fine-tuning can learn more than a LoRA of the same cost (the shapes demo: README), but
a pipeline folder is heavy to share. The change ``tuned - base`` of every ``nn.Linear`` and
``nn.Conv2d`` weight is factored into peft's LoRA layout, so that the family's
``load_lora_weights`` puts it back on the base pipeline. By Eckart-Young the rank-r
truncated SVD is the closest rank-r change in Frobenius norm. Biases and normalisation
weights are not matrices and are left out; ``LoraExport.kept`` says how much of the change
(squared Frobenius norm over all parameters) the LoRA holds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch
from torch import nn

Tensor = torch.Tensor


@dataclass
class LoraExport:
    """What ``lora_from_change`` made: peft's adapter config, its state dict (peft key names,
    as ``get_peft_model_state_dict`` gives them) and the fraction of the change kept."""

    config: Any  # peft.LoraConfig (peft is imported only when a LoRA is made)
    state_dict: Dict[str, Tensor]
    kept: float
    modules: int


def lowrank_factors(delta: Tensor, rank: int) -> Tuple[Tensor, Tensor]:
    """The rank-``rank`` truncated SVD of a weight change, in peft's LoRA layout.

    delta: [out, in] (Linear) or [out, in, kh, kw] (Conv2d). Returns float32
    A: [rank, in] or [rank, in, kh, kw] and B: [out, rank] or [out, rank, 1, 1], with
    B @ A (A flattened to [rank, in*kh*kw]) the best rank-``rank`` approximation of delta;
    factors past the matrix's own rank are zero. Singular values go to B (A's rows are unit).
    """
    if rank < 1:
        raise ValueError("rank must be >= 1")
    m = delta.detach().float().reshape(delta.shape[0], -1)
    u, s, vh = torch.linalg.svd(m, full_matrices=False)
    k = min(rank, s.numel())
    a = m.new_zeros(rank, m.shape[1])
    b = m.new_zeros(m.shape[0], rank)
    a[:k] = vh[:k]
    b[:, :k] = u[:, :k] * s[:k]
    if delta.dim() == 4:
        return a.reshape(rank, *delta.shape[1:]), b.reshape(m.shape[0], rank, 1, 1)
    return a, b


def lora_from_change(base: nn.Module, tuned: nn.Module, rank: int) -> LoraExport:
    """Inject a rank-``rank`` LoRA into ``base`` (modified in place) that carries ``tuned - base``
    on every Linear and Conv2d weight that changed, and return it. Both models have the same
    architecture; ``base`` is typically the pretrained denoiser loaded again from disk."""
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    tuned_params = dict(tuned.named_parameters())
    total = kept = 0.0
    factors: Dict[str, Tuple[Tensor, Tensor]] = {}
    with torch.no_grad():
        for name, p in base.named_parameters():
            delta = tuned_params[name].detach().float() - p.detach().float()
            total += float(delta.square().sum())
        for name, module in base.named_modules():
            if not isinstance(module, (nn.Linear, nn.Conv2d)):
                continue
            delta = tuned_params[f"{name}.weight"].detach().float() - module.weight.detach().float()
            if not delta.any():
                continue
            a, b = lowrank_factors(delta, rank)
            factors[name] = (a, b)
            kept += float(b.reshape(b.shape[0], -1).square().sum())  # ||B A||^2 = sum of kept s^2 (A's rows orthonormal)
    if not factors:
        raise ValueError("no Linear or Conv2d weight changed: nothing to export")
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=sorted(factors), init_lora_weights=True)
    base.add_adapter(config)
    modules = dict(base.named_modules())
    with torch.no_grad():
        for name, (a, b) in factors.items():
            layer = modules[name]
            layer.lora_A["default"].weight.copy_(a)
            layer.lora_B["default"].weight.copy_(b)
    state = {k: v.contiguous() for k, v in get_peft_model_state_dict(base).items()}
    return LoraExport(config=config, state_dict=state, kept=kept / total if total else 1.0, modules=len(factors))
