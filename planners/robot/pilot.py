"""Pilot: pretrain the action-chunk head on clean source-task data, adapt it on one target
mix with uniform / PTR / oracle weights, evaluate success on fixed seeds.

  python -m planners.robot.pilot --task push-v3 --mix adversarial --seed 0

Single-threaded (torch.set_num_threads(1)); data is generated once and cached under
--cache. Writes a JSON report to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Dict, Optional

import numpy as np
import torch

from flowrl.algorithms.ptr import clip_bounds, ptr_weights, weighted_regression
from planners.robot.data import EVAL_SEED0, RobotDataset, cached_episodes, pretrain_spec, target_spec
from planners.robot.envs import evaluate_policy, task_id
from planners.robot.head import RobotHead, RobotHeadConfig
from planners.robot.scorer import PTRScorer, ScorerConfig, diagnostics


def train(head: RobotHead, ds: RobotDataset, steps: int, lr: float, seed: int, weights: Optional[torch.Tensor] = None,
          batch: int = 256) -> float:
    """Self-normalised weighted denoising regression on ds (weights None = uniform)."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(head.trainable_parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    head.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        idx = torch.randint(0, len(ds), (batch,), generator=g)
        items, x0, _ = ds.get(idx)
        cond = head.encode(items)
        gens = [torch.Generator().manual_seed(seed * 1_000_003 + step * batch + i) for i in range(batch)]
        per = head.per_sample_loss(x0, cond, gens)
        w = torch.ones(batch) if weights is None else weights[idx]
        loss = weighted_regression(per, w)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.trainable_parameters(), 1.0)
        opt.step()
        sched.step()
    head.eval()
    return float(loss.detach())


def evaluate(head: RobotHead, task: str, n: int, seed: int = 0, num_steps: int = 10, max_steps: int = 150) -> Dict[str, float]:
    tid = task_id(task)
    seeds = [EVAL_SEED0 + i for i in range(n)]

    def act(hists, alive):
        items = [{"obs": torch.from_numpy(h[-head.config.n_obs:]).float(), "task": tid} for h in hists]
        cond = head.encode(items)
        gens = [torch.Generator().manual_seed(seed * 7919 + a * 131 + len(h)) for a, h in zip(alive, hists)]
        return [a.numpy() for a in head.sample(cond, gens, num_steps)]

    return evaluate_policy(task, act, seeds, max_steps, head.config.exec_steps)


def main(argv=None) -> Dict:
    p = argparse.ArgumentParser()
    p.add_argument("--task", default="push-v3")
    p.add_argument("--mix", default="adversarial")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prediction", default="velocity")
    p.add_argument("--pretrain-steps", type=int, default=3000)
    p.add_argument("--adapt-steps", type=int, default=2000)
    p.add_argument("--episodes", type=int, default=60)
    p.add_argument("--eval", type=int, default=30)
    p.add_argument("--scorer-steps", type=int, default=1000)
    p.add_argument("--ratio", type=float, default=4.0, help="calibrated r spans this factor between its q10 and q90")
    p.add_argument("--methods", default="uniform,ptr,ptr_full,oracle")
    p.add_argument("--cache", default="outputs/robot_data")
    p.add_argument("--out", default="outputs/robot_pilot")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    report: Dict = {"args": vars(a)}
    t0 = time.perf_counter()
    peps, pmeta = cached_episodes(pretrain_spec(30), a.cache)
    teps, tmeta = cached_episodes(target_spec(a.task, a.mix, a.episodes), a.cache)
    report["data"] = {"pretrain_gen_s_per_episode": pmeta["gen_s_per_episode"], "target_per_source": tmeta["per_source"],
                      "target_gen_s_per_episode": tmeta["gen_s_per_episode"], "load_s": time.perf_counter() - t0}
    pds = RobotDataset(peps)
    stats = pds.stats()
    tds = RobotDataset(teps, action_stats=(stats["action_mean"], stats["action_std"]))
    os.makedirs(a.out, exist_ok=True)
    ckpt = os.path.join(a.cache, f"pretrained_{a.prediction}_s{a.seed}_{a.pretrain_steps}")
    t1 = time.perf_counter()
    if os.path.isfile(os.path.join(ckpt, "model.safetensors")):
        base = RobotHead.from_pretrained(ckpt)
    else:
        base = RobotHead(RobotHeadConfig(prediction=a.prediction, seed=a.seed), stats=stats)
        train(base, pds, a.pretrain_steps, 1e-3, a.seed)
        base.reset_reference()
        base.save_pretrained(ckpt)
    report["pretrain_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    report["before"] = {k: v for k, v in evaluate(base, a.task, a.eval, a.seed).items() if k != "per_seed"}
    report["eval_s"] = time.perf_counter() - t2

    weights: Dict[str, Optional[torch.Tensor]] = {"uniform": None, "oracle": tds.columns["oracle"].clone()}
    methods = a.methods.split(",")
    if any(m.startswith("ptr") for m in methods):
        for name, ablate in (("ptr", True), ("ptr_full", False)):
            if name not in methods:
                continue
            t3 = time.perf_counter()
            sc = PTRScorer(ScorerConfig(steps=a.scorer_steps, ablate=ablate, seed=a.seed, ratio=a.ratio))
            fit = sc.fit(pds)  # trusted data: the clean pretraining set (see scorer.py)
            s = sc.score(tds)
            lo, hi = clip_bounds(s["r"], 0.1, 0.9)
            w = ptr_weights(s["r"], 1.0, lo, hi)
            weights[name] = w
            report[f"{name}_diagnostics"] = {**fit, **diagnostics(w, tds.columns["source"], s), "w_min": lo, "w_max": hi,
                                             "score_s": time.perf_counter() - t3}
    report["oracle_diagnostics"] = diagnostics(weights["oracle"] + 1e-9, tds.columns["source"])
    for m in methods:
        t4 = time.perf_counter()
        head = RobotHead.from_pretrained(ckpt)
        train(head, tds, a.adapt_steps, 3e-4, a.seed + 1, weights[m])
        res = evaluate(head, a.task, a.eval, a.seed)
        report[m] = {"success": res["success"], "return": res["return"], "adapt_eval_s": time.perf_counter() - t4}
        print(m, report[m], flush=True)
    path = os.path.join(a.out, f"{a.task}_{a.mix}_{a.prediction}_s{a.seed}_r{a.ratio:g}_{'-'.join(methods)}.json")
    with open(path, "w") as fh:
        json.dump(report, fh, indent=1)
    print(json.dumps({k: v for k, v in report.items() if not k.endswith("diagnostics")}, indent=1))
    return report


if __name__ == "__main__":
    main()
