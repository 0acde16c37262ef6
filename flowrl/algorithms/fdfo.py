"""FDFO: finite-difference flow optimisation (the whole chain is one action).

Per prompt, one base noise is duplicated into two branches that are churned
independently (``ChurnSampler``) and sampled to endpoints x0_1, x0_2 with rewards R1, R2.

    dR        = (R1 - R2) / 2 on branch 1, -(R1 - R2) / 2 on branch 2
    delta     = (x0_own - x0_other) / 2
    delta_hat = delta / mean(delta^2)                         (per sample)
    v*        = v_old(x_t) - delta_hat                        (every recorded state)
    l         = -mean((v_theta(x_t) - v*)^2),  l_ref = -mean(delta_hat^2)
    rho       = exp(l - l_ref)                                (= 1 at the old policy)
    loss      = -dR * rho + |dR| / (2 eps) * (rho - 1)^2  [+ lambda * mean((v_theta - v_base)^2)]

Implemented from the method's description. With v = eps - x0 and x0 = x_t - t v,
lowering v by delta_hat moves the predicted endpoint towards the branch's own one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from flowrl._fields import hfield
from flowrl.algorithms.base import Algorithm, AlgorithmConfig, Policy, mean_over_event
from flowrl.mdp import DenoisingChain
from flowrl.registry import ALGORITHMS
from flowrl.types import Trajectory

Tensor = torch.Tensor


@dataclass
class FDFOConfig(AlgorithmConfig):
    """FDFO paper defaults."""

    name: str = hfield("fdfo", "algorithm name")
    eps: float = hfield(0.03, "trust-region width eps of the surrogate; it acts only from the second optimizer step "
                              "on a rollout (inner_epochs or num_minibatches > 1): at the first, rho = 1 and the "
                              "penalty's gradient is zero")
    base_weight: float = hfield(0.0, "lambda: weight of ||v_theta - v_base||^2 to the starting policy")
    delta_floor: float = hfield(1e-8, "floor on mean(delta^2) when normalising (identical branches)")
    skip_ties: bool = hfield(True, "leave pairs with equal rewards out of the update: their loss and gradient are "
                                   "exactly zero (unless base_weight > 0), so this only saves their forward/backward "
                                   "and averages over the informative pairs")

    @property
    def group_size(self) -> int:
        return 2

    @property
    def shared_init_noise(self) -> bool:
        return True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eps <= 0:
            raise ValueError("algorithm.eps must be > 0")
        if self.base_weight < 0:
            raise ValueError("algorithm.base_weight must be >= 0")


def pair_reward_difference(rewards: Tensor) -> Tensor:
    """[2P] rewards ordered (branch 1, branch 2) per pair -> dR [2P] = +-(R1 - R2)/2."""
    r = rewards.view(-1, 2)
    d = (r[:, 0] - r[:, 1]) / 2
    return torch.stack([d, -d], dim=1).reshape(-1)


def endpoint_offsets(final: Tensor, floor: float = 1e-8) -> Tensor:
    """final [2P, ...] endpoints ordered by pair -> delta_hat [2P, ...].

    delta = (x0_own - x0_other) / 2, delta_hat = delta / mean(delta^2) per sample.
    """
    f = final.view(-1, 2, *final.shape[1:])
    other = f.flip(1).reshape(final.shape)
    delta = (final - other) / 2
    ms = mean_over_event(delta**2, None).clamp(min=floor)
    return delta / ms.view(-1, *([1] * (final.ndim - 1)))


def fdfo_surrogate(v: Tensor, v_target: Tensor, l_ref: Tensor, d_r: Tensor, eps: float):
    """Per-unit FDFO loss. v, v_target: [m, ...]; l_ref, d_r: [m]. Returns (loss [m], rho [m])."""
    l = -mean_over_event((v - v_target) ** 2, None)
    rho = torch.exp(l - l_ref)
    loss = -d_r * rho + d_r.abs() / (2 * eps) * (rho - 1) ** 2
    return loss, rho


class FDFO(Algorithm):
    record_velocity = True
    stochastic_sampler = False

    config: FDFOConfig

    @property
    def reference_weight(self) -> Optional[str]:
        return "base_weight" if self.config.base_weight > 0 else None

    def compute_advantages(self, traj, per_reward, per_valid, reward_weights):
        if traj.batch_size % 2:
            raise ValueError("FDFO needs pairs: the global batch must be even")
        d_r = pair_reward_difference(traj.rewards.float())
        ok = traj.valid.view(-1, 2).all(dim=1).repeat_interleave(2)
        d_r = torch.where(ok, d_r, torch.zeros_like(d_r))
        metrics = {"adv/abs_mean": float(d_r.abs().mean()),
                   "adv/zero_std_frac": float((d_r.view(-1, 2)[:, 0].abs() <= 1e-12).double().mean())}
        return traj.replace(advantages=d_r, weights=ok.float()), metrics

    def make_units(self, traj: Trajectory, steps: Tensor) -> Dict[str, Tensor]:
        if traj.velocities is None:
            raise RuntimeError("FDFO needs the rollout's velocities (record_velocity)")
        delta_hat = endpoint_offsets(traj.final.float(), self.config.delta_floor)
        l_ref = -mean_over_event(delta_hat**2, None)
        units = DenoisingChain.step_view(traj, steps)
        idx = units.pop("sample_idx")
        units = {"sample_idx": idx, "x": units["x"], "t": units["t"],
                 "v_target": units["v_old"] - delta_hat[idx],
                 "l_ref": l_ref[idx], "d_r": traj.advantages[idx]}
        keep = traj.weights[idx] > 0
        if self.config.skip_ties and self.config.base_weight == 0:
            keep &= traj.advantages[idx] != 0
        return {k: v[keep] for k, v in units.items()}

    def loss(self, units, cond, policy: Policy, generator=None):
        v = policy.velocity(units["x"], units["t"], cond)
        loss, rho = fdfo_surrogate(v.float(), units["v_target"].float(), units["l_ref"], units["d_r"], self.config.eps)
        metrics = {"policy/rho": rho.detach(), "policy/abs_log_rho": torch.log(rho).abs().detach()}
        if self.config.base_weight > 0:
            with torch.no_grad():
                v_base = policy.reference_velocity(units["x"], units["t"], cond)
            reg = mean_over_event((v - v_base) ** 2, None)
            loss = loss + self.config.base_weight * reg
            metrics["policy/base_dist"] = reg.detach()
        return loss, metrics


@ALGORITHMS.register("fdfo", FDFOConfig, help="FDFO: finite-difference flow optimisation (paired branches)")
def build_fdfo(config: FDFOConfig) -> FDFO:
    return FDFO(config)
