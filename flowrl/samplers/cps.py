"""Coefficients-preserving sampling (CPS) for flow matching: DDIM's stochastic step, in
flow coordinates (Wang & Yu 2025, implemented from the paper's description).

With x0_hat = x - t v and eps_hat = x + (1 - t) v (so x = (1 - t) x0_hat + t eps_hat), a
step t -> s keeps the coefficients of a straight path, (1 - s) on the data and s on the
noise, and mixes fresh noise into the noise part:

    x_next = (1 - s) x0_hat + s (cos(theta) eps_hat + sin(theta) z),   theta = eta pi / 2

    mean = (1 - s) x0_hat + s cos(theta) eps_hat,   std = s sin(theta)

eta = 0 is exactly Euler (x + (s - t) v); eta = 1 replaces the noise part entirely. At
s = 0 the step is deterministic (std 0). Unlike the Flow-GRPO SDE discretised with few
steps, the injected noise never exceeds the path's own noise level s, so training samples
stay on the evaluation sampler's marginals (for a point-mass field exactly, at any step size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flowrl.samplers.base import Sampler, expand_like

Tensor = torch.Tensor


@dataclass
class FlowCPSSampler(Sampler):
    """eta in [0, 1]: fresh noise enters each step's noise part with weight sin(eta pi / 2)
    (a share sin^2 of its variance)."""

    eta: float = 0.5

    prediction = "velocity"

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta={self.eta} must lie in [0, 1] for the CPS sampler")

    def mean_std(self, v: Tensor, x: Tensor, t: Tensor, t_next: Tensor):
        """v, x: [B, ...]; t, t_next: [B] with t > t_next >= 0. Returns (mean [B, ...], std [B])."""
        theta = self.eta * math.pi / 2
        x0_hat = x - expand_like(t, x) * v
        eps_hat = x + expand_like(1 - t, x) * v
        mean = expand_like(1 - t_next, x) * x0_hat + expand_like(t_next * math.cos(theta), x) * eps_hat
        return mean, t_next * math.sin(theta)
