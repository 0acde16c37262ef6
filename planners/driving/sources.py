"""Data sources of the driving planner (registered in ``planners/driving/__init__.py``).

* ``driving_scenes`` (online, closed loop): items are scene SEEDS; ``DrivingEnv.reset``
  generates the scene of each seed. Training seeds and held-out evaluation seeds are
  disjoint ranges (checked).
* ``driving_demos`` (offline pretraining): expert demonstrations recorded once and cached
  (``data.build_demos``), served as (observation ``Scene``, normalised expert control
  chunk [B, A, H, 2], columns). Its evaluation items are the same held-out scene seeds as
  ``driving_scenes``, so pretraining and post-training report on the same scenes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from flowrl._fields import hfield
from flowrl.data import ItemSource, OfflineDataset
from planners.driving.data import DemoConfig, DemoDataset, build_demos
from planners.driving.head import normalised_demo_controls, resolve_path

EVAL_FIRST_SEED = 100_000


def _check_disjoint(train: range, eval_: range, what: str) -> None:
    if train.start < eval_.stop and eval_.start < train.stop:
        raise ValueError(f"data: {what} seeds {train.start}..{train.stop - 1} overlap the held-out evaluation seeds "
                         f"{eval_.start}..{eval_.stop - 1}; move data.eval_first_seed")


@dataclass
class DrivingScenesConfig:
    """Scene seeds for closed-loop training and held-out evaluation."""

    name: str = hfield("driving_scenes", "data source name")
    first_seed: int = hfield(1000, "first training scene seed")
    num_train: int = hfield(1024, "training scene seeds first_seed .. first_seed + num_train - 1")
    eval_first_seed: int = hfield(EVAL_FIRST_SEED, "first held-out evaluation scene seed")
    num_eval: int = hfield(64, "held-out evaluation scenes")

    def __post_init__(self) -> None:
        if self.num_train < 1 or self.num_eval < 1:
            raise ValueError("data.num_train and data.num_eval must be >= 1")
        _check_disjoint(range(self.first_seed, self.first_seed + self.num_train),
                        range(self.eval_first_seed, self.eval_first_seed + self.num_eval), "training")


class DrivingScenes(ItemSource):
    def __init__(self, config: DrivingScenesConfig):
        self.config = config

    def train_items(self) -> List[int]:
        c = self.config
        return list(range(c.first_seed, c.first_seed + c.num_train))

    def eval_items(self) -> List[int]:
        c = self.config
        return list(range(c.eval_first_seed, c.eval_first_seed + c.num_eval))


@dataclass
class DrivingDemosConfig:
    """Expert demonstrations for offline pretraining (recorded on first use, then cached)."""

    name: str = hfield("driving_demos", "data source name")
    directory: str = hfield("outputs/cache/driving_demos", "cache folder (demos.safetensors + meta.json); re-recorded when "
                                                  "the demo config differs from the cached one")
    demos: DemoConfig = hfield(default_factory=lambda: DemoConfig(num_scenes=256), help="which scenes the expert drives")
    eval_first_seed: int = hfield(EVAL_FIRST_SEED, "first held-out evaluation scene seed (closed-loop evaluation)")
    num_eval: int = hfield(64, "held-out evaluation scenes")

    def __post_init__(self) -> None:
        if isinstance(self.demos, dict):
            self.demos = DemoConfig(**self.demos)
        d = self.demos
        _check_disjoint(range(d.first_seed, d.first_seed + d.num_scenes),
                        range(self.eval_first_seed, self.eval_first_seed + self.num_eval), "demonstration")


class DrivingDemos(OfflineDataset):
    def __init__(self, config: DrivingDemosConfig):
        self.config = config
        d = config.demos
        tensors, _ = build_demos(resolve_path(config.directory) if not config.directory.startswith("/") else config.directory, d)
        self.demos = DemoDataset(tensors, d.horizon, d.stride, eval_fraction=0.0)
        self.demos.train_scenes = list(range(tensors["controls"].shape[0]))  # every recorded scene trains
        starts = list(range(0, tensors["controls"].shape[2] - d.horizon + 1, d.stride))
        self.demos.windows = [(i, t) for i in self.demos.train_scenes for t in starts]

    def __len__(self) -> int:
        return len(self.demos)

    def get(self, indices: torch.Tensor):
        obs, controls, cols = self.demos.get(indices)
        return obs, normalised_demo_controls(controls), cols

    def eval_items(self) -> List[int]:
        c = self.config
        return list(range(c.eval_first_seed, c.eval_first_seed + c.num_eval))
