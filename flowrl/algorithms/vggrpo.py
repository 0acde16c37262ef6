"""VG-GRPO (SCORP): GRPO with a variance gate on group advantages.

For each group with reward std sigma:
    sigma <= std1          -> the group is dropped (no signal, only noise);
    std1 < sigma <= std2   -> A = r - mean       (centred, not scaled: avoids blowing up noise);
    sigma > std2           -> A = (r - mean) / sigma.
Thresholds are absolute (paper: 0.03 / 0.06) or relative to a running mean of the
group-reward std (10% / 20%). The loss is Flow-GRPO's with an asymmetric clip
[1 - 0.15, 1 + 0.2], the k3 KL to the reference (beta 0.1) and a per-denoising-step
weight gamma^(K-1-k) (gamma 0.9).

Option (not in SCORP): ``best_weight`` > 0 adds best_weight x (1[best of group] - 1/G)
(``best_of_group``) to every sample's advantage, dropped groups included, which distils
the best-of-G selection of the closed loop into the policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from flowrl._fields import hfield
from flowrl.algorithms.advantages import _first_of_group, best_of_group, group_stats, zero_std_fraction
from flowrl.algorithms.grpo import GRPO, GRPOConfig
from flowrl.registry import ALGORITHMS

Tensor = torch.Tensor


@dataclass
class VGGRPOConfig(GRPOConfig):
    """SCORP's VG-GRPO defaults."""

    name: str = hfield("vg_grpo", "algorithm name")
    group_size: int = hfield(8, "closed-loop rollouts per scene")
    clip_range: float = hfield(0.15, "lower clip: ratio >= 1 - 0.15")
    clip_range_high: Optional[float] = hfield(0.2, "upper clip: ratio <= 1 + 0.2")
    kl_beta: float = hfield(0.1, "k3 KL weight to the reference policy")
    kl_type: str = hfield("k3", "KL estimator (SCORP: k3)")
    ratio_per_dim: bool = hfield(False, "planner actions are small: use the exact summed log-prob")
    step_gamma: float = hfield(0.9, "per-denoising-step weight gamma^(K-1-k)")
    gate: str = hfield("absolute", "threshold mode: absolute (std1/std2 in reward units) or relative (fractions of the running group std)")
    std1: float = hfield(0.03, "drop groups with std <= std1 (relative mode: fraction, e.g. 0.1)")
    std2: float = hfield(0.06, "scale by std only above std2 (relative mode: fraction, e.g. 0.2)")
    running_momentum: float = hfield(0.9, "EMA momentum of the running group-reward std (relative mode)")
    best_weight: float = hfield(0.0, "add best_weight x (1[best of group] - 1/G) to every sample's advantage, gated "
                                     "groups included: distils best-of-G selection (0 = SCORP)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.gate not in ("absolute", "relative"):
            raise ValueError("algorithm.gate must be 'absolute' or 'relative'")
        if not 0 <= self.std1 <= self.std2:
            raise ValueError("algorithm.std1 and algorithm.std2 must satisfy 0 <= std1 <= std2")
        if not 0 <= self.running_momentum < 1:
            raise ValueError("algorithm.running_momentum must be in [0, 1)")
        if self.best_weight < 0:
            raise ValueError("algorithm.best_weight must be >= 0")


def variance_gate(values: Tensor, group_ids: Tensor, valid: Tensor, std1: float, std2: float,
                  eps: float = 1e-8) -> Tuple[Tensor, Tensor, Tensor]:
    """Gated advantages. values/valid: [N] or [N, A]; group_ids: [N].

    Returns (advantage like values, kept bool like values, per-sample group std).
    """
    mean, std, cnt = group_stats(values, group_ids, valid)
    centred = values.double() - mean
    kept = valid & (cnt >= 2) & (std > std1)
    adv = torch.where(std > std2, centred / (std + eps), centred)
    adv = torch.where(kept, adv, torch.zeros_like(adv))
    return adv.float(), kept, std


class VGGRPO(GRPO):
    config: VGGRPOConfig

    def __init__(self, config: VGGRPOConfig):
        super().__init__(config)
        self.running_std: Optional[float] = None

    def thresholds(self, batch_std: float) -> Tuple[float, float]:
        c = self.config
        if c.gate == "absolute":
            return c.std1, c.std2
        if self.running_std is None:
            self.running_std = batch_std
        else:
            self.running_std = c.running_momentum * self.running_std + (1 - c.running_momentum) * batch_std
        return c.std1 * self.running_std, c.std2 * self.running_std

    def compute_advantages(self, traj, per_reward, per_valid, reward_weights):
        c = self.config
        _, std, _ = group_stats(traj.rewards, traj.group_ids, traj.valid)
        _, first = _first_of_group(traj.group_ids)
        std1, std2 = self.thresholds(float(std[first].mean()))
        adv, kept, _ = variance_gate(traj.rewards, traj.group_ids, traj.valid, std1, std2)
        weights = kept
        if c.best_weight > 0:
            best = best_of_group(traj.rewards, traj.group_ids, traj.valid)
            adv = adv + c.best_weight * best
            weights = kept | (best != 0)
        adv = adv.clamp(-c.adv_clip_max, c.adv_clip_max)
        kept_groups = kept[first]
        metrics = {
            "adv/dropped_group_frac": float(1 - kept_groups.double().mean()),
            "adv/zero_std_frac": zero_std_fraction(traj.rewards, traj.group_ids, traj.valid),
            "adv/gate_std1": std1,
            "adv/gate_std2": std2,
            "adv/abs_mean": float(adv.abs().mean()),
        }
        return traj.replace(advantages=adv, weights=weights.float()), metrics

    def state_dict(self):
        return {"running_std": self.running_std}

    def load_state_dict(self, state):
        self.running_std = state.get("running_std")


@ALGORITHMS.register("vg_grpo", VGGRPOConfig, help="VG-GRPO (SCORP): variance-gated GRPO")
def build_vg_grpo(config: VGGRPOConfig) -> VGGRPO:
    return VGGRPO(config)
