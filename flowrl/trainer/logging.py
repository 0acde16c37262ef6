"""metrics.jsonl (one JSON object per optimizer step) and optional tensorboard."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Optional


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class MetricsLogger:
    def __init__(self, output_dir: str, tensorboard: bool = True):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(output_dir, "tb"))
            except ImportError:  # tensorboard is optional
                self.tb = None

    def truncate_after(self, step: int) -> None:
        """Drop rows with ``step`` > step (written after the checkpoint a run resumes from)."""
        if not os.path.isfile(self.path):
            return
        rows = [line for line in open(self.path) if line.strip() and json.loads(line).get("step", 0) <= step]
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.writelines(rows)
        os.replace(tmp, self.path)

    def log(self, row: Dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps({k: _clean(v) for k, v in row.items()}, sort_keys=True) + "\n")
        if self.tb is not None:
            step = int(row["step"])
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(output_dir: str) -> list[Dict[str, Optional[float]]]:
    path = os.path.join(output_dir, "metrics.jsonl")
    return [json.loads(line) for line in open(path) if line.strip()]


def curve_series(rows: list, before: Dict[str, float], after: Dict[str, float], last_iteration: int):
    """Training and evaluation curves from metrics rows.

    Returns (train, evals): train {metric: ([iteration], [value])} for the ``reward/*``
    means (not the ``_invalid_frac`` / ``_failures`` counters); evals {metric: ([iteration],
    [value])} from ``eval/*`` rows, with ``before`` at iteration 0 and ``after`` at
    ``last_iteration``.
    """
    train: Dict[str, tuple] = {}
    evals: Dict[str, tuple] = {k: ([0], [v]) for k, v in before.items()}
    for row in rows:
        it = row.get("iteration", row.get("step"))
        for k, v in row.items():
            if v is None or not isinstance(v, (int, float)):
                continue
            if k.startswith("reward/") and not k.endswith(("_invalid_frac", "_failures")):
                train.setdefault(k, ([], []))
                if train[k][0] and train[k][0][-1] == it:  # several optimizer steps per iteration
                    continue
                train[k][0].append(it)
                train[k][1].append(v)
            elif k.startswith("eval/"):
                evals.setdefault(k[5:], ([], []))
                evals[k[5:]][0].append(it)
                evals[k[5:]][1].append(v)
    for k, v in after.items():
        evals.setdefault(k, ([], []))
        evals[k][0].append(last_iteration)
        evals[k][1].append(v)
    return train, evals


def by_family(series: Dict[str, tuple], strip: str = "") -> Dict[str, Dict[str, tuple]]:
    """Group curves by their name before the first "/" (after removing ``strip``), so each
    panel holds one scale: {"clip": {...}, "shapes_eval": {"shapes_eval": ..,
    "shapes_eval/colors": ..}}."""
    out: Dict[str, Dict[str, tuple]] = {}
    for k in sorted(series):
        name = k[len(strip):] if strip and k.startswith(strip) else k
        out.setdefault(name.split("/")[0], {})[k] = series[k]
    return out


def plot_curves(output_dir: str, before: Dict[str, float], after: Dict[str, float], last_iteration: int) -> str:
    """Write ``output_dir/curves.png``: training rewards (top row) and evaluation metrics
    (bottom row) vs iteration, one panel per reward / metric so each has its own scale;
    returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(output_dir) if os.path.isfile(os.path.join(output_dir, "metrics.jsonl")) else []
    train, evals = curve_series(rows, before, after, last_iteration)
    panels = [by_family(train, "reward/"), by_family(evals)]
    cols = max(1, *(len(p) for p in panels))
    fig, axes = plt.subplots(2, cols, figsize=(4.2 * cols, 7), squeeze=False)
    for r, (fam, what) in enumerate(zip(panels, ("training reward (rollout mean)", "evaluation (held-out, fixed seeds)"))):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(fam):
                ax.axis("off")
                continue
            name = sorted(fam)[c]
            for k, (x, y) in fam[name].items():
                ax.plot(x, y, marker="o" if r else None, ms=3, label=k, lw=2 if k.count("/") <= 1 - r else 1)
            ax.set_title(f"{name}\n{what}", fontsize=9)
            ax.set_xlabel("iteration")
            if len(fam[name]) > 1:
                ax.legend(fontsize=6)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(output_dir, "curves.png")
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)
    return path
