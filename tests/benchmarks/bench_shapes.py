"""Benchmark: every algorithm on the shapes world, 3 training seeds, equal reward-query budget.

Runs ``configs/t2i/shapes_{fdfo,flow_grpo,dance_grpo,vg_grpo}.yaml`` (each 128 reward
queries per iteration) and reads their held-out ShapesEval curves (``eval/shapes_eval``
every ``train.eval_every`` iterations, before at 0 and after at the end). Writes JSON and a
PNG of held-out accuracy vs reward queries and vs training wall time (rollout + update
seconds, evaluation excluded), and prints a table. With ``--samples K`` (default 8) each
final model (and the pretrained one) is also scored on K images per held-out item
(``examples/shapes/evaluate.py --samples``): the mean pass rate over 8x more images than
the single-noise evaluation, and pass@K, the best-of-K headroom; a full fine-tune that exported
a LoRA (``head.export_lora_rank``) gets its LoRA's mean pass on the pretrained model too. Not part of
``make test``; run with ``make bench-shapes`` (about 12 runs of the demo's length on a
2-core CPU). ``make bench-demo`` runs FDFO alone, the demo's three seeds on two threads
(the README's demo table).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.benchmarks.reuse import settings_differ  # noqa: E402

ALGORITHMS = ["fdfo", "flow_grpo", "dance_grpo", "vg_grpo"]
QUERIES_PER_ITERATION = 128  # prompts_per_step x group size in every shapes config


def run(algorithm: str, seed: int, out: Path, overrides: list[str], reuse: bool = False) -> dict:
    wall = None
    if not (reuse and (out / "report.json").exists()):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "flowrl", "train", f"configs/t2i/shapes_{algorithm}.yaml",
                              f"seed={seed}", f"output_dir={out}", "overwrite=true", "train.progress=false",
                              "train.tensorboard=false", *overrides], cwd=ROOT, env=env, capture_output=True, text=True)
        wall = round(time.perf_counter() - t0, 1)
        if res.returncode != 0:
            raise SystemExit(f"{algorithm} seed {seed} failed:\n{res.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per_iter: dict = {}  # iteration -> {"s": rollout + update seconds, "eval": held-out accuracy}
    for r in rows:  # the perf/* seconds are per iteration, repeated on each optimizer-step row
        it = per_iter.setdefault(r["iteration"], {"s": (r.get("perf/rollout_s") or 0.0) + (r.get("perf/update_s") or 0.0),
                                                  "eval": None})
        if r.get("eval/shapes_eval") is not None:
            it["eval"] = r["eval/shapes_eval"]
    last = max(per_iter)
    curve = [(0, 0.0, report["before"]["shapes_eval"])]
    elapsed = 0.0
    for it in sorted(per_iter):
        elapsed += per_iter[it]["s"]
        acc = report["after"]["shapes_eval"] if it == last else per_iter[it]["eval"]
        if acc is not None:
            curve.append((it * QUERIES_PER_ITERATION, round(elapsed, 1), acc))
    return {"report": report, "curve": curve, "train_s": round(elapsed, 1), "wall_s": wall}


def headroom(out: Path, samples: int, trained: bool = True, exported: bool = False) -> dict:
    """mean_pass and pass@k of the run's final head (a LoRA on the pretrained model, or a whole
    fully fine-tuned pipeline), or, exported=True, of the LoRA a full fine-tune exported to
    final/lora (``head.export_lora_rank``) on the pretrained model, or, trained=False, of the
    pretrained model, on ``samples`` images per held-out item, with the run's own evaluation
    settings; cached in <out>/headroom-<samples>[-lora].json (the pretrained model's once per
    model, next to the runs)."""
    import yaml

    cfg = yaml.safe_load((out / "config.yaml").read_text())
    name = (f"headroom-{samples}{'-lora' if exported else ''}.json" if trained
            else f"headroom-{samples}-{Path(cfg['head']['path']).name}.json")
    cache = out / name if trained else out.parent / name
    if cache.exists():
        return json.loads(cache.read_text())
    import torch

    from examples.shapes.evaluate import run as evaluate

    torch.set_num_threads(1)
    model, adapter = str(ROOT / cfg["head"]["path"]), ""
    if trained:  # full fine-tuning saves the whole pipeline; a LoRA run saves only the adapter
        final = out / "final"
        model, adapter = (str(final), "") if (final / "model_index.json").exists() else (model, str(final))
        if exported:
            model, adapter = str(ROOT / cfg["head"]["path"]), str(final / "lora")
    metrics, _ = evaluate(model, lora=adapter,
                          per_category=cfg["data"]["eval_per_category"], num_steps=cfg["eval"]["num_steps"],
                          samples=samples)
    result = {k: v for k, v in metrics.items() if k == "mean_pass" or k.startswith("pass@")}
    cache.write_text(json.dumps(result))
    return result


def stat(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} +- {statistics.pstdev(xs):.3f}"


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for alg, res in results.items():
        runs = res["runs"]
        n = min(len(r["curve"]) for r in runs)
        q = [runs[0]["curve"][i][0] for i in range(n)]
        s = [statistics.mean(r["curve"][i][1] for r in runs) for i in range(n)]
        m = [statistics.mean(r["curve"][i][2] for r in runs) for i in range(n)]
        sd = [statistics.pstdev([r["curve"][i][2] for r in runs]) for i in range(n)]
        for ax, x in zip(axes, (q, s)):
            line = ax.plot(x, m, marker="o", ms=3, label=alg)[0]
            ax.fill_between(x, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)],
                            color=line.get_color(), alpha=0.15)
    axes[0].set(xlabel="reward queries", ylabel="held-out ShapesEval", title="accuracy vs reward queries")
    axes[1].set(xlabel="training seconds (rollout + update, mean over seeds)", title="accuracy vs wall time")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="outputs/bench_shapes.json")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    ap.add_argument("--reuse", action="store_true",
                    help="read a run whose <out>/<algorithm>-<seed>/report.json exists instead of training it again "
                         "(refused when it was trained with other settings)")
    ap.add_argument("--samples", type=int, default=8,
                    help="images per held-out item for mean pass and pass@k of each final model (0 = skip)")
    ap.add_argument("overrides", nargs="*", help="extra key=value overrides for every run (e.g. max_steps=20)")
    args = ap.parse_args()
    work = Path(args.out).with_suffix("")
    results = {}
    for alg in args.algorithms if args.reuse else ():
        for seed in args.seeds:
            out = work / f"{alg}-{seed}"
            if not (out / "report.json").exists():
                continue
            differ = settings_differ(out, ROOT / f"configs/t2i/shapes_{alg}.yaml", seed, args.overrides)
            if differ:
                ap.error(f"--reuse: {out} was trained with other settings ({', '.join(differ[:5])}); "
                         f"use another --out for this lever")
    print(f"{'algorithm':<12} {'metric':<16} {'before':>16} {'after':>16} {'training seconds':>18}")
    for alg in args.algorithms:
        runs = [run(alg, seed, work / f"{alg}-{seed}", args.overrides, args.reuse) for seed in args.seeds]
        before = [r["report"]["before"]["shapes_eval"] for r in runs]
        after = [r["report"]["after"]["shapes_eval"] for r in runs]
        # held-out pass/fail first, then the training rewards measured on the same held-out images
        for key in ["shapes_eval"] + sorted(k for k in runs[0]["report"]["after"] if "/" not in k and k != "shapes_eval"):
            b = [r["report"]["before"][key] for r in runs]
            a = [r["report"]["after"][key] for r in runs]
            secs = stat([r["train_s"] for r in runs]) if key == "shapes_eval" else ""
            print(f"{alg:<12} {key:<16} {stat(b):>16} {stat(a):>16} {secs:>18}", flush=True)
        results[alg] = {"seeds": args.seeds, "before": before, "after": after, "runs": runs}
        if args.samples > 1:
            k = f"pass@{2 ** (args.samples.bit_length() - 1)}"
            base = headroom(work / f"{alg}-{args.seeds[0]}", args.samples, trained=False)
            heads = [headroom(work / f"{alg}-{seed}", args.samples) for seed in args.seeds]
            for key, label in (("mean_pass", f"mean_pass x{args.samples}"), (k, k)):
                print(f"{alg:<12} {label:<16} {base[key]:>16.3f} "
                      f"{stat([h[key] for h in heads]):>16}", flush=True)
            results[alg]["headroom"] = {"before": base, "after": heads}
            if all((work / f"{alg}-{seed}" / "final" / "lora").is_dir() for seed in args.seeds):
                loras = [headroom(work / f"{alg}-{seed}", args.samples, exported=True) for seed in args.seeds]
                print(f"{alg:<12} {'mean_pass lora':<16} {base['mean_pass']:>16.3f} "
                      f"{stat([h['mean_pass'] for h in loras]):>16}", flush=True)
                results[alg]["headroom"]["exported_lora"] = loras
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    plot(results, str(Path(args.out).with_suffix(".png")))
    print(f"wrote {args.out} and {Path(args.out).with_suffix('.png')}")


if __name__ == "__main__":
    main()
