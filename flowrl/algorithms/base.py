"""The Algorithm contract.

An algorithm declares what it needs from a rollout (log-probs, recorded velocities,
pairs of branches, an offline dataset), turns globally gathered rewards into
advantages / weights, flattens a trajectory into training units ("pairs" of
(sample, step) or whole samples), and computes an UNREDUCED per-unit loss. The
trainer owns the reduction (sum over a global minibatch divided by ``unit_norm``), so
results do not depend on how many processes share the minibatch. Algorithms never
import accelerate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch

from flowrl._fields import hfield
from flowrl.samplers.base import Sampler
from flowrl.types import Trajectory

Tensor = torch.Tensor
VelocityFn = Callable[[Tensor, Tensor, Dict[str, Tensor]], Tensor]


@dataclass
class Policy:
    """What a loss may call: the trainable velocity (with grad), the reference policy's
    velocity (no grad), the sampler that produced the rollout, and the event layout."""

    velocity: VelocityFn
    reference_velocity: VelocityFn
    sampler: Sampler
    event_ndim: Optional[int] = None
    prediction: str = "velocity"


@dataclass
class AlgorithmConfig:
    """Fields every algorithm config has."""

    name: str = hfield("", "registered algorithm name (fdfo, flow_grpo, dance_grpo, vg_grpo, flow_matching)")
    inner_epochs: int = hfield(1, "passes over each rollout's training units (PPO-style inner epochs)")
    num_minibatches: int = hfield(1, "optimizer steps per inner epoch (the units are split into this many minibatches)")

    def __post_init__(self) -> None:
        if self.inner_epochs < 1:
            raise ValueError("algorithm.inner_epochs must be >= 1")
        if self.num_minibatches < 1:
            raise ValueError("algorithm.num_minibatches must be >= 1")


class Algorithm:
    """Base class. Subclasses set the class flags and implement the hooks they need."""

    needs_log_prob: bool = False      # rollout must record per-step log-probs
    record_velocity: bool = False     # rollout must record v_old at every state
    offline: bool = False             # trains from a dataset instead of rollouts
    draws_noise: bool = False         # loss needs per-unit generators (noise / time sampling)
    stochastic_sampler: Optional[bool] = None  # True: needs std > 0; False: needs an ODE-like sampler

    def __init__(self, config: AlgorithmConfig):
        self.config = config

    # --- what the rollout needs -------------------------------------------------------
    @property
    def group_size(self) -> int:
        return int(getattr(self.config, "group_size", 1))

    @property
    def reference_weight(self) -> Optional[str]:
        """The config field whose weight > 0 makes the loss call ``policy.reference_velocity``
        (a KL or distance to the starting policy), or None when the loss never calls it."""
        return None

    @property
    def shared_init_noise(self) -> bool:
        """Samples of a group start from the same noise (FDFO pairs, DanceGRPO option)."""
        return bool(getattr(self.config, "shared_init_noise", False))

    # --- online hooks -------------------------------------------------------------------
    def compute_advantages(
        self, traj: Trajectory, per_reward: Dict[str, Tensor], per_valid: Dict[str, Tensor],
        reward_weights: Dict[str, float],
    ) -> Tuple[Trajectory, Dict[str, float]]:
        """Fill ``traj.advantages`` and ``traj.weights`` from the (global) rewards."""
        raise NotImplementedError

    def make_units(self, traj: Trajectory, steps: Tensor) -> Dict[str, Tensor]:
        """Flatten into training units: dict of [U, ...] tensors with ``sample_idx``."""
        raise NotImplementedError

    def unit_norm(self, units: Dict[str, Tensor]) -> Tensor:
        """[U] each unit's share of the minibatch denominator (default 1 = plain mean)."""
        return torch.ones(len(units["sample_idx"]))

    def loss(
        self, units: Dict[str, Tensor], cond: Dict[str, Tensor], policy: Policy,
        generator: Optional[Sequence[torch.Generator]] = None,
    ) -> Tuple[Tensor, Dict[str, Tensor]]:
        """(per-unit loss [m], per-unit metrics {name: [m]}) for a minibatch slice.

        ``generator``: one generator per unit, derived from the unit's global id, for
        losses that draw noise (offline regression), so results do not depend on how
        many processes share the minibatch.
        """
        raise NotImplementedError

    # --- state (checkpointed) -----------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        return None


def event_size(x: Tensor, event_ndim: Optional[int]) -> int:
    """Number of elements in one event of x [B, ...] (one agent's action, or a sample)."""
    dims = x.shape[1:] if event_ndim is None else x.shape[x.ndim - event_ndim:]
    n = 1
    for d in dims:
        n *= int(d)
    return n


def mean_over_event(x: Tensor, event_ndim: Optional[int]) -> Tensor:
    """Mean over the event dims: [B, ...] -> [B] (or [B, A])."""
    k = x.ndim - 1 if event_ndim is None else event_ndim
    return x.mean(dim=tuple(range(x.ndim - k, x.ndim))) if k > 0 else x
