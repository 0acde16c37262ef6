"""Does an object's colour follow the prompt, or the starting noise under it?

    .venv/bin/python examples/shapes/noise_colour.py [--lora RUN/final] [--split eval] [--seeds 16]

On the ``colors`` items of a split (one object; its colour is named), for ``--seeds`` noise
seeds each (the evaluation noise of ``evaluate.py``, 10 Euler steps), prints:
  prompt_match     share of drawn objects whose colour is the prompt's;
  noise_predicts   leave-one-out accuracy of predicting the drawn colour from the mean of
                   the starting noise under the object (nearest class mean), beside
                   ``majority`` (always the most common colour) and ``noise_global``
                   (the same from the mean of the whole noise image);
  shifted/<c>      an intervention: every starting noise is offset by a constant,
                   ``--shift-scale`` x (colour c's class mean - the centre of the class
                   means), and this is the share of objects then drawn in c;
  pair/*           FDFO's pairs as the demo draws them: two branches from one starting
                   noise, each churned apart (``--pair-gamma``, the demo's 0.05), over
                   half of the ``--seeds``:
                   ``colour_differs``, the share of pairs whose objects differ in colour,
                   and ``one_matches``, the share where exactly one has the prompt's
                   colour (the pairs whose reward difference is about colour).
Writes the numbers as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rewards.shapes.world import COLOURS  # noqa: E402


def nearest_mean_loo(x: np.ndarray, y: Sequence[str]) -> float:
    """x [N, d] features, y [N] labels -> leave-one-out accuracy of the nearest class mean
    (each sample is left out of its own class's mean)."""
    y = np.asarray(y)
    hits = 0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        means = {c: x[keep & (y == c)].mean(0) for c in np.unique(y) if (keep & (y == c)).any()}
        hits += min(means, key=lambda c: float(np.sum((x[i] - means[c]) ** 2))) == y[i]
    return hits / len(y)


def object_colour_and_mask(image: np.ndarray, tol: float = 60.0) -> Tuple[Optional[str], Optional[np.ndarray]]:
    """image [H, W, 3] in 0..255 -> (the colour of the largest detected object, its pixel mask
    [H, W] bool: pixels within ``tol`` of that palette colour), or (None, None)."""
    from rewards.shapes.verifier import detect

    found = [d for d in detect(image) if d.colour is not None]
    if not found:
        return None, None
    colour = max(found, key=lambda d: d.area).colour
    mask = np.linalg.norm(image - np.asarray(COLOURS[colour], dtype=np.float64), axis=-1) < tol
    return (colour, mask) if mask.sum() >= 5 else (None, None)


def draw(head, items: List[Dict], seed: int, offset: Optional[torch.Tensor] = None):
    """Starting noise [N, C, H, W] of evaluation seed ``seed`` (+ ``offset`` [C]) and the images
    [N, H, W, 3] (0..255) that 10 Euler steps make of it (``evaluate.sample_head``)."""
    from examples.shapes.evaluate import sample_head
    from rewards.shapes.verifier import _to_hwc255

    images, x0 = sample_head(head, items, seed, 10, noise_offset=offset, with_noise=True)
    return x0, _to_hwc255(images)


def pair_colours(head, items: List[Dict], seeds: int, gamma: float) -> Dict[str, float]:
    """FDFO's pairs (one starting noise, two churned branches) of the ``items`` -> the share of
    pairs (both objects found) whose colours differ, and where exactly one is the prompt's."""
    from examples.shapes.pairs import pair_images

    differ, one = [], []
    for s in range(seeds):
        a, b = pair_images(head, items, s, gamma)
        for j, it in enumerate(items):
            ca, cb = object_colour_and_mask(a[j])[0], object_colour_and_mask(b[j])[0]
            if ca is not None and cb is not None:
                want = it["objects"][0]["colour"]
                differ.append(ca != cb)
                one.append((ca == want) != (cb == want))
    return {"pair/pairs": len(differ), "pair/colour_differs": float(np.mean(differ)) if differ else float("nan"),
            "pair/one_matches": float(np.mean(one)) if one else float("nan")}


def run(model: str, lora: str = "", split: str = "eval", seeds: int = 16, per_category: int = 16,
        shift_scale: float = 2.0, guidance_scale: float = 1.0, pair_gamma: float = 0.05) -> Dict[str, float]:
    from examples.shapes.evaluate import eval_items, load_head

    head = load_head(model, guidance_scale, lora)
    items = [it for it in eval_items(0, per_category, split) if it["category"] == "colors"]
    feats, glob, got, want = [], [], [], []
    for s in range(seeds):
        x0, images = draw(head, items, s)
        for j, image in enumerate(images):
            colour, mask = object_colour_and_mask(image)
            if colour is None:
                continue
            z = x0[j].numpy()
            feats.append(z[:, mask].mean(1))
            glob.append(z.reshape(z.shape[0], -1).mean(1))
            got.append(colour)
            want.append(items[j]["objects"][0]["colour"])
    if len(set(got)) < 2:
        raise SystemExit("error: fewer than two drawn colours to compare; raise --seeds")
    x, y = np.stack(feats), np.asarray(got)
    out = {"objects": len(y), "prompt_match": float(np.mean(y == np.asarray(want))),
           "majority": float(max(np.mean(y == c) for c in set(got))),
           "noise_predicts": nearest_mean_loo(x, y), "noise_global": nearest_mean_loo(np.stack(glob), y)}
    means = {c: x[y == c].mean(0) for c in sorted(set(got))}
    centre = np.mean(list(means.values()), axis=0)
    for c, m in means.items():
        offset = torch.tensor(shift_scale * (m - centre), dtype=torch.float32)
        drawn = [object_colour_and_mask(im)[0] for s in range(max(1, seeds // 2)) for im in draw(head, items, s, offset)[1]]
        drawn = [d for d in drawn if d is not None]
        out[f"shifted/{c}"] = float(np.mean([d == c for d in drawn])) if drawn else float("nan")
        out[f"offset/{c}"] = [round(float(v), 3) for v in offset]
    out.update(pair_colours(head, items, max(1, seeds // 2), pair_gamma))
    return out


def main(argv=None) -> None:
    from examples.shapes.evaluate import add_diagnostic_args, check_diagnostic_args, write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_diagnostic_args(ap, seeds=16, per_category_help="colour items (prompts cycled)")
    ap.add_argument("--shift-scale", type=float, default=2.0, help="size of the intervention's noise offset")
    ap.add_argument("--guidance-scale", type=float, default=1.0, help="CFG scale (1 = off, as in the demo)")
    ap.add_argument("--pair-gamma", type=float, default=0.05, help="churn of the FDFO pairs (the demo's sampler.gamma)")
    args = ap.parse_args(argv)
    check_diagnostic_args(ap, args)
    if args.pair_gamma <= 0:
        ap.error("--pair-gamma must be > 0: with no churn the two branches are the same image")
    res = run(args.model, args.lora, args.split, args.seeds, args.per_category, args.shift_scale, args.guidance_scale,
              args.pair_gamma)
    for k, v in res.items():
        print(f"  {k:<18} {v if isinstance(v, list) else round(v, 3)}")
    write_json(args.out, res)


if __name__ == "__main__":
    main()
