"""Evaluation summaries: per-label means, rounding for the terminal, the before/after table."""
from __future__ import annotations

import math
from typing import Dict, List, Sequence


def group_means(sums: Dict[str, List[float]], names: Sequence[str]) -> Dict[str, float]:
    """{key: [score sum, valid count]} -> means: ``name`` for every reward, then its
    ``name/<group>`` breakdown (sorted) and ``name/group_mean`` (unweighted mean over groups)."""
    mean = lambda a, b: float(a / b) if b > 0 else float("nan")  # noqa: E731
    out: Dict[str, float] = {}
    for name in names:
        out[name] = mean(*sums.get(name, [0.0, 0.0]))
        groups = sorted(k for k in sums if k.startswith(name + "/"))
        for k in groups:
            out[k] = mean(*sums[k])
        if groups:
            vals = [out[k] for k in groups if math.isfinite(out[k])]
            out[f"{name}/group_mean"] = float(sum(vals) / len(vals)) if vals else float("nan")
    return out


def round_metrics(d: Dict[str, float]) -> Dict[str, float]:
    return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in d.items()}


def format_report(report: Dict[str, Dict[str, float]]) -> str:
    """A before/after table for the terminal."""
    names = list(report["before"]) or list(report["after"])
    width = max([len(n) for n in names] + [6])
    lines = [f"{'metric':<{width}}  {'before':>8}  {'after':>8}"]
    for n in names:
        b, a = report["before"].get(n, float("nan")), report["after"].get(n, float("nan"))
        lines.append(f"{n:<{width}}  {b:>8.4f}  {a:>8.4f}")
    return "\n".join(lines)
