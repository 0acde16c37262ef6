"""Core data types shared by samplers, algorithms, heads and the trainer.

Time convention (flowrl-wide, documented once here):
    t in [0, 1]; t = 1 is pure noise, t = 0 is data. A flow-matching head's path is
    x_t = (1 - t) * x_0 + t * eps and its velocity is v = eps - x_0, so integrating
    dx/dt = v from t = 1 down to t = 0 denoises. Chains run with decreasing t.
    Heads whose model uses another convention (SD3's sigmas in [0, 1] scaled by 1000,
    a UNet's integer timesteps) convert inside ``Head.velocity``.

Shapes: ``B`` samples, ``K`` denoising steps, ``...`` the state's event shape, ``A``
agents when a reward or log-prob is per agent.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Dict, Optional

import torch

Tensor = torch.Tensor


@dataclass
class StepOutput:
    """Result of one sampler step (sampling or scoring).

    x_next:   [B, ...] the next state (sampled, or the given one when scoring).
    log_prob: [B] (or [B, A] with ``event_ndim``) exact Gaussian log-density of x_next
              under N(mean, std^2); ``None`` for deterministic steps (std == 0).
    mean:     [B, ...] mean of the transition.
    std:      [B] or broadcastable scalar tensor; the transition's standard deviation.
    """

    x_next: Tensor
    log_prob: Optional[Tensor]
    mean: Tensor
    std: Tensor


@dataclass
class RewardOutput:
    """What a reward returns.

    score: [B] or [B, A] (per-agent rewards for planners); float.
    valid: same shape as score, bool; False where the score could not be computed.
           Invalid entries carry an arbitrary finite score (0) and must be ignored.
    info:  free-form per-reward diagnostics (scalars or [B] tensors), logged as metrics.
    """

    score: Tensor
    valid: Tensor
    info: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.valid is None:
            self.valid = torch.ones_like(self.score, dtype=torch.bool)
        if self.valid.shape != self.score.shape:
            raise ValueError(f"valid shape {tuple(self.valid.shape)} != score shape {tuple(self.score.shape)}")


@dataclass
class Trajectory:
    """A batch of denoising chains (one chain per sample), as collected by a rollout.

    states:     [B, K+1, ...] x_{t_0}, ..., x_{t_K} (t_0 = 1 noise ... t_K = final).
    times:      [B, K+1] the time of each state.
    log_probs:  [B, K] (or [B, K, A]) log-prob of each transition under the rollout policy;
                None when the sampler is deterministic.
    velocities: [B, K, ...] the model output at each state under the rollout policy
                (recorded when an algorithm needs it, e.g. FDFO's v_old); else None.
    cond:       dict of [B, ...] tensors from ``Head.encode`` (the conditioning).
    group_ids:  [B] long; samples that share a prompt / scene share an id (global ids).
    sample_ids: [B] long; global sample index (drives per-sample generators).
    rewards:    [B] or [B, A] aggregated reward, filled after scoring.
    valid:      [B] or [B, A] bool validity of the reward.
    advantages: [B] or [B, A] (GRPO family) or per-sample signed reward difference (FDFO).
    weights:    [B] per-sample weights (offline methods, dropped groups = 0).
    extras:     named per-sample tensors [B, ...] (per-reward scores, algorithm targets).
    """

    states: Tensor
    times: Tensor
    cond: Dict[str, Tensor]
    group_ids: Tensor
    sample_ids: Tensor
    log_probs: Optional[Tensor] = None
    velocities: Optional[Tensor] = None
    rewards: Optional[Tensor] = None
    valid: Optional[Tensor] = None
    advantages: Optional[Tensor] = None
    weights: Optional[Tensor] = None
    extras: Dict[str, Tensor] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return int(self.states.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.states.shape[1]) - 1

    @property
    def final(self) -> Tensor:
        """[B, ...] the last state of every chain."""
        return self.states[:, -1]

    def replace(self, **changes: Any) -> "Trajectory":
        return replace(self, **changes)

    def map_tensors(self, fn) -> "Trajectory":
        """Apply ``fn`` to every tensor (including those in ``cond`` and ``extras``)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                out[f.name] = fn(value)
            elif isinstance(value, dict):
                out[f.name] = {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in value.items()}
            else:
                out[f.name] = value
        return Trajectory(**out)
