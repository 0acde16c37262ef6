"""Run a robot config in-process and collect one comparable result row.

Used by examples/robot_offline_adaptation.py and tests/benchmarks/bench_robot.py (and the
CI test). The engine's closed-loop evaluation reports the environment's ``episode_metrics``
(success rate, dense return, episode length); ``RobotTrainer`` only lets a process that runs
many configs evaluate an unchanged pretrained head once ("before"). The data source's
weighting diagnostics reach report.json under "data" through the engine's ``report`` hook.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, List, Optional, Sequence

from flowrl.trainer import Trainer

#: (head path, env/eval settings) -> "before" metrics of an unchanged pretrained head
_BEFORE_CACHE: Dict[str, Dict[str, float]] = {}


class RobotTrainer(Trainer):
    """The engine's Trainer; ``reuse_before``: a head loaded unchanged from ``head.path`` is evaluated once per
    (path, task, evaluation settings) in this process; later runs reuse that "before".
    """

    reuse_before = False

    def _before_key(self) -> Optional[str]:
        c = self.cfg
        if not self.reuse_before or self.iteration != 0 or not getattr(c.head, "path", None):
            return None
        return json.dumps([c.head.path, [str(i) for i in list(self.data.eval_items())[: c.eval.num_items]],
                           c.eval.samples_per_item, c.eval.seed, c.eval.num_steps, c.chain.num_steps,
                           getattr(c.env, "max_steps", None), getattr(c.env, "exec_steps", None)])

    def _evaluate_closed_loop(self, seed: int, tag: Optional[str] = None) -> Dict[str, float]:
        key = self._before_key()
        if key is not None and key in _BEFORE_CACHE:
            return dict(_BEFORE_CACHE[key])
        out = super()._evaluate_closed_loop(seed, tag)
        if key is not None:
            _BEFORE_CACHE[key] = dict(out)
        return out


def run(config: str, overrides: Sequence[str] = (), reuse_before: bool = False) -> Dict[str, Any]:
    """Train ``config`` with ``overrides``; returns report.json's content plus "weights" (the
    weighting diagnostics), "time_s" and "output_dir"."""
    from flowrl.config import load_config
    import flowrl.builtins  # noqa: F401  (registration)

    t0 = time.perf_counter()
    cfg = load_config(config, list(overrides))
    RobotTrainer.reuse_before = reuse_before
    trainer = RobotTrainer(cfg)
    try:
        report = trainer.train()
    finally:
        trainer.close()
    # the engine stores the data source's weighting diagnostics under report["data"]
    return {**report, "weights": report.get("data", {}), "time_s": time.perf_counter() - t0,
            "output_dir": cfg.output_dir}

def row(result: Dict[str, Any], **labels: Any) -> Dict[str, Any]:
    """A flat result row: labels + before/after success and return + key weight diagnostics."""
    w = result.get("weights", {})
    r = dict(labels)
    for when in ("before", "after"):
        for k in ("success", "return"):
            r[f"{when}_{k}"] = result.get(when, {}).get(k, float("nan"))
    for k in ("weights/auroc_clean_vs_corrupted", "weights/auroc_episodes", "weights/ess", "weights/mass/clean",
              "weights/share/clean", "scorer/acc_full"):
        if k in w:
            r[k.split("/", 1)[1].replace("/", "_")] = w[k]
    r["time_s"] = result.get("time_s", float("nan"))
    return r


def format_table(rows: List[Dict[str, Any]], cols: Sequence[str]) -> str:
    def f(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    widths = [max(len(c), *(len(f(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(f(r.get(c, "")).ljust(w) for c, w in zip(cols, widths)) for r in rows]
    return "\n".join(lines)
