"""Benchmark: driving simulator throughput (agent-steps/s) and the expert's closed-loop metrics.

An agent-step is one vehicle (controlled or background, present in its scene) advanced by
one 0.1 s tick, including background IDM/MOBIL/gap acceptance and the collision,
off-road and TTC checks of the controlled vehicles. Not collected by pytest (the file
name does not start with test_). Run:

    python tests/benchmarks/bench_driving_sim.py --threads 2 --scenes 256 --out outputs/bench_driving_sim.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planners.driving.expert import run_expert  # noqa: E402
from planners.driving.metrics import episode_metrics  # noqa: E402
from planners.driving.scenes import SCENE_KINDS, Scene, make_scenes  # noqa: E402
from planners.driving.sim import DrivingEnv, stack_records  # noqa: E402


def throughput(env: DrivingEnv, scenes: Scene, ticks: int) -> dict:
    state = env.reset_scene(scenes)
    seg = env.segments(state.scene)
    g = torch.Generator().manual_seed(0)
    controls = (torch.randn(len(scenes), state.num_slots, 2, generator=g) * torch.tensor([0.5, 0.02])).to(env.device)
    for _ in range(3):  # warm-up
        state, _ = env.tick(state, controls, seg)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    done, t0 = 0, time.perf_counter()
    for _ in range(ticks):
        done += int(state.alive.sum())
        state, _ = env.tick(state, controls, seg)
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"scenes": len(scenes), "ticks": ticks, "agent_steps": done, "seconds": wall,
            "agent_steps_per_s": done / wall, "ticks_per_s": ticks / wall}


def expert_metrics(env: DrivingEnv, per_kind: int, steps: int) -> dict:
    out = {}
    for i, kind in enumerate(SCENE_KINDS):
        sc = make_scenes(range(10_000 + 1000 * i, 10_000 + 1000 * i + per_kind), env.config.scene, kind=kind)
        state = env.reset_scene(sc)
        s0 = state.s[:, : state.num_slots].clone()
        final, rec = run_expert(env, state, steps, seed=i)
        out[kind] = episode_metrics(stack_records(rec["records"], final, env.config, s0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scenes", type=int, default=256)
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--expert-scenes", type=int, default=64, help="scenes per kind for the expert metrics (0 = skip)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    env = DrivingEnv(device=args.device)
    base = make_scenes(range(64))
    reps = -(-args.scenes // 64)
    scenes = Scene.stack([base] * reps)[: args.scenes]
    res = {"device": args.device, "threads": args.threads, "throughput": throughput(env, scenes, args.ticks)}
    tp = res["throughput"]
    print(f"{args.device} threads={args.threads} scenes={tp['scenes']}: {tp['agent_steps_per_s']:,.0f} agent-steps/s "
          f"({tp['ticks_per_s']:.1f} ticks/s)")
    if args.expert_scenes:
        res["expert"] = expert_metrics(env, args.expert_scenes, 80)
        for kind, m in res["expert"].items():
            print(f"expert {kind:<13} " + " ".join(f"{k}={v:.3f}" for k, v in m.items()))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=2)


if __name__ == "__main__":
    main()
