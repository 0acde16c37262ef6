"""Recipe: post-train the 2-D toy head with Flow-GRPO from Python (no YAML).

    python examples/toy_quickstart.py [--steps 40] [--output-dir outputs/quickstart]

Builds the same dataclasses a YAML config serialises, runs the one Trainer, and prints
the share of samples in the favoured mode before and after training.
"""
import argparse

import torch

import flowrl.builtins  # noqa: F401  (registers the toy head, rewards and data)
from flowrl.algorithms.grpo import GRPOConfig
from flowrl.config import EvalConfig, OptimConfig, TrainConfig, TrainerConfig
from flowrl.mdp import ChainConfig
from flowrl.samplers import SamplerConfig
from flowrl.testing import ToyHeadConfig, ToyModeConfig, ToyModeFractionConfig, ToyPromptsConfig
from flowrl.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--output-dir", default="outputs/quickstart")
    args = parser.parse_args()
    torch.set_num_threads(1)

    config = TrainConfig(
        seed=0,
        output_dir=args.output_dir,
        max_steps=args.steps,
        overwrite=True,
        head=ToyHeadConfig(),
        sampler=SamplerConfig(name="flow_sde", eta=0.7),
        chain=ChainConfig(num_steps=10),
        algorithm=GRPOConfig(group_size=8, clip_range=0.2, kl_beta=0.0, ratio_per_dim=False),
        rewards=[ToyModeConfig()],
        data=ToyPromptsConfig(),
        eval=EvalConfig(num_items=16, samples_per_item=16, metrics=[ToyModeFractionConfig()]),
        optim=OptimConfig(lr=1e-3),
        train=TrainerConfig(prompts_per_step=8, progress=False),
    )
    report = Trainer(config).train()
    print(f"mode fraction: {report['before']['toy_mode_fraction']:.3f} -> {report['after']['toy_mode_fraction']:.3f}")


if __name__ == "__main__":
    main()
