"""How often do FDFO's paired branches differ in what ShapesEval checks, per category?

    .venv/bin/python examples/shapes/pairs.py [--model DIR | --lora RUN/final] [--gamma 0.05] [--seeds 8]

FDFO learns from the reward difference within a pair: two branches from one starting noise,
each churned apart (``--gamma``, the demo's sampler.gamma 0.05) over 10 steps. A pair whose
branches agree says nothing. For the held-out items of each category (``--per-category``,
the evaluation's balanced subset) and ``--seeds`` noise seeds each, prints:
  pass_differs   share of pairs where exactly one branch passes;
  both_pass      share where both pass;
  rel_pairs      (position) pairs where both branches drew both named objects;
  rel_differs    (position) share of those where the relation holds in exactly one branch,
                 the pairs whose reward difference is about the relation.
Writes the numbers as JSON with ``--out``.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def compare(image_a: np.ndarray, image_b: np.ndarray, spec: Dict[str, Any]) -> Tuple[bool, bool, Optional[bool]]:
    """Two branches' images [H, W, 3] (0..255) for prompt ``spec`` -> (a passes, b passes,
    the relation holds in exactly one; None without a relation or unless both drew both objects)."""
    from rewards.shapes.verifier import _matches, _relation_holds, detect, satisfies

    dets = detect(image_a), detect(image_b)
    passes = [satisfies(d, spec) for d in dets]
    rel = spec.get("relation")
    groups = [[[d for d in ds if _matches(d, o)] for o in spec["objects"]] for ds in dets]
    if not rel or not all(all(g) for g in groups):
        return passes[0], passes[1], None
    return passes[0], passes[1], _relation_holds(groups[0], rel) != _relation_holds(groups[1], rel)


def pair_images(head, items: List[Dict[str, Any]], seed: int, gamma: float) -> Tuple[np.ndarray, np.ndarray]:
    """The demo's pairs of ``items`` from evaluation noise seed ``seed``: both branches start from
    that noise and are churned apart (``gamma``) over 10 steps -> two [N, H, W, 3] arrays (0..255)."""
    from examples.shapes.evaluate import sample_head
    from flowrl.samplers.churn import ChurnSampler
    from rewards.shapes.verifier import _to_hwc255

    a, b = (_to_hwc255(sample_head(head, items, seed, 10, sampler=ChurnSampler(gamma=gamma), chain_seed=2 * seed + k))
            for k in (0, 1))
    return a, b


def pair_stats(head, items: List[Dict[str, Any]], seeds: int, gamma: float) -> Dict[str, Dict[str, float]]:
    """The demo's pairs of ``items`` over ``seeds`` noise seeds -> {category: stats}."""
    from rewards.shapes.prompts import item_spec

    rows: Dict[str, List[Tuple[bool, bool, Optional[bool]]]] = {}
    related = set()
    for s in range(seeds):
        a, b = pair_images(head, items, s, gamma)
        for j, item in enumerate(items):
            spec = item_spec(item)
            rows.setdefault(spec["category"], []).append(compare(a[j], b[j], spec))
            if spec.get("relation"):
                related.add(spec["category"])
    out = {}
    for cat, r in rows.items():
        rel = [x[2] for x in r if x[2] is not None]
        out[cat] = {"pairs": len(r), "pass_differs": float(np.mean([x[0] != x[1] for x in r])),
                    "both_pass": float(np.mean([x[0] and x[1] for x in r]))}
        if cat in related:
            out[cat].update(rel_pairs=len(rel), rel_differs=float(np.mean(rel)) if rel else float("nan"))
    return out


def main(argv: Optional[Sequence[str]] = None) -> None:
    from examples.shapes.evaluate import add_diagnostic_args, check_diagnostic_args, eval_items, load_head, write_json

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_diagnostic_args(ap, seeds=8, per_category_help="items per category (prompts cycled)")
    ap.add_argument("--gamma", type=float, default=0.05, help="churn of the pairs (the demo's sampler.gamma)")
    args = ap.parse_args(argv)
    check_diagnostic_args(ap, args)
    if args.gamma <= 0:
        ap.error("--gamma must be > 0: with no churn the two branches are the same image")
    res = pair_stats(load_head(args.model, 1.0, args.lora), eval_items(0, args.per_category, args.split),
                     args.seeds, args.gamma)
    for cat, st in res.items():
        print(f"  {cat:<14} " + "  ".join(f"{k} {v if isinstance(v, int) else round(v, 3)}" for k, v in st.items()))
    write_json(args.out, res)


if __name__ == "__main__":
    main()
