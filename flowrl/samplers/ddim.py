"""DDIM sampler for epsilon-prediction models (SD 1.x-style UNets).

Time mapping: with N train timesteps, train timestep tau in {0, ..., N-1} is t = (tau + 1) / N,
so alpha_bar(t) = alphas_cumprod[round(t N) - 1] for t > 0 and alpha_bar(0) = 1 (diffusers'
``set_alpha_to_one=True``). ``timestep(t)`` gives the tau to feed the UNet. A diffusers step
tau -> tau - N / K (K inference steps) is t = (tau + 1) / N -> t_prev = (tau + 1 - N / K) / N,
with t_prev = 0 when tau - N / K < 0.

Step (v = predicted eps, a_t = alpha_bar(t), a_p = alpha_bar(t_prev)):
    x0_hat = (x - sqrt(1 - a_t) v) / sqrt(a_t)
    sigma  = eta * sqrt((1 - a_p) / (1 - a_t)) * sqrt(1 - a_t / a_p)
    mean   = sqrt(a_p) x0_hat + sqrt(1 - a_p - sigma^2) v,   std = sigma
Sample clipping / thresholding are not applied (diffusers' clip_sample=False behaviour).
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from flowrl.samplers.base import Sampler, TimeLike, expand_like

Tensor = torch.Tensor


class DDIMSampler(Sampler):
    """DDIM (eta = 0 deterministic, eta = 1 DDPM-like). alphas_cumprod: [N]."""

    prediction = "epsilon"

    def __init__(self, alphas_cumprod: Tensor, eta: float = 1.0) -> None:
        ac = torch.as_tensor(alphas_cumprod, dtype=torch.float64).detach().cpu()
        if ac.ndim != 1 or ac.numel() == 0:
            raise ValueError(f"alphas_cumprod must be a non-empty 1-D tensor, got shape {tuple(ac.shape)}")
        if eta < 0:
            raise ValueError(f"eta={eta} must be >= 0")
        self.alphas_cumprod = ac
        self.num_train_timesteps = int(ac.numel())
        self.eta = float(eta)
        self._on_device: Dict[torch.device, Tensor] = {}

    @classmethod
    def from_scheduler_config(cls, config: Dict[str, Any], eta: float = 1.0) -> "DDIMSampler":
        """Build from a diffusers scheduler config dict (offline): reads DDIMScheduler's alphas_cumprod.

        Only the noise schedule is taken; ``clip_sample`` / ``thresholding`` in the config are ignored.
        """
        from diffusers import DDIMScheduler

        scheduler = DDIMScheduler.from_config(dict(config))
        pred = scheduler.config.prediction_type
        if pred != "epsilon":
            raise ValueError(f"DDIMSampler needs prediction_type='epsilon', scheduler config has {pred!r}")
        return cls(scheduler.alphas_cumprod, eta=eta)

    def _index(self, t: Tensor) -> Tensor:
        """t: [B] -> long [B] round(t N) - 1 (-1 for t = 0); checks t lies on the grid."""
        tn = torch.as_tensor(t, dtype=torch.float64) * self.num_train_timesteps
        idx = torch.round(tn)
        if bool(((tn - idx).abs() > 1e-2).any()) or bool(((idx < 0) | (idx > self.num_train_timesteps)).any()):
            raise ValueError(f"DDIM times must be in {{0, 1/N, ..., 1}} with N={self.num_train_timesteps}; got {t}")
        return idx.long() - 1

    def timestep(self, t: TimeLike) -> Tensor:
        """t: float or [B] -> train timestep tau = round(t N) - 1 as a float32 tensor (-1 at t = 0)."""
        t = torch.as_tensor(t)
        return self._index(t).to(torch.float32)

    def alpha_bar(self, t: Tensor) -> Tensor:
        """t: [B] -> alpha_bar(t) [B] float64 on t's device (1.0 at t = 0)."""
        t = torch.as_tensor(t)
        idx = self._index(t)
        ac = self._on_device.get(t.device)
        if ac is None:
            ac = self._on_device[t.device] = self.alphas_cumprod.to(t.device)
        return torch.where(idx >= 0, ac[idx.clamp(min=0)], torch.ones((), dtype=torch.float64, device=t.device))

    def mean_std(self, v: Tensor, x: Tensor, t: Tensor, t_next: Tensor):
        """v (eps prediction), x: [B, ...]; t, t_next: [B]. Returns (mean [B, ...], std [B] in x's dtype)."""
        a_t, a_p = self.alpha_bar(t), self.alpha_bar(t_next)
        sigma = self.eta * torch.sqrt((1 - a_p) / (1 - a_t)) * torch.sqrt((1 - a_t / a_p).clamp(min=0))
        x0_hat = (x - expand_like(torch.sqrt(1 - a_t), x) * v) / expand_like(torch.sqrt(a_t), x)
        direction = expand_like(torch.sqrt((1 - a_p - sigma**2).clamp(min=0)), x) * v
        mean = expand_like(torch.sqrt(a_p), x) * x0_hat + direction
        return mean, sigma.to(x.dtype)
