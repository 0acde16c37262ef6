"""Flow-GRPO and DanceGRPO: per-step PPO ratio with group-relative advantages.

Each denoising step of an SDE sampler is a Gaussian policy step, so its log-prob is
exact. For a rollout transition (x, t -> x_next) with advantage A (of its sample):

    ratio = exp(log p_theta(x_next | x) - log p_old(x_next | x))
    loss  = max(-A * ratio, -A * clip(ratio, 1 - c_low, 1 + c_high)) * w_step + beta * KL

Log-probs are divided by the event size when ``ratio_per_dim`` (Flow-GRPO's per-element
mean, which keeps the ratio near 1 for images). KL to the reference policy is either
Flow-GRPO's closed form for two Gaussians with equal std, ||mu_theta - mu_ref||^2 / (2 std^2)
(per element), or the k3 estimator exp(r) - r - 1 with r = log p_ref - log p_theta.
DanceGRPO is the same loss with a constant-eta SDE and, optionally, one initial noise
shared by the whole group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from flowrl._fields import hfield
from flowrl.algorithms.advantages import group_all, group_normalize, per_reward_normalize, zero_std_fraction
from flowrl.algorithms.base import Algorithm, AlgorithmConfig, Policy, event_size, mean_over_event
from flowrl.mdp import DenoisingChain
from flowrl.registry import ALGORITHMS
from flowrl.types import Trajectory

Tensor = torch.Tensor


@dataclass
class GRPOConfig(AlgorithmConfig):
    """Flow-GRPO (Liu et al., 2025) defaults."""

    name: str = hfield("flow_grpo", "algorithm name")
    group_size: int = hfield(24, "samples per prompt (Flow-GRPO: 24)")
    clip_range: float = hfield(1e-4, "PPO clip range c_low (Flow-GRPO: 1e-4)")
    clip_range_high: Optional[float] = hfield(None, "upper clip c_high (None = same as clip_range)")
    adv_clip_max: float = hfield(5.0, "advantages are clipped to [-adv_clip_max, adv_clip_max]")
    kl_beta: float = hfield(0.04, "weight of the KL to the reference policy (Flow-GRPO: 0.04)")
    kl_type: str = hfield("gaussian_mean", "KL form: gaussian_mean (Flow-GRPO) or k3")
    global_std: bool = hfield(False, "normalise advantages by the global reward std instead of the group's")
    per_reward_norm: bool = hfield(False, "normalise each reward within its group before summing (multi-reward balancing)")
    std_eps: float = hfield(1e-4, "epsilon added to the std in advantage normalisation")
    ratio_per_dim: bool = hfield(True, "divide log-probs by the event size (per-element ratio, Flow-GRPO)")
    shared_init_noise: bool = hfield(False, "all samples of a group start from the same noise (DanceGRPO option)")
    step_gamma: float = hfield(1.0, "per-denoising-step weight gamma^(K-1-k): 1 = uniform (VG-GRPO: 0.9)")
    drop_invalid_groups: bool = hfield(False, "drop a whole group when any member's reward is invalid "
                                              "(default: drop only the invalid samples; the rest keep their group stats)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.group_size < 2:
            raise ValueError("algorithm.group_size must be >= 2 (group-relative advantages need a group)")
        if self.clip_range <= 0 or (self.clip_range_high is not None and self.clip_range_high <= 0):
            raise ValueError("algorithm.clip_range must be > 0")
        if self.kl_type not in ("gaussian_mean", "k3"):
            raise ValueError("algorithm.kl_type must be 'gaussian_mean' or 'k3'")
        if self.kl_beta < 0:
            raise ValueError("algorithm.kl_beta must be >= 0")
        if not 0 < self.step_gamma <= 1:
            raise ValueError("algorithm.step_gamma must be in (0, 1]")


@dataclass
class DanceGRPOConfig(GRPOConfig):
    """DanceGRPO (Xue et al., 2025) defaults: same loss, constant-eta SDE, shared noise."""

    name: str = hfield("dance_grpo", "algorithm name")
    group_size: int = hfield(12, "samples per prompt (DanceGRPO: 12)")
    kl_beta: float = hfield(0.0, "DanceGRPO trains without a KL term")
    shared_init_noise: bool = hfield(True, "DanceGRPO starts every sample of a group from one noise")


def ppo_clip_loss(log_ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float) -> Tuple[Tensor, Tensor]:
    """Pessimistic PPO objective. log_ratio, adv: [m] or [m, A]. Returns (loss, clipped mask)."""
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped)


def k3_kl(log_p: Tensor, log_ref: Tensor) -> Tensor:
    """k3 estimator of KL(p || ref) from samples of p: exp(r) - r - 1, r = log_ref - log_p."""
    r = log_ref - log_p
    return torch.exp(r) - r - 1


def step_weights(steps: Tensor, num_steps: int, gamma: float) -> Tensor:
    """gamma^(K-1-k) for step indices k [m]: the final denoising step has weight 1."""
    return gamma ** (num_steps - 1 - steps).double()


class GRPO(Algorithm):
    needs_log_prob = True
    stochastic_sampler = True

    config: GRPOConfig

    @property
    def reference_weight(self) -> Optional[str]:
        return "kl_beta" if self.config.kl_beta > 0 else None

    def compute_advantages(self, traj, per_reward, per_valid, reward_weights):
        c = self.config
        if c.per_reward_norm:
            adv, valid = per_reward_normalize(per_reward, per_valid, reward_weights, traj.group_ids, std_eps=c.std_eps)
            adv = adv.clamp(-c.adv_clip_max, c.adv_clip_max)
        else:
            valid = traj.valid
            adv = group_normalize(traj.rewards, traj.group_ids, valid, std_eps=c.std_eps,
                                  global_std=c.global_std, clip=c.adv_clip_max)
        if c.drop_invalid_groups:
            valid = valid & group_all(valid, traj.group_ids)
            adv = torch.where(valid, adv, torch.zeros_like(adv))
        metrics = {"adv/zero_std_frac": zero_std_fraction(traj.rewards, traj.group_ids, traj.valid),
                   "adv/abs_mean": float(adv.abs().mean()),
                   "adv/dropped_frac": float(1 - valid.float().mean())}
        return traj.replace(advantages=adv, weights=valid.float()), metrics

    def make_units(self, traj: Trajectory, steps: Tensor) -> Dict[str, Tensor]:
        keep = traj.weights > 0
        if keep.ndim > 1:
            keep = keep.any(dim=tuple(range(1, keep.ndim)))
        units = DenoisingChain.step_view(traj, steps)
        units["adv"] = traj.advantages[units["sample_idx"]]
        units["valid"] = traj.weights[units["sample_idx"]]
        units["step_weight"] = step_weights(units["step"], traj.num_steps, self.config.step_gamma).float()
        mask = keep[units["sample_idx"]]
        return {k: v[mask] for k, v in units.items()}

    def loss(self, units, cond, policy: Policy, generator=None):
        c = self.config
        x, x_next, t, t_next = units["x"], units["x_next"], units["t"], units["t_next"]
        v = policy.velocity(x, t, cond)
        out = policy.sampler.step(v, x, t, t_next, x_next=x_next, event_ndim=policy.event_ndim)
        if out.log_prob is None:
            raise RuntimeError("GRPO needs a stochastic sampler (std > 0 on every trained step)")
        scale = 1.0 / event_size(x, policy.event_ndim) if c.ratio_per_dim else 1.0
        lp, old = out.log_prob.float() * scale, units["old_log_prob"].float() * scale
        adv = units["adv"]
        high = c.clip_range if c.clip_range_high is None else c.clip_range_high
        pl, clipped = ppo_clip_loss(lp - old, adv, c.clip_range, high)
        pl = pl * units["valid"]
        metrics = {
            "policy/approx_kl": 0.5 * (lp - old).detach() ** 2,
            "policy/clipfrac": clipped.float().detach(),
            "policy/ratio": torch.exp(lp - old).detach(),
        }
        if c.kl_beta > 0:
            with torch.no_grad():
                v_ref = policy.reference_velocity(x, t, cond)
            ref = policy.sampler.step(v_ref, x, t, t_next, x_next=x_next, event_ndim=policy.event_ndim)
            if c.kl_type == "gaussian_mean":
                kl = mean_over_event((out.mean - ref.mean) ** 2, policy.event_ndim)
                var = (out.std.float() ** 2).reshape(-1, *([1] * (kl.ndim - 1)))
                kl = kl / (2 * var)
            else:
                kl = k3_kl(lp, ref.log_prob.float() * scale)
            pl = pl + c.kl_beta * kl
            metrics["policy/kl_ref"] = kl.detach()
        if pl.ndim > 1:  # per-agent terms -> one loss per unit
            pl = pl.flatten(1).mean(dim=1)
            metrics = {k: m.flatten(1).mean(dim=1) if m.ndim > 1 else m for k, m in metrics.items()}
        return pl * units["step_weight"], metrics


@ALGORITHMS.register("flow_grpo", GRPOConfig, help="Flow-GRPO: per-step PPO with group advantages")
def build_flow_grpo(config: GRPOConfig) -> GRPO:
    return GRPO(config)


@ALGORITHMS.register("dance_grpo", DanceGRPOConfig, help="DanceGRPO: Flow-GRPO loss, constant-eta SDE, shared noise")
def build_dance_grpo(config: DanceGRPOConfig) -> GRPO:
    return GRPO(config)
