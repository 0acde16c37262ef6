"""Samplers: Euler / Heun ODE, Flow-GRPO & DanceGRPO SDEs, coefficients-preserving (CPS), DDIM, FDFO churn, CFG helpers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import torch

from flowrl._fields import hfield
from flowrl.samplers.base import Sampler, gaussian_log_prob
from flowrl.samplers.churn import ChurnSampler
from flowrl.samplers.cps import FlowCPSSampler
from flowrl.samplers.ddim import DDIMSampler
from flowrl.samplers.guidance import cfg_combine, guided_velocity
from flowrl.samplers.ode import EulerSampler, heun_step
from flowrl.samplers.sde import FlowSDESampler


@dataclass
class SamplerConfig:
    """Which sampler a rollout uses (config key ``sampler``)."""

    name: str = hfield("flow_sde", help="sampler: euler | flow_sde | dance_sde | cps | ddim | churn")
    eta: float = hfield(0.7, help="noise level: SDE eta (flow_sde, dance_sde), DDIM eta, or CPS eta in [0, 1] "
                                  "(fresh noise enters each step's noise part with weight sin(eta pi / 2)); >= 0")
    gamma: float = hfield(0.0025, help="churn strength g of the FDFO churn sampler; >= 0")
    init_gamma: Optional[float] = hfield(None, help="churn: strength of the churn of the starting noise alone (each "
                                                    "branch's x_1); null = gamma, as in the paper")
    t_cap: float = hfield(0.99, help="flow_sde: sigma_t uses min(t, t_cap) to stay finite at t = 1; in (0, 1)")
    noise_corr: float = hfield(0.0, help="flow_sde / dance_sde: correlation in [0, 1) of the step noise along "
                                         "noise_corr_dim (0 = independent, as in the papers); log-probs stay exact")
    noise_corr_dim: int = hfield(-2, help="the axis of a sample that noise_corr correlates, counted from the end "
                                          "(-2 = a [.., H, D] chunk's time axis H); must be inside one action")

    def __post_init__(self) -> None:
        if self.name not in SAMPLERS:
            raise ValueError(f"sampler.name={self.name!r} is unknown; set sampler.name to one of {sorted(SAMPLERS)}")
        if self.eta < 0:
            raise ValueError(f"sampler.eta={self.eta} is negative; set sampler.eta >= 0 (0 = deterministic)")
        if self.name == "cps" and self.eta > 1:
            raise ValueError(f"sampler.eta={self.eta} is out of range for cps; set it in [0, 1] (1 = redraw all noise)")
        if self.gamma < 0:
            raise ValueError(f"sampler.gamma={self.gamma} is negative; set sampler.gamma >= 0 (0 = no churn)")
        if self.init_gamma is not None and self.init_gamma < 0:
            raise ValueError(f"sampler.init_gamma={self.init_gamma} is negative; set it >= 0 (or null = sampler.gamma)")
        if self.init_gamma is not None and self.name != "churn":
            raise ValueError(f"sampler.init_gamma applies to the churn sampler, not {self.name!r}; leave it unset")
        if not 0.0 < self.t_cap < 1.0:
            raise ValueError(f"sampler.t_cap={self.t_cap} is out of range; set sampler.t_cap in (0, 1), e.g. 0.99")
        if not 0.0 <= self.noise_corr < 1.0:
            raise ValueError(f"sampler.noise_corr={self.noise_corr} is out of range; set it in [0, 1) (0 = independent)")
        if self.noise_corr > 0 and self.name not in ("flow_sde", "dance_sde"):
            raise ValueError(f"sampler.noise_corr applies to flow_sde / dance_sde, not {self.name!r}; leave it at 0")
        if self.noise_corr_dim >= 0:
            raise ValueError(f"sampler.noise_corr_dim={self.noise_corr_dim}; count it from the end (e.g. -2)")


def _build_ddim(cfg: SamplerConfig, alphas_cumprod: Optional[torch.Tensor]) -> Sampler:
    if alphas_cumprod is None:
        raise ValueError("sampler.name='ddim' needs alphas_cumprod (from the head's scheduler); pass it to build_sampler")
    return DDIMSampler(alphas_cumprod, eta=cfg.eta)


Builder = Callable[[SamplerConfig, Optional[torch.Tensor]], Sampler]

SAMPLERS: Dict[str, Builder] = {
    "euler": lambda cfg, ac: EulerSampler(),
    "flow_sde": lambda cfg, ac: FlowSDESampler(eta=cfg.eta, noise_schedule="flow_grpo", t_cap=cfg.t_cap,
                                               noise_corr=cfg.noise_corr, corr_dim=cfg.noise_corr_dim),
    "dance_sde": lambda cfg, ac: FlowSDESampler(eta=cfg.eta, noise_schedule="constant", t_cap=cfg.t_cap,
                                                noise_corr=cfg.noise_corr, corr_dim=cfg.noise_corr_dim),
    "cps": lambda cfg, ac: FlowCPSSampler(eta=cfg.eta),
    "ddim": _build_ddim,
    "churn": lambda cfg, ac: ChurnSampler(gamma=cfg.gamma, init_gamma=cfg.init_gamma),
}


def build_sampler(cfg: SamplerConfig, alphas_cumprod: Optional[torch.Tensor] = None) -> Sampler:
    """Instantiate the sampler named by ``cfg.name``; alphas_cumprod [N] is required for "ddim"."""
    if cfg.name not in SAMPLERS:
        raise ValueError(f"sampler.name={cfg.name!r} is unknown; set sampler.name to one of {sorted(SAMPLERS)}")
    return SAMPLERS[cfg.name](cfg, alphas_cumprod)


__all__ = [
    "Sampler",
    "gaussian_log_prob",
    "EulerSampler",
    "heun_step",
    "FlowSDESampler",
    "FlowCPSSampler",
    "DDIMSampler",
    "ChurnSampler",
    "cfg_combine",
    "guided_velocity",
    "SamplerConfig",
    "SAMPLERS",
    "build_sampler",
]
