"""Tiny heads, analytic fields and seeded fixtures for tests, docs and the toy demo.

The toy world: 2-D data from an equal mixture of two Gaussians at (-2, 0) and (+2, 0).
``ToyHead`` is a small MLP velocity field pretrained by flow matching on it in a few
seconds (deterministic from its seed). ``toy_mode`` rewards samples on the favoured
side (x > 0) smoothly; ``toy_mode_fraction`` is the share of samples in the favoured
mode, so a pretrained model scores about 0.5 and a post-trained one close to 1.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from flowrl._fields import hfield
from flowrl.data import ItemSource, OfflineDataset
from flowrl.heads.base import Head
from flowrl.registry import DATASETS, ENVIRONMENTS, HEADS
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig

Tensor = torch.Tensor

MODES = torch.tensor([[-2.0, 0.0], [2.0, 0.0]])


def sample_mixture(n: int, generator: torch.Generator, std: float = 0.5, weights: Tuple[float, float] = (0.5, 0.5)) -> Tuple[Tensor, Tensor]:
    """n points of the toy mixture: (x [n, 2], mode index [n] long)."""
    w = torch.tensor(weights, dtype=torch.float)
    mode = torch.multinomial(w / w.sum(), n, replacement=True, generator=generator)
    x = MODES[mode] + std * torch.randn(n, 2, generator=generator)
    return x, mode


def time_features(t: Tensor, n: int = 8) -> Tensor:
    """[B] -> [B, 2n] sinusoidal features of t in [0, 1]."""
    freqs = torch.pi * 2.0 ** torch.arange(n, dtype=torch.float32, device=t.device) / 2
    ang = t.float()[:, None] * freqs[None]
    return torch.cat([ang.sin(), ang.cos()], dim=1)


class VelocityMLP(nn.Module):
    """v(x, t): [B, 2] x [B] -> [B, 2]."""

    def __init__(self, hidden: int = 64, depth: int = 3):
        super().__init__()
        layers: List[nn.Module] = []
        dim = 2 + 16
        for _ in range(depth):
            layers += [nn.Linear(dim, hidden), nn.SiLU()]
            dim = hidden
        layers.append(nn.Linear(dim, 2))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        return self.net(torch.cat([x, time_features(t).to(x.dtype)], dim=1))


def pretrain_flow_matching(model: VelocityMLP, steps: int, seed: int, batch: int = 256, lr: float = 3e-3) -> float:
    """Fit ``model`` to the toy mixture by flow matching; returns the last loss."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    loss = torch.tensor(0.0)
    for _ in range(steps):
        x0, _ = sample_mixture(batch, g)
        eps = torch.randn(batch, 2, generator=g)
        t = torch.rand(batch, generator=g)
        xt = (1 - t[:, None]) * x0 + t[:, None] * eps
        loss = ((model(xt, t) - (eps - x0)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return float(loss.detach())


@dataclass
class ToyHeadConfig:
    """The 2-D toy head."""

    name: str = hfield("toy", "head name")
    path: Optional[str] = hfield(None, "load a saved toy head (save_pretrained folder) instead of pretraining")
    hidden: int = hfield(64, "MLP width")
    depth: int = hfield(3, "MLP hidden layers")
    pretrain_steps: int = hfield(1500, "flow-matching steps run at construction (0 = random init)")
    pretrain_seed: int = hfield(0, "seed of the in-code pretraining")

    def __post_init__(self) -> None:
        if self.hidden < 1 or self.depth < 1 or self.pretrain_steps < 0:
            raise ValueError("head.hidden and head.depth must be >= 1 and head.pretrain_steps >= 0")


class ToyHead(Head):
    """Unconditional 2-D flow head. Items are prompt ids (ints) that only define groups."""

    prediction = "velocity"

    def __init__(self, config: ToyHeadConfig):
        super().__init__()
        self.config = config
        with torch.random.fork_rng(devices=[]):  # the same head whatever the run's seed
            torch.manual_seed(config.pretrain_seed)
            self.model = VelocityMLP(config.hidden, config.depth)
        if config.path:
            weights = os.path.join(config.path, "model.safetensors")
            if not os.path.isfile(weights):
                raise FileNotFoundError(f"head.path: {weights} not found; point head.path at a toy head's final/ folder")
            self.model.load_state_dict(load_file(weights))
        elif config.pretrain_steps:
            with torch.enable_grad():
                pretrain_flow_matching(self.model, config.pretrain_steps, config.pretrain_seed)
        self.reference = copy.deepcopy(self.model).requires_grad_(False)
        self.eval()

    def encode(self, batch: Sequence[Any]) -> Dict[str, Tensor]:
        return {"item": torch.as_tensor([int(i) for i in batch], dtype=torch.long)}

    def init_noise(self, cond, generators):
        return torch.stack([torch.randn(2, generator=g) for g in generators])

    def velocity(self, x, t, cond):
        return self.model(x, t)

    def reference_velocity(self, x, t, cond):
        with torch.no_grad():
            return self.reference(x, t)

    def save_pretrained(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, os.path.join(directory, "model.safetensors"))
        with open(os.path.join(directory, "config.json"), "w") as fh:
            json.dump({**asdict(self.config), "path": None, "pretrain_steps": 0}, fh, indent=2)

    @classmethod
    def from_pretrained(cls, directory: str) -> "ToyHead":
        with open(os.path.join(directory, "config.json")) as fh:
            cfg = ToyHeadConfig(**{**json.load(fh), "path": directory})
        return cls(cfg)


@HEADS.register("toy", ToyHeadConfig, help="2-D mixture-of-Gaussians flow head (tests, demo)")
def build_toy_head(config: ToyHeadConfig) -> ToyHead:
    return ToyHead(config)


# --------------------------------------------------------------------------- rewards
@dataclass
class ToyModeConfig(RewardConfig):
    name: str = hfield("toy_mode", "reward name")
    sharpness: float = hfield(2.0, "slope of the logistic reward sigmoid(sharpness * x[0])")


class ToyModeReward(Reward):
    """score = sigmoid(sharpness * x[:, 0]): favours the mode at (+2, 0)."""

    def score(self, outputs, batch):
        s = torch.sigmoid(self.config.sharpness * outputs[:, 0].float())
        return RewardOutput(s, torch.ones_like(s, dtype=torch.bool))


@dataclass
class ToyModeFractionConfig(RewardConfig):
    name: str = hfield("toy_mode_fraction", "reward name")


class ToyModeFraction(Reward):
    """1 if the sample is nearer the favoured mode (+2, 0) than the other, else 0."""

    def score(self, outputs, batch):
        s = (outputs[:, 0] > 0).float()
        return RewardOutput(s, torch.ones_like(s, dtype=torch.bool))


REWARDS.register("toy_mode", ToyModeConfig, help="smooth toy reward for the favoured mode")(ToyModeReward)
REWARDS.register("toy_mode_fraction", ToyModeFractionConfig, help="share of samples in the favoured mode")(ToyModeFraction)


@dataclass
class BrightnessConfig(RewardConfig):
    name: str = hfield("brightness", "reward name")
    target: float = hfield(1.0, "target mean intensity in [0, 1]")


class Brightness(Reward):
    """Image reward for tests: -|mean pixel intensity - target| on [B, 3, H, W] in [0, 1]."""

    def score(self, outputs, batch):
        s = -(outputs.float().mean(dim=(1, 2, 3)) - self.config.target).abs()
        return RewardOutput(s, torch.ones_like(s, dtype=torch.bool))


REWARDS.register("brightness", BrightnessConfig, help="test image reward: closeness of mean intensity to a target")(Brightness)


# --------------------------------------------------------------------------- data
@dataclass
class ToyPromptsConfig:
    name: str = hfield("toy_prompts", "data source name")
    num_train: int = hfield(64, "training prompt ids 0..num_train-1")
    num_eval: int = hfield(16, "held-out prompt ids after the training ones")

    def __post_init__(self) -> None:
        if self.num_train < 1 or self.num_eval < 1:
            raise ValueError("data.num_train and data.num_eval must be >= 1")


class ToyPrompts(ItemSource):
    def __init__(self, config: ToyPromptsConfig):
        self.config = config

    def train_items(self):
        return list(range(self.config.num_train))

    def eval_items(self):
        return list(range(self.config.num_train, self.config.num_train + self.config.num_eval))


DATASETS.register("toy_prompts", ToyPromptsConfig, help="integer prompt ids for the toy head")(ToyPrompts)


@dataclass
class ToyMixtureDataConfig:
    name: str = hfield("toy_mixture", "data source name")
    size: int = hfield(4096, "number of stored samples")
    seed: int = hfield(7, "seed of the stored samples")
    favoured_weight: float = hfield(1.0, "quality column of samples from the favoured mode (+2, 0)")
    other_weight: float = hfield(0.2, "quality column of samples from the other mode")
    num_eval: int = hfield(16, "evaluation items")


class ToyMixtureData(OfflineDataset):
    """Stored toy samples with a per-sample ``quality`` column (for weighted regression)."""

    def __init__(self, config: ToyMixtureDataConfig):
        self.config = config
        self.x, mode = sample_mixture(config.size, torch.Generator().manual_seed(config.seed))
        self.quality = torch.where(mode == 1, config.favoured_weight, config.other_weight).float()

    def __len__(self):
        return self.config.size

    def get(self, indices):
        return [0] * len(indices), self.x[indices], {"quality": self.quality[indices]}

    def eval_items(self):
        return list(range(self.config.num_eval))


DATASETS.register("toy_mixture", ToyMixtureDataConfig, help="stored toy samples with a quality column")(ToyMixtureData)


# --------------------------------------------------------------------------- analytic fields
def gaussian_velocity(m: float, s: float):
    """Exact flow-matching velocity for 1-D data N(m, s^2): E[eps - x0 | x_t = x]."""

    def v(x: Tensor, t: Tensor, cond=None) -> Tensor:
        t = t.view(-1, *([1] * (x.ndim - 1))).to(x.dtype)
        var = (1 - t) ** 2 * s**2 + t**2
        mean = (1 - t) * m
        # E[eps | x] = t (x - mean) / var ; E[x0 | x] = m + (1 - t) s^2 (x - mean) / var
        return t * (x - mean) / var - (m + (1 - t) * s**2 * (x - mean) / var)

    return v


# --------------------------------------------------------------------------- closed loop
@dataclass
class ToyReachConfig:
    name: str = hfield("toy_reach", "environment name")
    target: float = hfield(1.0, "x position of the goal")
    num_env_steps: int = hfield(3, "outer environment steps per episode (each wraps a whole chain)")


class ToyReachEnv:
    """A 2-D point moved by each chain's final state (the action); reward = -distance."""

    def __init__(self, config: ToyReachConfig):
        self.config = config

    def reset(self, batch, seeds):
        return torch.zeros(len(batch), 2)

    def observe(self, state):
        return [0] * state.shape[0]

    def step(self, state, action):
        state = state + 0.1 * action
        goal = torch.tensor([self.config.target, 0.0])
        reward = -(state - goal).norm(dim=1)
        return state, reward, torch.zeros(state.shape[0], dtype=torch.bool)


ENVIRONMENTS.register("toy_reach", ToyReachConfig, help="2-D point reaching (closed-loop tests)")(ToyReachEnv)


def assert_close(a, b, atol: float = 1e-6) -> None:
    """Assert two tensors/numbers are equal in shape and within ``atol`` (float64 compare)."""
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=atol, rtol=0), f"\n got {a}\nwant {b}"


def mode_fraction(x: Tensor) -> float:
    return float((x[:, 0] > 0).float().mean())


__all__ = ["ToyHead", "ToyHeadConfig", "VelocityMLP", "sample_mixture", "gaussian_velocity", "mode_fraction",
           "ToyReachEnv", "assert_close"]
