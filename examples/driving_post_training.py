"""Recipe: closed-loop VG-GRPO post-training of the pretrained driving planner (SCORP).

    python examples/driving_post_training.py [--steps 60] [--output-dir outputs/driving_example]
    python examples/driving_post_training.py --steps 1 --tiny        # a smoke run (seconds)

Builds the dataclasses that ``configs/driving/vg_grpo.yaml`` serialises, runs the one
Trainer from the committed pretrained planner (``planners/driving/pretrained``), and
prints the held-out closed-loop metrics before and after: collision / off-road rates,
average speed, progress and ADE to the expert. GIFs of held-out scenes land in
``OUTPUT_DIR/rollouts``.
"""
import argparse

import torch

import flowrl.builtins  # noqa: F401  (registers the driving head, environment and scene source)
from flowrl.algorithms.vggrpo import VGGRPOConfig
from flowrl.config import EvalConfig, OptimConfig, TrainConfig, TrainerConfig
from flowrl.mdp import ChainConfig
from flowrl.samplers import SamplerConfig
from flowrl.trainer import Trainer
from planners.driving import DrivingEnvConfig, DrivingHeadConfig, DrivingScenesConfig

METRICS = ("collision_rate", "offroad_rate", "avg_speed", "progress", "ttc_unsafe_frac", "ade")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--output-dir", default="outputs/driving_example")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny budget (2 scenes, 2 replans, 4 candidates)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    g = 4 if args.tiny else 8
    config = TrainConfig(
        seed=args.seed,
        output_dir=args.output_dir,
        max_steps=args.steps,
        overwrite=True,
        head=DrivingHeadConfig(path="planners/driving/pretrained"),
        sampler=SamplerConfig(name="cps", eta=0.8),  # CPS's last step is deterministic: train the window before it
        chain=ChainConfig(num_steps=3, train_window_size=2, train_fraction=1.0) if args.tiny
        else ChainConfig(num_steps=5, train_window_size=4, train_fraction=0.75),
        algorithm=VGGRPOConfig(group_size=g, std1=1.0, std2=2.0, num_minibatches=1 if args.tiny else 2),
        data=DrivingScenesConfig(num_eval=4 if args.tiny else 256),
        env=DrivingEnvConfig(episode_steps=10 if args.tiny else 40, execute_steps=5, candidates_per_state=g,
                             score_steps=10 if args.tiny else 20, progress_clip=1.0, collision_reward="at_fault",
                             render_scenes=1 if args.tiny else 3),
        eval=EvalConfig(num_items=4 if args.tiny else 256, samples_per_item=1),
        optim=OptimConfig(lr=1e-4, weight_decay=0.0),
        train=TrainerConfig(prompts_per_step=2 if args.tiny else 16, progress=False, tensorboard=False,
                            curves=not args.tiny),
    )
    report = Trainer(config).train()
    for k in METRICS:
        print(f"{k:<16} {report['before'][k]:8.3f} -> {report['after'][k]:8.3f}")


if __name__ == "__main__":
    main()
