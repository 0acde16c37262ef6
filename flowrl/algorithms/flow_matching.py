"""Offline weighted denoising regression (flow matching / epsilon matching).

The offline counterpart of the online methods: pretraining a head on demonstrations,
or adapting it with per-sample weights (PTR computes those weights; reward-weighted
regression is another choice). Per sample i with data x0, noise eps and time t:

    velocity heads:  x_t = (1 - t) x0 + t eps,                      target eps - x0
    epsilon heads:   x_t = sqrt(a(t)) x0 + sqrt(1 - a(t)) eps,      target eps
                     (t snapped to the sampler's train-timestep grid {1/N, ..., 1} when it
                     has one, e.g. DDIM: alpha_bar exists only there)
    l_i = mean((model(x_t, t) - target)^2)   (or the head's ``regression_loss(v, x_t, t, x0, eps, cond)``
                                              when it defines one: masks, losses on decoded outputs)
    loss = sum_i w_i l_i / sum_i w_i        (self-normalised over the global minibatch)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch

from flowrl._fields import hfield
from flowrl.algorithms.base import Algorithm, AlgorithmConfig, Policy, mean_over_event
from flowrl.registry import ALGORITHMS
from flowrl.samplers.base import randn_like

Tensor = torch.Tensor


@dataclass
class FlowMatchingConfig(AlgorithmConfig):
    """Weighted flow matching (Lipman et al., 2023) for offline training."""

    name: str = hfield("flow_matching", "algorithm name")
    time_sampling: str = hfield("uniform", "how t is drawn: uniform or logit_normal (SD3)")
    logit_mean: float = hfield(0.0, "logit-normal mean (SD3: 0.0)")
    logit_std: float = hfield(1.0, "logit-normal std (SD3: 1.0)")
    weight_key: Optional[str] = hfield(None, "dataset column used as per-sample weight (None = uniform)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.time_sampling not in ("uniform", "logit_normal"):
            raise ValueError("algorithm.time_sampling must be 'uniform' or 'logit_normal'")


def sample_times(generators: Sequence[torch.Generator], mode: str, mean: float, std: float) -> Tensor:
    """[n] times in (0, 1), sample i drawn from ``generators[i]``."""
    if mode == "uniform":
        return torch.stack([torch.rand((), generator=g) for g in generators]).clamp(1e-4, 1 - 1e-4)
    return torch.sigmoid(mean + std * torch.stack([torch.randn((), generator=g) for g in generators]))


def snap_to_train_timesteps(t: Tensor, num_train_timesteps: int) -> Tensor:
    """[n] continuous t in (0, 1) -> the discrete DDPM grid {1/N, ..., N/N}: train timestep
    tau = floor(t N) (uniform t gives uniform tau in {0, ..., N-1}) at flowrl time (tau + 1) / N."""
    n = int(num_train_timesteps)
    tau = (t.double() * n).floor().clamp(0, n - 1)
    return ((tau + 1) / n).to(t.dtype)


def weighted_regression(per_sample: Tensor, weights: Tensor) -> Tensor:
    """Self-normalised weighted mean sum(w l) / sum(w); per_sample, weights: [B]."""
    return (weights * per_sample).sum() / weights.sum().clamp(min=1e-12)


class FlowMatching(Algorithm):
    offline = True
    draws_noise = True

    config: FlowMatchingConfig

    def make_offline_units(self, x0: Tensor, columns: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """x0 [B, ...] and dataset columns [B] -> units with per-sample ``weight``."""
        key = self.config.weight_key
        if key is not None and key not in columns:
            raise ValueError(f"algorithm.weight_key: the dataset has no column '{key}' (has {sorted(columns)})")
        w = columns[key].float() if key is not None else torch.ones(x0.shape[0])
        return {"sample_idx": torch.arange(x0.shape[0]), "x0": x0, "weight": w}

    def unit_norm(self, units):
        return units["weight"]

    def loss(self, units, cond, policy: Policy, generator=None):
        c = self.config
        x0 = units["x0"]
        n = x0.shape[0]
        if generator is None:
            generator = [torch.Generator().manual_seed(i) for i in range(n)]
        t = sample_times(generator, c.time_sampling, c.logit_mean, c.logit_std).to(x0.device)
        eps = randn_like(x0, generator)
        tb = t.view(-1, *([1] * (x0.ndim - 1)))
        if policy.prediction == "velocity":
            x_t, target = (1 - tb) * x0 + tb * eps, eps - x0
        elif policy.prediction == "epsilon":
            n = getattr(policy.sampler, "num_train_timesteps", None)
            if n is not None:  # a discrete-time schedule (DDIM) only defines alpha_bar on its grid
                t = snap_to_train_timesteps(t, n)
                tb = t.view_as(tb)
            a = policy.sampler.alpha_bar(t).to(x0.dtype).view_as(tb)
            x_t, target = a.sqrt() * x0 + (1 - a).sqrt() * eps, eps
        else:
            raise ValueError(f"unknown prediction type {policy.prediction!r}")
        out = policy.velocity(x_t, t, cond)
        # a head may define its own per-sample regression (masks, losses on decoded outputs)
        head = getattr(policy.velocity, "module", policy.velocity)
        hook = getattr(head, "regression_loss", None) if policy.prediction == "velocity" else None
        if hook is not None:
            per = hook(out, x_t, t, x0, eps, cond)
        else:
            per = mean_over_event((out.float() - target.float()) ** 2, None)
        return units["weight"] * per, {"loss/regression": per.detach()}


@ALGORITHMS.register("flow_matching", FlowMatchingConfig, help="offline weighted flow / epsilon matching")
def build_flow_matching(config: FlowMatchingConfig) -> FlowMatching:
    return FlowMatching(config)
