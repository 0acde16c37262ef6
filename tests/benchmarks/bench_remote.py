"""Overhead of the remote reward path vs in-process scoring on loopback (not collected by pytest).

    HF_HUB_OFFLINE=1 .venv/bin/python tests/benchmarks/bench_remote.py [--out bench_remote.json]

For each reward (JPEG compressibility, and the tiny random Qwen2.5-VL yes/no judge of the
contract fixtures standing in for a model) and each image format (png, raw), scores a batch
of 32 images of 64 x 64 in-process and through a `rewards serve` subprocess on 127.0.0.1,
one torch thread on both sides, and reports the median wall time of each and their ratio
(goal: remote <= 1.2 x in-process). The fixed cost per request (encode, HTTP, decode) does
not grow with the model, so the ratio shrinks as the reward gets heavier.
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

torch.set_num_threads(1)

from rewards.base import build_reward  # noqa: E402
from rewards.remote import RemoteRewardConfig  # noqa: E402
from tests.contracts.reward_fixtures import images, prompt_batch, save_tiny_qwen2_5_vl  # noqa: E402
from tests.integration.test_remote_reward import TOKEN, launch, stop  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_remote_") as d:
        return run(args, Path(d))


def run(args: argparse.Namespace, tmp: Path) -> int:
    """Build the tiny VLM under ``tmp``, serve both rewards, time both paths, print and write JSON."""
    vlm = save_tiny_qwen2_5_vl(tmp / "qwen2_5_vl")
    configs = {"jpeg_compressibility": {"name": "jpeg_compressibility"},
               "vlm_yes_no": {"name": "vlm_yes_no", "path": str(vlm), "batch_size": args.batch}}
    cfg = tmp / "serve.yaml"
    cfg.write_text(json.dumps({"rewards": list(configs.values())}))  # JSON is YAML
    os.environ["FLOWRL_REWARD_TOKEN"] = TOKEN
    proc, url = launch(cfg, env={"OMP_NUM_THREADS": "1"}, timeout=120)
    x = images(args.batch, size=args.size)
    batch = (prompt_batch(6) * (args.batch // 6 + 1))[:args.batch]
    rows = []
    try:
        for name, fields in configs.items():
            local = build_reward(build_config(fields))
            t_local = median_seconds(lambda: local(x, batch), args.repeats)
            for fmt in ("png", "raw"):
                remote = build_reward(RemoteRewardConfig(url=url, reward=name, image_format=fmt, retries=0))
                out = remote(x, batch)
                assert bool(out.valid.all()), out.info
                assert torch.allclose(out.score, local(x, batch).score, atol=1e-4)
                t_remote = median_seconds(lambda: remote(x, batch), args.repeats)
                rows.append({"reward": name, "format": fmt, "batch": args.batch, "size": args.size,
                             "in_process_ms": 1e3 * t_local, "remote_ms": 1e3 * t_remote,
                             "overhead_ms": 1e3 * (t_remote - t_local), "ratio": t_remote / t_local,
                             "images_per_s_remote": args.batch / t_remote})
    finally:
        stop(proc)
    print(f"{'reward':<22} {'format':<6} {'in-process ms':>14} {'remote ms':>10} {'overhead ms':>12} {'ratio':>6}")
    for r in rows:
        print(f"{r['reward']:<22} {r['format']:<6} {r['in_process_ms']:>14.1f} {r['remote_ms']:>10.1f} "
              f"{r['overhead_ms']:>12.1f} {r['ratio']:>6.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"goal_ratio": 1.2, "results": rows}, indent=2))
        print(f"wrote {args.out}")
    return 0


def build_config(fields):
    from flowrl.configlib import build_section
    from rewards.base import REWARDS

    return build_section(REWARDS, fields, "reward")


if __name__ == "__main__":
    sys.exit(main())
