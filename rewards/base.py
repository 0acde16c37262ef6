"""Reward protocol, registry and the composite reward the trainer calls.

A reward maps decoded outputs and their batch to ``RewardOutput(score, valid, info)``.
``score`` is [B] (or [B, A] for multi-agent planners); ``valid`` marks scores that could
be computed. There are no sentinel values: a failed score is ``valid=False``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

import torch

from flowrl._fields import hfield
from flowrl.registry import ConfigError, Registry
from flowrl.types import RewardOutput

REWARDS = Registry("reward")


@dataclass
class RewardConfig:
    """Fields every reward config has; a reward's own config subclasses this."""

    name: str = hfield("", "registered reward name (see `flowrl validate --list rewards`)")
    weight: float = hfield(1.0, "weight of this reward in the aggregate (0 = log only)")


class Reward:
    """Base class: subclasses implement ``score(outputs, batch) -> RewardOutput``."""

    differentiable: bool = False

    def __init__(self, config: RewardConfig):
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    def score(self, outputs: Any, batch: Sequence[Any]) -> RewardOutput:
        raise NotImplementedError

    def __call__(self, outputs: Any, batch: Sequence[Any]) -> RewardOutput:
        """Score with failure isolation: an exception or NaN marks samples invalid."""
        n = len(batch)
        try:
            if self.differentiable:
                out = self.score(outputs, batch)
            else:
                with torch.no_grad():
                    out = self.score(outputs, batch)
        except Exception as e:  # a broken reward must not kill the run; it is counted
            score = torch.zeros(n)
            return RewardOutput(score, torch.zeros(n, dtype=torch.bool), {"error": f"{type(e).__name__}: {e}"})
        finite = torch.isfinite(out.score)
        valid = out.valid & finite
        return RewardOutput(torch.where(valid, out.score, torch.zeros_like(out.score)).float(), valid, out.info)


def build_reward(config: RewardConfig) -> Reward:
    return REWARDS.get(config.name).builder(config)


@dataclass
class CompositeOutput:
    """Aggregate of several rewards. total/valid: [B] or [B, A]; per_reward: name -> [B]."""

    total: torch.Tensor
    valid: torch.Tensor
    per_reward: Dict[str, torch.Tensor]
    per_valid: Dict[str, torch.Tensor]
    metrics: Dict[str, float]


class CompositeReward:
    """Calls every configured reward and combines them with their weights.

    The weighted sum is computed here; per-reward group normalisation before summing
    (multi-reward balancing) lives in ``flowrl.algorithms.advantages`` because it needs
    the globally gathered groups.
    """

    def __init__(self, configs: List[RewardConfig]):
        if not configs:
            raise ConfigError("rewards: empty; name at least one reward, e.g. rewards=[{name: ...}]")
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise ConfigError(f"rewards: duplicate reward names {names}; give each reward once")
        self.rewards = [build_reward(c) for c in configs]
        self.weights = {c.name: float(c.weight) for c in configs}

    @property
    def names(self) -> List[str]:
        return [r.name for r in self.rewards]

    def __call__(self, outputs: Any, batch: Sequence[Any]) -> CompositeOutput:
        per, per_valid, metrics = {}, {}, {}
        total, valid = None, None
        for r in self.rewards:
            out = r(outputs, batch)
            per[r.name], per_valid[r.name] = out.score, out.valid
            v = out.valid
            metrics[f"reward/{r.name}"] = float(out.score[v].mean()) if bool(v.any()) else math.nan
            metrics[f"reward/{r.name}_invalid_frac"] = float((~v).float().mean())
            w = self.weights[r.name]
            contrib = w * out.score
            total = contrib if total is None else total + contrib
            if w != 0:
                valid = v if valid is None else valid & v
        if valid is None:
            valid = torch.ones_like(total, dtype=torch.bool)
        return CompositeOutput(total, valid, per, per_valid, metrics)
