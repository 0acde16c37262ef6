"""Deterministic flow-ODE integrators (t = 1 noise -> t = 0 data, dx/dt = v)."""
from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from flowrl.samplers.base import Sampler, TimeLike, expand_like

Tensor = torch.Tensor
VelocityFn = Callable[[Tensor, Tensor, Dict[str, Any]], Tensor]


class EulerSampler(Sampler):
    """First-order Euler step of the probability-flow ODE.

    mean = x + (t_next - t) * v, std = 0, so ``step`` returns ``log_prob=None``.
    """

    prediction = "velocity"
    deterministic = True

    def mean_std(self, v: Tensor, x: Tensor, t: Tensor, t_next: Tensor):
        """v, x: [B, ...]; t, t_next: [B]. Returns (mean [B, ...], std [B] of zeros)."""
        dt = expand_like(t_next - t, x)
        return x + dt * v, torch.zeros_like(t)


def _time(t: TimeLike, x: Tensor) -> Tensor:
    """float or [B] -> [B] in x's dtype (keeps float64 precision for float64 states)."""
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    return t.expand(x.shape[0]) if t.ndim == 0 else t


def heun_step(velocity_fn: VelocityFn, x: Tensor, t: TimeLike, t_next: TimeLike, cond: Dict[str, Any]) -> Tensor:
    """One second-order Heun step from t to t_next; plain Euler where t_next == 0.

    velocity_fn(x [B, ...], t [B], cond) -> v [B, ...]; x: [B, ...]; t, t_next: float or [B];
    cond: dict of [B, ...] tensors passed through. Returns x_next [B, ...].
    Costs two velocity evaluations (one when every t_next is 0).
    """
    t_b, tn_b = _time(t, x), _time(t_next, x)
    dt = expand_like(tn_b - t_b, x)
    v1 = velocity_fn(x, t_b, cond)
    x_euler = x + dt * v1
    last = tn_b == 0
    if bool(last.all()):
        return x_euler
    v2 = velocity_fn(x_euler, tn_b, cond)
    x_heun = x + dt * 0.5 * (v1 + v2)
    return torch.where(expand_like(last, x).bool(), x_euler, x_heun)
