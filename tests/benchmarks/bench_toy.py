"""Benchmark: every toy config x 3 training seeds, held-out evaluation seeds.

Prints before/after of the toy metric (mean +- std over seeds) and wall-clock seconds
per run. Not part of `make test`; run with `make bench-toy`.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ["fdfo", "flow_grpo", "dance_grpo", "vg_grpo", "offline_weighted", "closed_loop"]
SEEDS = [0, 1, 2]


def run(config: str, seed: int, out: Path) -> tuple[dict, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FLOWRL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "flowrl", "train", f"configs/toy/{config}.yaml", f"seed={seed}",
                          f"output_dir={out}", "train.progress=false", "train.tensorboard=false"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{config} seed {seed} failed:\n{res.stderr[-2000:]}")
    return json.loads((out / "report.json").read_text()), wall


def stat(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} +- {statistics.pstdev(xs):.3f}"


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="outputs/bench_toy.json")
    args = ap.parse_args()
    results = {}
    print(f"{'config':<18} {'metric':<18} {'before':>16} {'after':>16} {'seconds':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for config in CONFIGS:
            befores, afters, walls = [], [], []
            metric = None
            for seed in SEEDS:
                report, wall = run(config, seed, Path(tmp) / f"{config}-{seed}")
                metric = metric or ("toy_mode_fraction" if "toy_mode_fraction" in report["after"] else "return")
                befores.append(report["before"][metric])
                afters.append(report["after"][metric])
                walls.append(wall)
            print(f"{config:<18} {metric:<18} {stat(befores):>16} {stat(afters):>16} {stat(walls):>14}", flush=True)
            results[config] = {"metric": metric, "seeds": SEEDS, "before": befores, "after": afters, "seconds": walls}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
