"""Robot offline-adaptation benchmark: tasks x mixes x methods x seeds -> JSON + plot.

Every cell is one `flowrl train configs/robot/metaworld_<method>.yaml` run (in-process via
planners.robot.runner, one thread per job) with overrides data.task / data.mix / seed; seed s
also draws a fresh data set (data.salt = s) and a fresh scorer (data.weighting.seed = s).
Success rate and dense return are measured on the 25 fixed evaluation layouts.

  python tests/benchmarks/bench_robot.py --out outputs/bench_robot.json [--jobs 2]
  python tests/benchmarks/bench_robot.py --tasks push-v3 --mixes adversarial --methods uniform,ptr --seeds 0
  python tests/benchmarks/bench_robot.py --validate     # calibration choice on a validation split

--validate compares PTR variants on a VALIDATION split that the benchmark never evaluates on:
fresh data draws (data.salt = 1000 + s) and evaluation layouts from 200000 (the benchmark's
are 100000+).  Not collected by pytest (file name does not start with test_).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any, Dict, List, Sequence, Tuple

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

METHODS = ("uniform", "ptr", "oracle", "awr", "filtered", "clean_only")
TASKS = ("push-v3", "pick-place-v3", "door-open-v3")
MIXES = ("adversarial", "mostly_clean", "embodiment_heavy")

#: PTR variants compared by --validate (overrides of configs/robot/metaworld_ptr.yaml)
VARIANTS: Dict[str, Tuple[str, List[str]]] = {
    "uniform": ("uniform", []),
    "ptr_ess0.3": ("ptr", ["data.weighting.calibration=ess", "data.weighting.ess_target=0.3"]),
    "ptr_ess0.5": ("ptr", ["data.weighting.calibration=ess", "data.weighting.ess_target=0.5"]),
    "ptr_quantile50": ("ptr", ["data.weighting.calibration=quantile", "data.weighting.ratio=50"]),
    "ptr_rank50": ("ptr", ["data.weighting.calibration=rank", "data.weighting.ratio=50"]),
    "ptr_target_scorer": ("ptr", ["data.weighting.scorer_data=target", "data.weighting.ess_target=0.3"]),
    "ptr_ablated": ("ptr", ["data.weighting.ablate=true", "data.weighting.ess_target=0.3"]),
    "ptr_no_smoothing": ("ptr", ["data.weighting.smooth=none", "data.weighting.ess_target=0.3"]),
}


def _job(args: Tuple[str, List[str], Dict[str, Any]]) -> Dict[str, Any]:
    config, overrides, labels = args
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from planners.robot.runner import row, run

    try:
        res = run(config, overrides, reuse_before=True)
        return row(res, **labels)
    except Exception as e:  # a failed cell is reported, the grid goes on
        return {**labels, "error": f"{type(e).__name__}: {e}"}


def cells(tasks: Sequence[str], mixes: Sequence[str], methods: Sequence[str], seeds: Sequence[int], root: str,
          steps: int, num_eval: int, extra: Sequence[str]) -> List[Tuple[str, List[str], Dict[str, Any]]]:
    out = []
    for task in tasks:
        for mix in mixes:
            for seed in seeds:
                for m in methods:
                    cfg_name, ov = ("ptr", []) if m.startswith("ptr") and m not in VARIANTS else VARIANTS.get(m, (m, []))
                    d = os.path.join(root, f"{task}_{mix}_{m}_s{seed}")
                    o = [f"seed={seed}", f"data.task={task}", f"data.mix={mix}" if m != "clean_only" else "data.mix=clean",
                         f"data.salt={seed}", f"data.weighting.seed={seed}", f"output_dir={d}",
                         "overwrite=true", f"max_steps={steps}", f"data.num_eval={num_eval}", f"eval.num_items={num_eval}",
                         *ov, *extra]
                    out.append((f"configs/robot/metaworld_{cfg_name}.yaml", o,
                                {"task": task, "mix": mix, "method": m, "seed": seed}))
    return out


def aggregate(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    import numpy as np

    groups: Dict[Tuple[str, str, str], List[Dict[str, Any]]] = {}
    for r in rows:
        if "error" not in r:
            groups.setdefault((r["task"], r["mix"], r["method"]), []).append(r)
    cell = {}
    for (t, mx, m), rs in groups.items():
        s = np.array([r["after_success"] for r in rs])
        cell[f"{t}/{mx}/{m}"] = {"success_mean": float(s.mean()), "success_std": float(s.std(ddof=1)) if len(s) > 1 else 0.0,
                                 "success_per_seed": s.tolist(), "before_success": float(np.mean([r["before_success"] for r in rs])),
                                 "return_mean": float(np.mean([r["after_return"] for r in rs])), "n": len(rs),
                                 **{k: float(np.mean([r[k] for r in rs])) for k in ("auroc_clean_vs_corrupted", "auroc_episodes",
                                                                                   "ess", "mass_clean") if all(k in r for r in rs)}}
    per_mix: Dict[str, Dict[str, Any]] = {}
    for (t, mx, m), rs in groups.items():
        per_mix.setdefault(f"{mx}/{m}", []).extend(r["after_success"] for r in rs)
    overall = {k: {"success_mean": float(np.mean(v)), "n": len(v),
                   "success_sem": float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0} for k, v in per_mix.items()}
    # paired PTR - uniform difference over (task, seed)
    paired = {}
    for mx in {k[1] for k in groups}:
        diffs = []
        for r in rows:
            if r.get("method") == "ptr" and r["mix"] == mx and "error" not in r:
                u = [q for q in rows if q.get("method") == "uniform" and q["mix"] == mx and q["task"] == r["task"]
                     and q["seed"] == r["seed"] and "error" not in q]
                if u:
                    diffs.append(r["after_success"] - u[0]["after_success"])
        if diffs:
            paired[mx] = {"ptr_minus_uniform": float(np.mean(diffs)), "sem": float(np.std(diffs, ddof=1) / np.sqrt(len(diffs)))
                          if len(diffs) > 1 else 0.0, "n": len(diffs), "diffs": diffs}
    return {"cells": cell, "overall": overall, "paired": paired}


def plot(agg: Dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = sorted({k.rsplit("/", 1)[0] for k in agg["cells"]})
    methods = [m for m in METHODS + tuple(VARIANTS) if any(k.endswith("/" + m) for k in agg["cells"])]
    methods = list(dict.fromkeys(methods))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys)), 3.6))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        ys = [agg["cells"].get(f"{k}/{m}", {}).get("success_mean", np.nan) for k in keys]
        es = [agg["cells"].get(f"{k}/{m}", {}).get("success_std", 0.0) for k in keys]
        ax.bar(np.arange(len(keys)) + (i - (len(methods) - 1) / 2) * width, ys, width, yerr=es, label=m, capsize=2)
    ax.set_xticks(np.arange(len(keys)), [k.replace("/", "\n") for k in keys], fontsize=8)
    ax.set_ylabel("success rate (after)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> Dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--mixes", default=",".join(MIXES))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps per run (configs: 2000)")
    p.add_argument("--num-eval", type=int, default=25)
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (one thread each)")
    p.add_argument("--validate", action="store_true", help="compare PTR calibration variants on the validation split")
    p.add_argument("--root", default="outputs/bench_robot")
    p.add_argument("--out", default="outputs/bench_robot.json")
    a = p.parse_args(argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    seeds = [int(s) for s in split(a.seeds)]
    extra: List[str] = []
    methods = split(a.methods)
    if a.validate:
        if a.methods == ",".join(METHODS):
            methods = list(VARIANTS)
        extra = ["data.eval_seed0=200000"]
    jobs = cells(split(a.tasks), split(a.mixes), methods, seeds, a.root, a.steps, a.num_eval, extra)
    if a.validate:  # fresh data draws, disjoint from the benchmark's salts 0, 1, 2
        jobs = [(c, [o if not o.startswith("data.salt=") else f"data.salt={1000 + lab['seed']}" for o in ov], lab)
                for c, ov, lab in jobs]
    t0 = time.perf_counter()
    rows: List[Dict[str, Any]] = []
    print(f"[bench_robot] {len(jobs)} runs, {a.jobs} at a time", flush=True)
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs, mp_context=get_context("spawn")) as ex:
            for r in ex.map(_job, jobs):
                rows.append(r)
                print(json.dumps(r), flush=True)
    else:
        for j in jobs:
            rows.append(_job(j))
            print(json.dumps(rows[-1]), flush=True)
    agg = aggregate(rows)
    out = {"args": vars(a), "split": "validation" if a.validate else "evaluation", "rows": rows, **agg,
           "wall_s": time.perf_counter() - t0}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(out, fh, indent=1)
    if agg["cells"]:
        plot(agg, os.path.splitext(a.out)[0] + ".png")
    print(json.dumps({"overall": agg["overall"], "paired": agg["paired"]}, indent=1))
    return out


if __name__ == "__main__":
    main()
