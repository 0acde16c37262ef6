"""Recipe: write your own reward, register it, and train with it from a YAML config.

    python examples/custom_reward.py [--steps 40] [--output-dir outputs/custom_reward]

A reward is a class with ``score(outputs, batch) -> RewardOutput(score, valid)``; mark
samples you cannot score as invalid instead of returning a sentinel value. Here the
reward prefers toy samples close to the point (2, 1).
"""
import argparse
from dataclasses import dataclass

import torch

import flowrl.builtins  # noqa: F401
from flowrl._fields import hfield
from flowrl.config import load_config
from flowrl.trainer import Trainer
from flowrl.types import RewardOutput
from rewards import REWARDS, Reward, RewardConfig


@dataclass
class TargetConfig(RewardConfig):
    name: str = hfield("near_point", "reward name")
    x: float = hfield(2.0, "target x")
    y: float = hfield(1.0, "target y")


@REWARDS.register("near_point", TargetConfig, help="negative distance to a target point")
class NearPoint(Reward):
    def score(self, outputs, batch):
        target = torch.tensor([self.config.x, self.config.y])
        dist = (outputs.float() - target).norm(dim=1)
        return RewardOutput(score=-dist, valid=torch.isfinite(dist))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--output-dir", default="outputs/custom_reward")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load_config("configs/toy/flow_grpo.yaml", [
        f"output_dir={args.output_dir}", f"max_steps={args.steps}", "overwrite=true", "train.progress=false",
        "rewards=[{name: near_point, x: 2.0, y: 1.0}]", "eval.metrics=[{name: toy_mode_fraction}]",
    ])
    report = Trainer(config).train()
    print(f"near_point: {report['before']['near_point']:.3f} -> {report['after']['near_point']:.3f}")


if __name__ == "__main__":
    main()
