"""Sampler protocol and the Gaussian helpers every stochastic sampler shares.

A sampler is stateless: ``step`` maps (model output, state, t, t_next) to the next
state. Called without ``x_next`` it SAMPLES one (using ``generator``); called with
``x_next`` it SCORES that given transition (exact Gaussian log-density). Either way it
returns the transition's mean and std, so algorithms can compute KLs between policies.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import torch

from flowrl.types import StepOutput

Tensor = torch.Tensor
TimeLike = Union[float, Tensor]


def as_time(t: TimeLike, x: Tensor) -> Tensor:
    """Broadcast a time to a [B] float32 tensor on x's device."""
    t = torch.as_tensor(t, dtype=torch.float32, device=x.device)
    if t.ndim == 0:
        t = t.expand(x.shape[0])
    return t


def expand_like(t: Tensor, x: Tensor) -> Tensor:
    """[B] -> [B, 1, ..., 1] so that it broadcasts against x [B, ...]."""
    return t.reshape(t.shape[0], *([1] * (x.ndim - 1))).to(x.dtype)


def randn_like(x: Tensor, generator: Optional[Union[torch.Generator, Sequence[torch.Generator]]]) -> Tensor:
    """Standard normal noise shaped like x.

    ``generator`` may be one torch.Generator or a list of B generators (one per sample,
    as the trainer passes them so that a sample's noise does not depend on its batch).
    """
    if generator is None:
        return torch.randn(x.shape, device=x.device, dtype=x.dtype)
    if isinstance(generator, torch.Generator):
        return torch.randn(x.shape, generator=generator, device=generator.device, dtype=x.dtype).to(x.device)
    if len(generator) != x.shape[0]:
        raise ValueError(f"got {len(generator)} generators for a batch of {x.shape[0]}")
    # noise is drawn on each generator's own device (CPU by default), so it is the
    # same on CPU and GPU runs, then moved to x's device
    return torch.stack(
        [torch.randn(x.shape[1:], generator=g, device=g.device, dtype=x.dtype) for g in generator]
    ).to(x.device)


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor, event_ndim: Optional[int] = None) -> Tensor:
    """Exact log N(x; mean, std^2 I), summed over the event dims.

    x, mean: [B, ...]; std: broadcastable to x (e.g. [B, 1, ..., 1]).
    event_ndim: number of trailing dims summed (default: all but the batch dim), so
    x [B, A, H, 2] with event_ndim=2 gives a per-agent log-prob [B, A].
    Returns [B] (or [B, leading...]), float32 or x's dtype.
    """
    if event_ndim is None:
        event_ndim = x.ndim - 1
    std = torch.as_tensor(std, dtype=x.dtype, device=x.device).expand_as(x)
    var = std**2
    lp = -((x - mean) ** 2) / (2 * var) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    if event_ndim == 0:
        return lp
    return lp.sum(dim=tuple(range(x.ndim - event_ndim, x.ndim)))


def correlated_randn_like(x: Tensor, rho: float, dim: int, generator=None) -> Tensor:
    """Standard-normal noise shaped like x whose entries along ``dim`` have correlation ``rho``.

    eps = sqrt(1 - rho) z + sqrt(rho) z_shared, with z [B, ...] and z_shared one draw per
    line along ``dim`` (broadcast), so every entry is N(0, 1) and any two entries on the
    same line have covariance rho. rho = 0 is exactly ``randn_like`` (same draws).
    """
    z = randn_like(x, generator)
    if rho == 0:
        return z
    shape = list(x.shape)
    shape[dim] = 1
    shared = randn_like(x.new_empty(shape), generator)
    return math.sqrt(1 - rho) * z + math.sqrt(rho) * shared


def correlated_gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor, rho: float, dim: int,
                                 event_ndim: Optional[int] = None) -> Tensor:
    """Exact log N(x; mean, std^2 R), R equicorrelated (1 on the diagonal, rho off it) along
    ``dim`` and independent across the other dims; summed over the event dims.

    With d = (x - mean) / std on a line of n entries, S = sum d, Q = sum d^2:
    R^-1 = (I - rho / (1 + (n - 1) rho) 11^T) / (1 - rho), det R = (1 - rho)^(n-1) (1 + (n - 1) rho).
    x, mean: [B, ...]; std broadcastable to x (constant along ``dim``). ``dim`` must lie in
    the event dims. Returns [B] (or [B, leading...]). rho = 0 equals ``gaussian_log_prob``.
    """
    if rho == 0:
        return gaussian_log_prob(x, mean, std, event_ndim)
    if event_ndim is None:
        event_ndim = x.ndim - 1
    d_pos = dim % x.ndim
    if d_pos < x.ndim - event_ndim:
        raise ValueError(f"the correlated dim {dim} must be one of the {event_ndim} event dims of x {tuple(x.shape)}")
    n = x.shape[d_pos]
    std = torch.as_tensor(std, dtype=x.dtype, device=x.device).expand_as(x)
    d = (x - mean) / std
    s = d.sum(dim=d_pos, keepdim=True)
    q = (d**2).sum(dim=d_pos, keepdim=True)
    quad = (q - rho / (1 + (n - 1) * rho) * s**2) / (1 - rho)
    log_det_r = (n - 1) * math.log(1 - rho) + math.log(1 + (n - 1) * rho)
    lp = (-0.5 * quad - 0.5 * log_det_r - 0.5 * n * math.log(2 * math.pi)
          - torch.log(std).sum(dim=d_pos, keepdim=True)).squeeze(d_pos)
    rest = event_ndim - 1  # event dims left after summing the line
    if rest == 0:
        return lp
    return lp.sum(dim=tuple(range(lp.ndim - rest, lp.ndim)))


class Sampler:
    """Base class. Subclasses implement ``mean_std``; ``step`` does the rest.

    ``prediction``: what the model output ``v`` means to this sampler ("velocity" for
    flow matching, "epsilon" for DDPM-style models). Heads declare the same word.
    """

    prediction: str = "velocity"
    deterministic: bool = False

    def mean_std(self, v: Tensor, x: Tensor, t: Tensor, t_next: Tensor):
        """Return (mean [B, ...], std [B]) of p(x_next | x). t, t_next: [B]."""
        raise NotImplementedError

    def init(self, x: Tensor, generator=None) -> Tensor:
        """Optional perturbation of the initial noise (FDFO's churn). Default: identity."""
        return x

    def noise(self, x: Tensor, generator=None) -> Tensor:
        """Standard-normal step noise shaped like x. Default: independent entries."""
        return randn_like(x, generator)

    def log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor, event_ndim: Optional[int] = None) -> Tensor:
        """Exact log-density of x_next under the step's Gaussian (matches ``noise``)."""
        return gaussian_log_prob(x_next, mean, std, event_ndim)

    def step(
        self,
        v: Tensor,
        x: Tensor,
        t: TimeLike,
        t_next: TimeLike,
        *,
        x_next: Optional[Tensor] = None,
        generator=None,
        event_ndim: Optional[int] = None,
    ) -> StepOutput:
        """Sample x_next (x_next=None) or score the given x_next.

        v: [B, ...] model output at (x, t); x: [B, ...]; t, t_next: float or [B].
        Returns StepOutput(x_next [B, ...], log_prob [B] or None, mean [B, ...], std [B]).
        """
        t = as_time(t, x)
        t_next = as_time(t_next, x)
        mean, std = self.mean_std(v, x, t, t_next)
        std_b = expand_like(std, x)
        if x_next is None:
            if bool((std > 0).any()):
                x_next = mean + std_b * self.noise(x, generator)
            else:
                x_next = mean
        if bool((std > 0).all()):
            log_prob = self.log_prob(x_next, mean, std_b, event_ndim)
        else:
            log_prob = None
        return StepOutput(x_next=x_next, log_prob=log_prob, mean=mean, std=std)
