"""Offline adaptation of a pretrained robot action-chunk head to a mixed-quality dataset:
every method on one MetaWorld task mix, one comparison table.

Each method is its config in configs/robot/ (metaworld_<method>.yaml) trained with the one
flowrl Trainer: the pretrained flow-matching head (planners/robot/pretrained/velocity) is
fine-tuned on the target mix with that method's per-window weights, then evaluated closed
loop on fixed MetaWorld layouts (success rate, dense return).

  python examples/robot_offline_adaptation.py                                  # push-v3, adversarial
  python examples/robot_offline_adaptation.py --task door-open-v3 --mix mostly_clean --seed 1
  python examples/robot_offline_adaptation.py --steps 20 --num-eval 2          # smoke test size
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

METHODS = ("uniform", "filtered", "awr", "ptr", "oracle", "clean_only")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", default="push-v3", help="push-v3, pick-place-v3 or door-open-v3")
    p.add_argument("--mix", default="adversarial", help="adversarial, mostly_clean or embodiment_heavy")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps per method")
    p.add_argument("--num-eval", type=int, default=25, help="evaluation episodes")
    p.add_argument("--episodes", type=int, default=60, help="target episodes in the mix")
    p.add_argument("--max-steps", type=int, default=150, help="episode length (data and evaluation)")
    p.add_argument("--cache-dir", default="outputs/robot_data")
    p.add_argument("--out", default="outputs/robot_offline_adaptation")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value overrides for every run")
    a = p.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    from planners.robot.runner import format_table, row, run

    rows = []
    for m in a.methods.split(","):
        out = os.path.join(a.out, m)
        overrides = [f"seed={a.seed}", f"data.task={a.task}", f"data.mix={'clean' if m == 'clean_only' else a.mix}",
                     f"data.episodes={a.episodes}", f"data.max_steps={a.max_steps}", f"env.max_steps={a.max_steps}",
                     f"data.cache_dir={a.cache_dir}", f"output_dir={out}", "overwrite=true",
                     f"max_steps={a.steps}", f"data.num_eval={a.num_eval}", f"eval.num_items={a.num_eval}", *a.set]
        res = run(f"configs/robot/metaworld_{m}.yaml", overrides, reuse_before=True)
        rows.append(row(res, method=m))
    cols = ["method", "before_success", "after_success", "after_return", "auroc_clean_vs_corrupted", "auroc_episodes",
            "ess", "mass_clean", "share_clean", "time_s"]
    table = format_table(rows, cols)
    print(f"\n{a.task} / {a.mix} / seed {a.seed} ({a.num_eval} evaluation episodes, {a.steps} steps)\n{table}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "comparison.json"), "w") as fh:
        json.dump({"args": vars(a), "rows": rows}, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
