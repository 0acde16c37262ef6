"""Benchmark: the driving post-training recipes on several held-out scene splits, several seeds.

Trains ``configs/driving/<config>.yaml`` for every config x training seed (or reuses a
finished run with ``--reuse``), evaluates the pretrained planner and every trained one on
each split of 256 scene seeds (``data.eval_first_seed``), and prints the relative change
of collision rate, average speed, off-road rate and ADE against the pretrained planner,
per seed and as the mean over seeds. 100000- is the split of ``report.json``, 200000- is
meant for choosing, 300000- and 400000- for reporting: a lever read on one seed of one split
can look 5-10 points better than it is.

    python tests/benchmarks/bench_driving_splits.py --out outputs/bench_driving_splits.json
    python tests/benchmarks/bench_driving_splits.py --configs vg_grpo --set algorithm.std1=0.5 --runs outputs/lever

``--set KEY=VALUE`` (repeatable) applies to training only: evaluation and the pretrained
baseline use the config as written, so an override of the environment or of ``head.path``
is trained in one setting and scored in another. Runs go side by side, ``--jobs``
at a time, one torch thread each. Not part of ``make test``; ``make bench-driving-splits``
took 40 min end to end on a 2-core CPU: 6 trainings of about 10.5 min, two side by side, and 28
evaluations of about 17 s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.benchmarks.reuse import settings_differ as trained_otherwise  # noqa: E402

METRICS = ("collision_rate", "avg_speed", "offroad_rate", "ade")


def flowrl(args: list[str]) -> None:
    """Run one ``flowrl`` command on one thread; raise with its last output on failure."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FLOWRL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "flowrl", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"flowrl {' '.join(args)} failed:\n{res.stderr[-2000:]}")


def settings_differ(run: Path, config: str, seed: int, overrides: list[str]) -> list[str]:
    """The keys in which a finished run was trained otherwise than ``train`` would now,
    leaving out where it evaluated and what it rendered: a reused run must be the same lever."""
    import planners.driving  # noqa: F401  (registers the driving head and environment)

    return trained_otherwise(run, ROOT / f"configs/driving/{config}.yaml", seed, overrides,
                             ignore={"data.eval_first_seed", "data.num_eval", "env.render_scenes"})


def train(config: str, seed: int, run: Path, overrides: list[str], reuse: bool) -> None:
    if reuse and (run / "final").is_dir():
        return
    flowrl(["train", f"configs/driving/{config}.yaml", f"seed={seed}", f"output_dir={run}", "overwrite=true",
            *overrides])


def evaluate(config: str, checkpoint: Path | None, split: int, out: Path, reuse: bool) -> dict:
    """Closed-loop metrics of a checkpoint (None: the pretrained planner) on one split."""
    if not (reuse and (out / "eval.json").exists()):
        ckpt = [f"checkpoint={checkpoint}"] if checkpoint else []
        flowrl(["eval", f"configs/driving/{config}.yaml", *ckpt, f"data.eval_first_seed={split}",
                f"output_dir={out}"])
    return json.loads((out / "eval.json").read_text())


def change(after: dict, before: dict) -> dict:
    """Relative change in percent per metric (nan where the pretrained value is 0)."""
    return {k: 100.0 * (after[k] / before[k] - 1.0) if before[k] else float("nan") for k in METRICS}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--configs", default="vg_grpo,grpo_nogate", help="names in configs/driving/, comma-separated")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--splits", default="100000,200000,300000,400000", help="first scene seed of each 256-scene split")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="training override (repeatable)")
    p.add_argument("--runs", default="outputs/bench_driving_splits", help="folder for the runs and evaluations")
    p.add_argument("--jobs", type=int, default=2, help="runs side by side (one thread each)")
    p.add_argument("--reuse", action="store_true", help="reuse finished runs (trained with the same settings) and "
                                                        "evaluations")
    p.add_argument("--out", default=None, help="write the results as JSON")
    args = p.parse_args()
    configs, seeds = args.configs.split(","), [int(s) for s in args.seeds.split(",")]
    splits = [int(s) for s in args.splits.split(",")]
    runs = Path(args.runs).resolve()
    with ThreadPoolExecutor(args.jobs) as pool:
        trained = {(c, s): runs / f"{c}_s{s}" for c in configs for s in seeds}
        for (c, s), run in trained.items():
            differ = settings_differ(run, c, s, args.set) if args.reuse and (run / "final").is_dir() else []
            if differ:
                p.error(f"--reuse: {run} was trained with other settings ({', '.join(differ[:5])}); "
                        f"use another --runs folder for this lever")
        jobs = [pool.submit(train, c, s, run, args.set, args.reuse) for (c, s), run in trained.items()]
        base = {sp: pool.submit(evaluate, configs[0], None, sp, runs / f"pretrained_{sp}", args.reuse) for sp in splits}
        for j in jobs:
            j.result()
        evals = {(c, s, sp): pool.submit(evaluate, c, run / "final", sp, run / f"eval_{sp}", args.reuse)
                 for (c, s), run in trained.items() for sp in splits}
        base = {sp: f.result() for sp, f in base.items()}
        evals = {k: f.result() for k, f in evals.items()}
    results = {"settings": vars(args), "pretrained": {str(sp): base[sp] for sp in splits}, "runs": {}}
    print(f"{'config':<14}{'split':>8}  " + "  ".join(f"{m + ' %':>30}" for m in METRICS))
    for c in configs:
        for sp in splits:
            per_seed = [change(evals[(c, s, sp)], base[sp]) for s in seeds]
            results["runs"][f"{c}/{sp}"] = {str(s): {m: None if v != v else round(v, 2) for m, v in r.items()}
                                            for s, r in zip(seeds, per_seed)}
            cells = []
            for m in METRICS:
                vals = [r[m] for r in per_seed]
                cells.append(f"{' / '.join(f'{v:+.1f}' for v in vals)} ({statistics.mean(vals):+.1f})")
            print(f"{c:<14}{sp:>8}  " + "  ".join(f"{x:>30}" for x in cells))
    print("pretrained: " + "; ".join(f"{sp}: collision {base[sp]['collision_rate']:.4f}, speed "
                                     f"{base[sp]['avg_speed']:.2f} m/s" for sp in splits))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
