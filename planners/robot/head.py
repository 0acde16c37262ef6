"""Action-chunk head for MetaWorld: observation history -> a chunk of H actions.

One small MLP trunk (inputs: noisy chunk, normalised observation history, task embedding,
sinusoidal time features) serves two variants:

  prediction="velocity"  flow matching, x_t = (1 - t) x0 + t eps, target eps - x0, sampled
                         with Euler (flowrl's time: t = 1 noise, t = 0 data)
  prediction="epsilon"   DDPM epsilon prediction with a squared-cosine schedule over
                         ``num_train_timesteps`` N steps, sampled with DDIM; flowrl time
                         t = (tau + 1) / N (see ``flowrl.samplers.ddim``), t = 0 is clean

x lives in NORMALISED action space ([B, H, 4], (a - action_mean) / action_std); ``decode``
maps back to MetaWorld actions. Normalisation statistics are buffers, saved next to the
weights (``stats.safetensors``) so they travel with the checkpoint. Items are dicts
{"obs": [n_obs, 39], "task": int}.
"""
from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from flowrl._fields import hfield
from flowrl.heads.base import Head
from flowrl.registry import HEADS
from planners.robot.envs import ACTION_DIM, OBS_DIM, TASKS

Tensor = torch.Tensor


def cosine_alphas_cumprod(n: int, s: float = 0.008) -> Tensor:
    """[n] alpha_bar of the squared-cosine schedule (Nichol & Dhariwal), betas capped at 0.999."""
    steps = torch.arange(n + 1, dtype=torch.float64) / n
    f = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    betas = (1 - f[1:] / f[:-1]).clamp(max=0.999)
    return torch.cumprod(1 - betas, 0)


def time_features(t: Tensor, n: int = 16) -> Tensor:
    freqs = torch.exp(torch.linspace(0, math.log(1000.0), n, device=t.device))
    ang = t.float()[:, None] * freqs[None]
    return torch.cat([ang.sin(), ang.cos()], 1)


@dataclass
class RobotHeadConfig:
    """Action-chunk head (flow matching or DDIM epsilon) over MetaWorld state observations."""

    name: str = hfield("robot", "head name")
    path: Optional[str] = hfield(None, "load a saved head (save_pretrained folder); other fields then come from it")
    prediction: str = hfield("velocity", "velocity (flow matching, Euler) or epsilon (DDPM / DDIM)")
    horizon: int = hfield(8, "actions per chunk H")
    exec_steps: int = hfield(4, "actions executed per chunk Ta (<= horizon)")
    n_obs: int = hfield(2, "observation history length")
    hidden: int = hfield(256, "trunk width")
    depth: int = hfield(3, "trunk hidden layers")
    task_dim: int = hfield(16, "task embedding size")
    num_train_timesteps: int = hfield(100, "epsilon variant: diffusion steps N of the cosine schedule")
    seed: int = hfield(0, "initialisation seed")
    stats_from: Optional[str] = hfield(None, "fresh head: normalisation statistics from 'pretrain_data' (the clean "
                                             "pretraining data: stats_episodes_per_task, cache_dir) or a head folder")
    stats_episodes_per_task: int = hfield(30, "stats_from=pretrain_data: episodes per source task (= data.episodes_per_task)")
    cache_dir: str = hfield("outputs/robot_data", "stats_from=pretrain_data: the data cache (= data.cache_dir)")

    def __post_init__(self) -> None:
        if self.prediction not in ("velocity", "epsilon"):
            raise ValueError("head.prediction must be 'velocity' or 'epsilon'")
        if not 1 <= self.exec_steps <= self.horizon:
            raise ValueError("head.exec_steps must be in [1, head.horizon]")
        if self.n_obs < 1 or self.hidden < 1 or self.depth < 1:
            raise ValueError("head.n_obs, head.hidden and head.depth must be >= 1")


class ChunkTrunk(nn.Module):
    """eps/velocity(x [B, H, A], t [B], obs [B, n_obs*39] normalised, task [B]) -> [B, H, A]."""

    def __init__(self, c: RobotHeadConfig):
        super().__init__()
        self.emb = nn.Embedding(len(TASKS), c.task_dim)
        din = c.horizon * ACTION_DIM + c.n_obs * OBS_DIM + c.task_dim + 32
        layers: List[nn.Module] = []
        for _ in range(c.depth):
            layers += [nn.Linear(din, c.hidden), nn.LayerNorm(c.hidden), nn.SiLU()]
            din = c.hidden
        layers.append(nn.Linear(din, c.horizon * ACTION_DIM))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, t: Tensor, obs: Tensor, task: Tensor) -> Tensor:
        h = torch.cat([x.flatten(1), obs, self.emb(task), time_features(t).to(x.dtype)], 1)
        return self.net(h).view_as(x)


class RobotHead(Head):
    event_ndim = None

    def __init__(self, config: RobotHeadConfig, stats: Optional[Dict[str, Tensor]] = None):
        super().__init__()
        self.config = config
        self.prediction = config.prediction
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.model = ChunkTrunk(config)
        stats = stats or {"obs_mean": torch.zeros(OBS_DIM), "obs_std": torch.ones(OBS_DIM),
                          "action_mean": torch.zeros(ACTION_DIM), "action_std": torch.ones(ACTION_DIM)}
        for k, v in stats.items():
            self.register_buffer(k, torch.as_tensor(v, dtype=torch.float32).clone())
        if config.prediction == "epsilon":
            self.alphas_cumprod = cosine_alphas_cumprod(config.num_train_timesteps)
        self.reference = copy.deepcopy(self.model).requires_grad_(False)
        self.eval()

    # ------------------------------------------------------------------ stats
    def set_stats(self, stats: Dict[str, Tensor]) -> None:
        for k, v in stats.items():
            getattr(self, k).copy_(torch.as_tensor(v, dtype=torch.float32))

    def stats(self) -> Dict[str, Tensor]:
        return {k: getattr(self, k).detach().clone() for k in ("obs_mean", "obs_std", "action_mean", "action_std")}

    def reset_reference(self) -> None:
        """Make the current weights the reference policy (after pretraining)."""
        self.reference.load_state_dict(self.model.state_dict())

    # ------------------------------------------------------------------ contract
    def encode(self, batch: Sequence[Any]) -> Dict[str, Tensor]:
        with torch.no_grad():
            obs = torch.stack([torch.as_tensor(np.asarray(b["obs"]), dtype=torch.float32) for b in batch])
            obs = obs[:, -self.config.n_obs:]
            if obs.shape[1] < self.config.n_obs:  # pad a short history with its first frame
                obs = torch.cat([obs[:, :1].expand(-1, self.config.n_obs - obs.shape[1], -1), obs], 1)
            obs = (obs.to(self.obs_mean.device) - self.obs_mean) / self.obs_std
            task = torch.as_tensor([int(b["task"]) for b in batch], dtype=torch.long, device=obs.device)
            return {"obs": obs.flatten(1), "task": task}

    def init_noise(self, cond, generators):
        shape = (self.config.horizon, ACTION_DIM)
        return torch.stack([torch.randn(shape, generator=g) for g in generators]).to(cond["obs"].device)

    def velocity(self, x, t, cond):
        return self.model(x, t.to(x.device), cond["obs"], cond["task"])

    def reference_velocity(self, x, t, cond):
        with torch.no_grad():
            return self.reference(x, t.to(x.device), cond["obs"], cond["task"])

    def decode(self, x, cond):
        return (x * self.action_std + self.action_mean).clamp(-1, 1)

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        if self.prediction != "epsilon":
            return None
        # diffusers' DDIM "leading" spacing: tau = (K-1) s, ..., s, 0 with s = N // K. It never
        # starts at tau = N - 1, where the capped cosine schedule has alpha_bar ~ 2e-7 and DDIM's
        # x0 estimate (x - sqrt(1 - a) eps) / sqrt(a) would amplify the eps error ~2000-fold.
        n = self.config.num_train_timesteps
        if not 1 <= num_steps <= n:
            raise ValueError(f"chain.num_steps must be in [1, {n}] for the epsilon head")
        taus = torch.arange(num_steps - 1, -1, -1, dtype=torch.float64) * (n // num_steps)
        return torch.cat([(taus + 1) / n, torch.zeros(1, dtype=torch.float64)]).float()

    # ------------------------------------------------------------------ training / sampling helpers
    def per_sample_loss(self, x0: Tensor, cond: Dict[str, Tensor], generators: Sequence[torch.Generator]) -> Tensor:
        """[B] denoising regression loss (reduction='none'); noise and t from generator i."""
        b = x0.shape[0]
        eps = torch.stack([torch.randn(x0.shape[1:], generator=g) for g in generators]).to(x0)
        u = torch.stack([torch.rand((), generator=g) for g in generators]).to(x0.device)
        if self.prediction == "velocity":
            t = u.clamp(1e-4, 1 - 1e-4)
            tb = t.view(b, 1, 1)
            xt, target = (1 - tb) * x0 + tb * eps, eps - x0
        else:
            n = self.config.num_train_timesteps
            tau = (u * n).long().clamp(max=n - 1)
            t = (tau + 1).float() / n
            a = self.alphas_cumprod.to(x0.device)[tau].to(x0.dtype).view(b, 1, 1)
            xt, target = a.sqrt() * x0 + (1 - a).sqrt() * eps, eps
        return (self.velocity(xt, t, cond) - target).pow(2).mean(dim=(1, 2))

    @torch.no_grad()
    def sample(self, cond: Dict[str, Tensor], generators: Sequence[torch.Generator], num_steps: int = 10) -> Tensor:
        """[B, H, 4] MetaWorld actions (deterministic sampler: Euler or DDIM eta=0)."""
        from flowrl.mdp import time_grid
        from flowrl.samplers.ddim import DDIMSampler
        from flowrl.samplers.ode import EulerSampler

        x = self.init_noise(cond, generators)
        if self.prediction == "velocity":
            sampler, times = EulerSampler(), time_grid(num_steps)
        else:
            sampler, times = DDIMSampler(self.alphas_cumprod, eta=0.0), self.time_grid(num_steps)
        for k in range(len(times) - 1):
            v = self.velocity(x, times[k].expand(x.shape[0]), cond)
            x = sampler.step(v, x, times[k], times[k + 1]).x_next
        return self.decode(x, cond)

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, os.path.join(directory, "model.safetensors"))
        save_file({k: v.contiguous() for k, v in self.stats().items()}, os.path.join(directory, "stats.safetensors"))
        with open(os.path.join(directory, "config.json"), "w") as fh:
            json.dump({**asdict(self.config), "path": None, "stats_from": None}, fh, indent=2)

    @classmethod
    def from_pretrained(cls, directory: str) -> "RobotHead":
        with open(os.path.join(directory, "config.json")) as fh:
            cfg = RobotHeadConfig(**{**json.load(fh), "path": None})
        head = cls(cfg, stats=load_file(os.path.join(directory, "stats.safetensors")))
        head.model.load_state_dict(load_file(os.path.join(directory, "model.safetensors")))
        head.reset_reference()
        head.config = RobotHeadConfig(**{**asdict(cfg), "path": directory})
        return head


@HEADS.register("robot", RobotHeadConfig, help="MetaWorld action-chunk head (flow matching or DDIM epsilon)")
def build_robot_head(config: RobotHeadConfig) -> RobotHead:
    if config.path:
        return RobotHead.from_pretrained(config.path)
    stats = None
    if config.stats_from == "pretrain_data":
        from planners.robot.data import RobotDataset, cached_episodes, pretrain_spec

        eps, _ = cached_episodes(pretrain_spec(config.stats_episodes_per_task), config.cache_dir)
        stats = RobotDataset(eps, config.horizon, config.n_obs, config.exec_steps).stats()
    elif config.stats_from:
        stats = load_file(os.path.join(config.stats_from, "stats.safetensors"))
    return RobotHead(config, stats=stats)
