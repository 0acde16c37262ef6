"""FDFO's marginal-preserving churn sampler.

With g = gamma and c = sqrt((1 + g)^2 - 1):
  init:  x <- x / (1 + g) + c / (1 + g) * eps            (keeps N(0, I) at t = 1; its own
         strength init_gamma if set: how far a pair's starting points differ)
  step t -> s:  r = s / (1 + g (1 - s));  x~ = x + (r - t) v  (Euler to r)
                x_next = x~ / (1 + g r) + r c / (1 + g r) * eps
If x_t = (1 - t) x0 + t eps then x~ = (1 - r) x0 + r eps and x_next = (1 - s) x0 + s eps',
so the flow's marginals are preserved. At s = 0, r = 0 and the step is deterministic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from flowrl.samplers.base import Sampler, expand_like, randn_like

Tensor = torch.Tensor


def churn_noise_scale(g: float) -> float:
    """c = sqrt((1 + g)^2 - 1): the fresh noise that keeps N(0, I) after dividing by 1 + g."""
    return math.sqrt((1 + g) ** 2 - 1)


@dataclass
class ChurnSampler(Sampler):
    """gamma: churn strength g >= 0 (0 gives plain Euler); init_gamma: the churn of the
    starting noise alone (None = gamma)."""

    gamma: float = 0.0025
    init_gamma: Optional[float] = None

    prediction = "velocity"

    def __post_init__(self) -> None:
        if self.gamma < 0:
            raise ValueError(f"gamma={self.gamma} must be >= 0")
        if self.init_gamma is not None and self.init_gamma < 0:
            raise ValueError(f"init_gamma={self.init_gamma} must be >= 0")

    def init(self, x: Tensor, generator=None) -> Tensor:
        """x: [B, ...] initial noise -> churned noise [B, ...] (same N(0, I) marginal)."""
        g = self.gamma if self.init_gamma is None else self.init_gamma
        if g == 0:
            return x
        return x / (1 + g) + (churn_noise_scale(g) / (1 + g)) * randn_like(x, generator)

    def mean_std(self, v: Tensor, x: Tensor, t: Tensor, t_next: Tensor):
        """v, x: [B, ...]; t, t_next: [B]. Returns (mean [B, ...], std [B])."""
        g = self.gamma
        r = t_next / (1 + g * (1 - t_next))
        x_tilde = x + expand_like(r - t, x) * v
        scale = 1 + g * r
        return x_tilde / expand_like(scale, x), r * churn_noise_scale(g) / scale
