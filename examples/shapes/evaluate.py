"""Held-out ShapesEval of a shapes-world text-to-image pipeline, sampled through the t2i head.

    .venv/bin/python examples/shapes/evaluate.py --model examples/shapes/model
    .venv/bin/python examples/shapes/evaluate.py --ground-truth          # the ceiling: renders of the same prompts

The eval split of ``split_prompts(--split-seed)`` (compositions never seen in pretraining
or RL training), balanced: ``--per-category`` images per category, the category's prompts
(a seeded subset of at most that many, ``take_per_category``) cycled. Image j starts from
the noise of ``flowrl.rng.generator(seed, STREAM_EVAL, j, 0, 0)`` (as ``flowrl eval``
draws it) and is integrated with Euler on the pipeline's own time grid
(``head.time_grid``), through ``T2IHead.encode / init_noise / velocity / decode`` -- the
path every RL recipe uses. Prints and writes {"overall", "category_mean", per category}.

``--samples K`` draws K images per item (noise seeds seed, ..., seed + K - 1) and adds the
mean pass rate and the unbiased pass@k (Chen et al., 2021) for k = 1, 2, 4, ... <= K: the
share of items that best-of-k sampling would pass, i.e. the headroom a reward
post-training method can at best turn into single-sample accuracy.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rewards.shapes.prompts import CATEGORIES, balanced, sample_scene, split_prompts  # noqa: E402


def eval_items(split_seed: int = 0, per_category: int = 32, split: str = "eval") -> List[Dict[str, Any]]:
    """``per_category`` items per category (prompts cycled), in category order, of the held-out
    split (``eval``) or, to measure the generalisation gap, of ``train`` / ``pretrain``."""
    return balanced(split_prompts(split_seed)[split], per_category)


def pass_at_k(passed: np.ndarray, ks: Sequence[int]) -> Dict[str, float]:
    """Unbiased pass@k from passed [S, N] bool (S samples of N items): the mean over items of
    1 - C(S - c, k) / C(S, k), c = the item's passing samples. Returns {"pass@k": value}."""
    s = passed.shape[0]
    c = passed.sum(axis=0)
    out = {}
    for k in ks:
        if not 1 <= k <= s:
            raise ValueError(f"pass@{k} needs 1 <= k <= {s} samples")
        out[f"pass@{k}"] = float(np.mean([1.0 - math.comb(s - int(ci), k) / math.comb(s, k) for ci in c]))
    return out


def headroom_metrics(passed: np.ndarray, categories: Sequence[str]) -> Dict[str, float]:
    """passed [S, N] bool (S samples of N items), categories [N] -> mean_pass and pass@k for
    k = 1, 2, 4, ... <= S, plus mean_pass/<category> and pass@S/<category> (where the headroom is)."""
    s = passed.shape[0]
    ks = [2**i for i in range(int(math.log2(s)) + 1)]
    out = {"mean_pass": round(float(passed.mean()), 4), **{k: round(v, 4) for k, v in pass_at_k(passed, ks).items()}}
    for cat in dict.fromkeys(categories):
        cols = [i for i, c in enumerate(categories) if c == cat]
        out[f"mean_pass/{cat}"] = round(float(passed[:, cols].mean()), 4)
        out.update({f"{k}/{cat}": round(v, 4) for k, v in pass_at_k(passed[:, cols], ks[-1:]).items()})
    return out


def load_head(model: str, guidance_scale: float = 1.0, lora: str = ""):
    """The t2i head on a shapes pipeline folder (the config a demo recipe uses)."""
    from flowrl.heads.t2i import T2IHeadConfig, build_t2i_head

    head = build_t2i_head(T2IHeadConfig(family="sd", path=model, resolution=32, guidance_scale=guidance_scale,
                                        lora_rank=0))
    if lora:
        from diffusers.utils import logging as diffusers_logging

        level = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()  # "no LoRA keys for the text encoder": expected, the UNet is trained
        try:
            head.pipe.load_lora_weights(lora)
        finally:
            diffusers_logging.set_verbosity(level)
    return head.eval()


@torch.no_grad()
def sample_head(head, items: List[Dict[str, Any]], seed: int = 0, num_steps: int = 20, batch_size: int = 64,
                noise_offset: Optional[torch.Tensor] = None, with_noise: bool = False, sampler=None, chain_seed: int = 0):
    """Euler ODE from the head's seeded noise on its own time grid -> images [N, 3, 32, 32];
    ``noise_offset`` [C] is added to every starting noise, and ``with_noise`` also returns the
    starting noises [N, C, H, W] (``noise_colour.py``). A stochastic ``sampler`` replaces
    Euler, its noise for image j drawn from ``rng.generator(chain_seed, STREAM_CHAIN, j, 0, 0)``."""
    from flowrl import rng
    from flowrl.mdp import sample_chain
    from flowrl.samplers.ode import EulerSampler

    times = head.time_grid(num_steps)
    out, noises = [], []
    for s in range(0, len(items), batch_size):
        chunk = items[s:s + batch_size]
        gens = [rng.generator(seed, rng.STREAM_EVAL, s + j, 0, 0) for j in range(len(chunk))]
        cond = head.encode(chunk)
        x0 = head.init_noise(cond, gens)
        if noise_offset is not None:
            x0 = x0 + noise_offset.view(1, -1, *([1] * (x0.ndim - 2))).to(x0)
        chain = [rng.generator(chain_seed, rng.STREAM_CHAIN, s + j, 0, 0) for j in range(len(chunk))] if sampler else None
        res = sample_chain(head.velocity, sampler or EulerSampler(), x0, cond, times, chain)
        out.append(head.decode(res["states"][:, -1], cond))
        noises.append(x0)
    return (torch.cat(out), torch.cat(noises)) if with_noise else torch.cat(out)


def ground_truth(items: List[Dict[str, Any]], seed: int = 0) -> torch.Tensor:
    from rewards.shapes.world import render_batch

    return render_batch([sample_scene(it, np.random.default_rng([seed, j])) for j, it in enumerate(items)])


def run(model: str = "", *, ground: bool = False, seed: int = 0, split_seed: int = 0, per_category: int = 32,
        num_steps: int = 20, guidance_scale: float = 1.0, lora: str = "",
        split: str = "eval", samples: int = 1) -> Tuple[Dict[str, float], torch.Tensor]:
    from rewards.shapes.verifier import evaluate, judge

    items = eval_items(split_seed, per_category, split)
    head = None if ground else load_head(model, guidance_scale, lora)

    def draw(s: int) -> torch.Tensor:
        return ground_truth(items, s) if ground else sample_head(head, items, s, num_steps)

    images = draw(seed)
    metrics = {k: round(float(v), 4) for k, v in evaluate(images, items).items()}
    if samples > 1:
        passed = np.array([[bool(v) for v in judge(images if s == seed else draw(s), items)[0]]
                           for s in range(seed, seed + samples)])
        metrics.update(headroom_metrics(passed, [it["category"] for it in items]))
    return metrics, images


REFERENCE_PNG = os.path.join(ROOT, "examples", "shapes", "reference_samples.png")


def reference_samples(model: str, per_category: int = 1) -> torch.Tensor:
    """uint8 [N, 32, 32, 3]: the first held-out item of each category, eval seed 0, 10 Euler
    steps -- the stored sample a committed model must reproduce (``REFERENCE_PNG``)."""
    images = sample_head(load_head(model), eval_items(0, per_category), seed=0, num_steps=10)
    return (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)


def add_diagnostic_args(ap: argparse.ArgumentParser, seeds: int, per_category_help: str) -> None:
    """The options ``noise_colour.py`` and ``pairs.py`` share: model, LoRA, split, seeds, items,
    threads and ``--out``."""
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "shapes", "model"), help="pipeline folder")
    ap.add_argument("--lora", default="", help="optional LoRA folder (a flowrl run's final/)")
    ap.add_argument("--split", choices=["eval", "train", "pretrain"], default="eval")
    ap.add_argument("--seeds", type=int, default=seeds, help="noise seeds per item")
    ap.add_argument("--per-category", type=int, default=16, help=per_category_help)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="", help="write the numbers as JSON here")


def check_diagnostic_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject bad ``add_diagnostic_args`` values with a one-line usage error; set the threads."""
    for name, path in (("--model", args.model), ("--lora", args.lora)):
        if path and not os.path.isdir(path):
            ap.error(f"{name} {path} is not a folder")
    if args.seeds < 1 or args.per_category < 1:
        ap.error("--seeds and --per-category must be >= 1")
    torch.set_num_threads(args.threads)


def write_json(path: str, obj: Any) -> None:
    """``obj`` as indented JSON at ``path`` (its folder made if missing); nothing for an empty path."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(obj, fh, indent=2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "examples", "shapes", "model"), help="pipeline folder")
    ap.add_argument("--ground-truth", action="store_true", help="score ground-truth renders instead (the ceiling)")
    ap.add_argument("--lora", default="", help="optional LoRA folder (a flowrl run's final/) loaded on top")
    ap.add_argument("--seed", type=int, default=0, help="evaluation noise seed")
    ap.add_argument("--split-seed", type=int, default=0)
    ap.add_argument("--split", choices=["eval", "train", "pretrain"], default="eval",
                    help="prompts: the held-out compositions (eval), the RL split (train) or pretraining's")
    ap.add_argument("--per-category", type=int, default=32, help="images per category")
    ap.add_argument("--num-steps", type=int, default=20, help="Euler steps")
    ap.add_argument("--samples", type=int, default=1,
                    help="images per item (seeds seed..seed+K-1): adds mean_pass and pass@k, the best-of-k headroom")
    ap.add_argument("--guidance-scale", type=float, default=1.0, help="CFG scale (1 = off)")
    ap.add_argument("--out", default="", help="write the metrics JSON here (and a PNG grid next to it)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-reference", action="store_true",
                    help=f"(re)write the stored reference samples of --model ({REFERENCE_PNG}) with 1 thread, then exit")
    args = ap.parse_args(argv)
    if args.samples < 1:
        ap.error("--samples must be >= 1")
    if args.write_reference:
        from PIL import Image

        torch.set_num_threads(1)
        ref = reference_samples(args.model)
        Image.fromarray(torch.cat(list(ref), dim=1).numpy()).save(REFERENCE_PNG)
        print(f"wrote {REFERENCE_PNG}")
        return
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    metrics, images = run(args.model, ground=args.ground_truth, seed=args.seed, split_seed=args.split_seed,
                          per_category=args.per_category, num_steps=args.num_steps,
                          guidance_scale=args.guidance_scale, lora=args.lora, split=args.split,
                          samples=args.samples)
    what = "ground truth" if args.ground_truth else f"{args.model} (guidance {args.guidance_scale}, {args.num_steps} steps)"
    split = "held-out" if args.split == "eval" else f"{args.split}-split"
    print(f"{split} shapes_eval, {what}, {args.per_category}/category, {time.time() - t0:.0f} s")
    headroom = tuple(k for k in metrics if k == "mean_pass" or (k.startswith("pass@") and "/" not in k))
    for k in ("category_mean", "overall") + CATEGORIES + headroom:
        print(f"  {k:14s} {metrics.get(k, float('nan')):.3f}")
    if headroom:
        k = headroom[-1]
        print(f"  per category: mean pass / {k}")
        for cat in CATEGORIES:
            print(f"    {cat:14s} {metrics[f'mean_pass/{cat}']:.3f} / {metrics[f'{k}/{cat}']:.3f}")
    if args.out:
        write_json(args.out, {"metrics": metrics, "args": vars(args)})
        from torchvision.utils import save_image

        save_image(images, os.path.splitext(args.out)[0] + ".png", nrow=args.per_category)


if __name__ == "__main__":
    main()
