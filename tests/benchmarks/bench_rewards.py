"""Benchmark: reward throughput (images/s) on CPU for each tiny reward model.

Every image reward with a contract fixture (tests/contracts/reward_fixtures.py: tiny
random models with the real architectures, loaded through the real loaders) scores a
batch of 32 images of 64 x 64 pixels; the table reports the median over repeats. The
numbers measure the reward plumbing (preprocessing, tokenisation, failure isolation), not
the throughput of the full-size models. Not part of `make test`; run with
`make bench-rewards` or `python tests/benchmarks/bench_rewards.py [--out PATH] [--threads N]`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
import rewards  # noqa: E402,F401
from rewards.base import build_reward  # noqa: E402
from tests.contracts.reward_fixtures import PROMPTS, fixtures, images  # noqa: E402


def bench_one(reward, outputs, batch, repeats: int) -> dict:
    """Median seconds per call (after one warm-up call) and images/s."""
    first = reward(outputs, batch)
    if not bool(first.valid.all()):
        raise SystemExit(f"{reward.name}: benchmark batch not scorable: {first.info}")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        reward(outputs, batch)
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    return {"batch": len(batch), "seconds_per_call": sec, "images_per_s": len(batch) / sec}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/bench_rewards.json", help="where to write the JSON results")
    parser.add_argument("--batch", type=int, default=32, help="images per call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per reward (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = images(args.batch, 64, seed=1)
    batch = [PROMPTS[i % len(PROMPTS)] for i in range(args.batch)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case_id, make in sorted(fixtures().items()):
            case = make(Path(tmp) / case_id)
            if not (isinstance(case.outputs, torch.Tensor) and case.outputs.dim() == 4):
                continue  # not an image reward (toy rewards)
            t0 = time.perf_counter()
            reward = build_reward(case.config)
            load_s = time.perf_counter() - t0
            results[case_id] = {**bench_one(reward, x, batch, args.repeats), "load_s": load_s}
    print(f"\nreward throughput on CPU ({args.threads} thread(s)), batch {args.batch}, 64 x 64 images, tiny models")
    print(f"{'reward':<24} {'images/s':>10} {'ms/call':>10} {'load s':>8}")
    for name, r in results.items():
        print(f"{name:<24} {r['images_per_s']:>10.1f} {1000 * r['seconds_per_call']:>10.1f} {r['load_s']:>8.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": "cpu", "threads": args.threads, "batch": args.batch, "image_size": 64,
            "torch": torch.__version__, "repeats": args.repeats}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
