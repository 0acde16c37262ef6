"""Checks the trainer makes once its parts are built: what a config alone cannot tell.

Each raises ``ConfigError`` with one line that names the key to change.
"""
from __future__ import annotations

import torch

from flowrl.config import TrainConfig
from flowrl.data import ItemSource
from flowrl.mdp import DenoisingChain
from flowrl.registry import ConfigError
from flowrl.samplers import Sampler


def check_correlated_noise(cfg: TrainConfig, head, data) -> None:
    """sampler.noise_corr correlates one axis of an action (one of its event dims, found from
    one probe item's noise) and needs a KL that reads log-probs (k3)."""
    c, alg = cfg.sampler, cfg.algorithm
    if getattr(alg, "kl_type", None) == "gaussian_mean" and getattr(alg, "kl_beta", 0) > 0:
        raise ConfigError("algorithm.kl_type: gaussian_mean assumes independent step noise; use k3 with "
                          "sampler.noise_corr > 0")
    if not isinstance(data, ItemSource):
        return
    probe = list(data.eval_items())[:1] or list(data.train_items())[:1]
    x = head.init_noise(head.encode(probe), [torch.Generator().manual_seed(0)])
    event = x.ndim - 1 if head.event_ndim is None else head.event_ndim
    if -c.noise_corr_dim > event:
        raise ConfigError(f"sampler.noise_corr_dim={c.noise_corr_dim} lies outside one action of head "
                          f"{cfg.head.name} (shape {tuple(x.shape[1:])}, event dims -1..-{event}); "
                          f"pick one of those")


def check_trained_steps_are_noisy(chain: DenoisingChain, sampler: Sampler, name: str) -> None:
    """Every step the trainable window can reach must have std > 0 under the training
    sampler ``name`` (a step to t = 0 has none with CPS, or with DDIM when alpha_bar(0) = 1)."""
    times, start = chain.times, chain.config.train_window_start
    x = torch.zeros(1, 1, dtype=torch.float64)
    for k in chain.reachable_steps().tolist():
        std = sampler.mean_std(x, x, times[k:k + 1].double(), times[k + 1:k + 2].double())[1]
        if float(std.max()) == 0:
            raise ConfigError(f"chain: step {k} (t {float(times[k]):.3g} -> {float(times[k + 1]):.3g}) of sampler "
                              f"{name} has no noise, so it cannot be trained; end the window before it "
                              f"(chain.train_window_size={max(k - start, 1)}, chain.window_slide_every=0)")
