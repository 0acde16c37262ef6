"""Classifier-free guidance helpers."""
from __future__ import annotations

from typing import Any, Callable, Dict, Union

import torch

Tensor = torch.Tensor


def cfg_combine(v_cond: Tensor, v_uncond: Tensor, scale: float) -> Tensor:
    """v_uncond + scale * (v_cond - v_uncond); all [B, ...]."""
    return v_uncond + scale * (v_cond - v_uncond)


def guided_velocity(
    velocity_fn: Callable[[Tensor, Any, Dict[str, Any]], Tensor],
    x: Tensor,
    t: Union[float, Tensor],
    cond: Dict[str, Any],
    uncond: Dict[str, Any],
    scale: float,
) -> Tensor:
    """CFG velocity with one batched model call.

    velocity_fn(x, t, cond) -> v [B, ...]; x: [B, ...]; t: float or [B];
    cond / uncond: dicts with the same keys of [B, ...] tensors (non-tensor values must match).
    scale == 1: one call on cond. Otherwise one call on [x, x], [t, t], [cond, uncond]
    concatenated along dim 0, then cfg_combine. Returns [B, ...].
    """
    if scale == 1:
        return velocity_fn(x, t, cond)
    if set(cond) != set(uncond):
        raise ValueError(f"cond keys {sorted(cond)} != uncond keys {sorted(uncond)}")
    both: Dict[str, Any] = {}
    for k, c in cond.items():
        u = uncond[k]
        if isinstance(c, torch.Tensor):
            both[k] = torch.cat([c, u], dim=0)
        elif c == u:
            both[k] = c
        else:
            raise ValueError(f"non-tensor cond entry {k!r} differs between cond and uncond")
    t2 = torch.cat([t, t], dim=0) if isinstance(t, torch.Tensor) and t.ndim > 0 else t
    v_cond, v_uncond = velocity_fn(torch.cat([x, x], dim=0), t2, both).chunk(2, dim=0)
    return cfg_combine(v_cond, v_uncond, scale)
