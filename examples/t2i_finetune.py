"""Recipe: post-train any diffusers text-to-image pipeline with rewards and save its LoRA.

    python examples/t2i_finetune.py --pipeline stabilityai/stable-diffusion-3.5-medium --family sd3 \
        --prompts train.txt --eval-prompts eval.txt --reward pickscore=1.0 --algorithm flow_grpo \
        --steps 300 --output-dir outputs/my_lora [--set head.dtype=bfloat16 rewards.0.device=cuda ...]

The LoRA lands in OUTPUT_DIR/final; plain diffusers loads it with
``pipe.load_lora_weights(OUTPUT_DIR + "/final")``.
"""
import argparse

import torch

import flowrl.builtins  # noqa: F401  (registers heads, algorithms, rewards, prompt sources)
from flowrl.config import load_config
from flowrl.trainer import Trainer

SAMPLER = {"fdfo": "{name: churn, gamma: 0.0025}", "flow_grpo": "{name: flow_sde, eta: 0.7}",
           "dance_grpo": "{name: dance_sde, eta: 0.3}"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pipeline", required=True, help="hub id or local folder of a diffusers pipeline")
    p.add_argument("--family", default="sd3", choices=["sd3", "flux", "sd"])
    p.add_argument("--prompts", required=True, help=".txt or .jsonl training prompts")
    p.add_argument("--eval-prompts", required=True, help=".txt or .jsonl held-out prompts")
    p.add_argument("--reward", action="append", required=True, help="NAME=WEIGHT, repeatable")
    p.add_argument("--algorithm", default="flow_grpo", choices=sorted(SAMPLER))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--output-dir", default="outputs/t2i_finetune")
    p.add_argument("--set", nargs="*", default=[], help="extra dotted overrides, e.g. head.resolution=512")
    args = p.parse_args()
    torch.set_num_threads(1)

    rewards = ", ".join(f"{{name: {r.split('=')[0]}, weight: {r.split('=')[1] if '=' in r else 1.0}}}" for r in args.reward)
    sampler = "{name: ddim, eta: 1.0}" if args.family == "sd" else SAMPLER[args.algorithm]
    config = load_config(None, [
        "seed=0", f"output_dir={args.output_dir}", f"max_steps={args.steps}", "resume=false", "overwrite=true",
        f"head={{name: t2i, family: {args.family}, path: '{args.pipeline}'}}",
        f"algorithm={{name: {args.algorithm}}}", f"sampler={sampler}", f"rewards=[{rewards}]",
        f"data={{name: prompts, train: '{args.prompts}', eval: '{args.eval_prompts}'}}",
        *args.set,
    ])
    report = Trainer(config).train()
    print(f"before: {report['before']}\nafter:  {report['after']}\nLoRA: {args.output_dir}/final")


if __name__ == "__main__":
    main()
