"""Flow-matching SDE samplers with the flow ODE's marginals (Flow-GRPO / DanceGRPO).

With eps_hat = x + (1 - t) v (the model's noise estimate; score = -eps_hat / t), the
reverse SDE  dx = [v + sigma_t^2 / (2 t) * eps_hat] dt + sigma_t dW  (dt < 0) has the
same marginals as dx/dt = v. Euler-Maruyama with dt = t_next - t:

    mean = x + dt * (v + sigma_t^2 / (2 t) * (x + (1 - t) v)),   std = sigma_t * sqrt(-dt)

sigma_t = eta * sqrt(t / (1 - t)) ("flow_grpo", t clipped at t_cap inside the sqrt) or
sigma_t = eta ("constant", DanceGRPO).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from flowrl.samplers.base import Sampler, correlated_gaussian_log_prob, correlated_randn_like, expand_like

Tensor = torch.Tensor
NOISE_SCHEDULES = ("flow_grpo", "constant")


@dataclass
class FlowSDESampler(Sampler):
    """Stochastic flow sampler. eta = 0 reduces exactly to Euler (std 0, log_prob None).

    eta:            noise level (>= 0).
    noise_schedule: "flow_grpo" (sigma_t = eta sqrt(t/(1-t))) or "constant" (sigma_t = eta).
    t_cap:          flow_grpo only: sigma_t uses min(t, t_cap) so it stays finite at t = 1.
    noise_corr:     correlation rho in [0, 1) of the step noise along ``corr_dim`` (0 = independent,
                    the papers' sampler). Each entry keeps variance std^2; rho > 0 adds a shared
                    component along that axis, e.g. a whole control chunk's time axis, so that
                    exploration reaches "brake for the whole horizon" rather than averaging out.
    corr_dim:       the axis of x [B, ...] that noise_corr correlates (must be an event dim).
    """

    eta: float
    noise_schedule: str = "flow_grpo"
    t_cap: float = 0.99
    noise_corr: float = 0.0
    corr_dim: int = -2

    prediction = "velocity"

    def __post_init__(self) -> None:
        if self.noise_schedule not in NOISE_SCHEDULES:
            raise ValueError(f"noise_schedule={self.noise_schedule!r}; use one of {NOISE_SCHEDULES}")
        if self.eta < 0:
            raise ValueError(f"eta={self.eta} must be >= 0")
        if not 0.0 < self.t_cap < 1.0:
            raise ValueError(f"t_cap={self.t_cap} must lie in (0, 1)")
        if not 0.0 <= self.noise_corr < 1.0:
            raise ValueError(f"noise_corr={self.noise_corr} must lie in [0, 1)")

    def noise(self, x: Tensor, generator=None) -> Tensor:
        return correlated_randn_like(x, self.noise_corr, self.corr_dim, generator)

    def log_prob(self, x_next: Tensor, mean: Tensor, std: Tensor, event_ndim=None) -> Tensor:
        return correlated_gaussian_log_prob(x_next, mean, std, self.noise_corr, self.corr_dim, event_ndim)

    @classmethod
    def flow_grpo(cls, eta: float = 0.7) -> "FlowSDESampler":
        return cls(eta=eta, noise_schedule="flow_grpo")

    @classmethod
    def dance_grpo(cls, eta: float = 0.3) -> "FlowSDESampler":
        return cls(eta=eta, noise_schedule="constant")

    def sigma_and_drift_coef(self, t: Tensor):
        """t: [B] (> 0). Returns (sigma_t [B], sigma_t^2 / (2 t) [B])."""
        eta2 = self.eta**2
        if self.noise_schedule == "flow_grpo":
            tc = t.clamp(max=self.t_cap)
            sigma = self.eta * torch.sqrt(tc / (1 - tc))
            # sigma^2 / (2t) = eta^2 tc / (2 t (1 - tc)); tc / t == 1 below the cap (no 0/0 at small t).
            ratio = torch.where(t > self.t_cap, tc / t, torch.ones_like(t))
            coef = eta2 * ratio / (2 * (1 - tc))
        else:
            sigma = torch.full_like(t, self.eta)
            coef = eta2 / (2 * t.clamp(min=torch.finfo(t.dtype).tiny))
        return sigma, coef

    def mean_std(self, v: Tensor, x: Tensor, t: Tensor, t_next: Tensor):
        """v, x: [B, ...]; t, t_next: [B] with t > t_next >= 0. Returns (mean [B, ...], std [B])."""
        sigma, coef = self.sigma_and_drift_coef(t)
        dt = t_next - t
        eps_hat = x + expand_like(1 - t, x) * v
        mean = x + expand_like(dt, x) * (v + expand_like(coef, x) * eps_hat)
        std = sigma * torch.sqrt((-dt).clamp(min=0))
        return mean, std
