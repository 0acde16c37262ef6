"""Per-window weights for offline adaptation: one registry, one column.

Every adaptation method here is "weighted denoising regression with a per-sample weight":
the data source computes a weight per training window before training and stores it as the
dataset column ``weight`` (PTR also stores its calibrated score as ``ptr_score``, which
``flowrl.algorithms.ptr`` turns into the clipped-and-mixed PTR weight). The trainer's
algorithm then only reads a column, and reduces sum(w l) / sum(w) over the global batch.

  uniform   w = 1                                           (plain fine-tuning)
  oracle    w = 1 for clean-source windows, 0 otherwise     (reads the hidden source labels:
                                                             an upper bound, not a method)
  filtered  w = 1 for windows of successful episodes        (success-filtered BC)
  awr       w = min(exp(A / (beta std A)), w_max)            (advantage-weighted regression on
            A = Q - V, Q = discounted dense return-to-go     MetaWorld's dense reward; the
            (success absorbing), V = k-NN mean of Q over     loss self-normalises the weights)
            similar states of other episodes
  ptr       transition scorer -> calibrated ratio r          (planners/robot/scorer.py)

``WEIGHTINGS[name](ds, config, context) -> (columns, extra diagnostics)``; a method may add
entries with ``register``. Diagnostics for every method: AUROC of the weights for clean vs
corrupted windows (and per episode), effective sample size, weight mass / mean per source,
and for PTR the scorer's accuracies.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from flowrl._fields import hfield
from flowrl.algorithms.ptr import auroc, effective_sample_size
from planners.robot.scorer import PTRScorer, ScorerConfig, diagnostics
from planners.robot.sources import SOURCES

Tensor = torch.Tensor
METHODS = ("uniform", "oracle", "filtered", "awr", "ptr")


@dataclass
class WeightingConfig:
    """How the per-window ``weight`` column of an adaptation dataset is computed."""

    method: str = hfield("uniform", "uniform, oracle (hidden source labels; upper bound), filtered (successful "
                                    "episodes), awr (dense-reward advantages) or ptr (transition scorer)")
    seed: int = hfield(0, "seed of the scorer's training and pool draws")
    # ---- PTR
    scorer_data: str = hfield("pretrain", "data the transition scorer is fit on: pretrain (the trusted clean "
                                          "source-task data the head was pretrained on) or target (the mix itself)")
    scorer_steps: int = hfield(1000, "scorer training steps (InfoNCE, batch 256)")
    k: int = hfield(16, "candidates per pool (1 true consequence + K-1 negatives)")
    neighbours: int = hfield(48, "negatives come from the targets of this many nearest other-episode contexts")
    ablate: bool = hfield(False, "score = full minus action-ablated log-posterior (action-attributable part)")
    smooth: str = hfield("episode", "episode (average the log score over each episode) or none")
    calibration: str = hfield("ess", "quantile, rank or ess: how the log score becomes a ratio r (scorer.calibrate)")
    ratio: float = hfield(50.0, "quantile / rank calibration: r spans this factor")
    q_lo: float = hfield(0.1, "clip bounds: lower quantile of the log score")
    q_hi: float = hfield(0.9, "clip bounds: upper quantile of the log score")
    ess_target: float = hfield(0.3, "ess calibration: effective sample size of the weights")
    cache: bool = hfield(True, "cache a scorer fit on the pretraining data under data.cache_dir")
    # ---- AWR
    awr_beta: float = hfield(1.0, "AWR temperature in units of the advantage's standard deviation")
    awr_w_max: float = hfield(20.0, "AWR weight clip")
    gamma: float = hfield(0.99, "AWR discount of the dense return")
    knn: int = hfield(32, "AWR value baseline: nearest other-episode states averaged")

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"data.weighting.method must be one of {', '.join(METHODS)}")
        if self.scorer_data not in ("pretrain", "target"):
            raise ValueError("data.weighting.scorer_data must be 'pretrain' or 'target'")
        if self.smooth not in ("episode", "none"):
            raise ValueError("data.weighting.smooth must be 'episode' or 'none'")
        if self.calibration not in ("quantile", "rank", "ess"):
            raise ValueError("data.weighting.calibration must be quantile, rank or ess")
        if not 0.0 <= self.q_lo < self.q_hi <= 1.0 or not 0.0 < self.ess_target <= 1.0 or self.ratio < 1.0:
            raise ValueError("data.weighting: need 0 <= q_lo < q_hi <= 1, 0 < ess_target <= 1, ratio >= 1")
        if self.awr_beta <= 0 or self.awr_w_max <= 0 or not 0 < self.gamma <= 1:
            raise ValueError("data.weighting: awr_beta, awr_w_max > 0 and 0 < gamma <= 1 required")

    def scorer_config(self) -> ScorerConfig:
        return ScorerConfig(k=self.k, neighbours=self.neighbours, steps=self.scorer_steps, ablate=self.ablate,
                            smooth=self.smooth, calibration=self.calibration, ratio=self.ratio, q_lo=self.q_lo,
                            q_hi=self.q_hi, ess_target=self.ess_target, seed=self.seed)


WeightFn = Callable[[Any, WeightingConfig, Dict[str, Any]], Tuple[Dict[str, Tensor], Dict[str, float]]]
WEIGHTINGS: Dict[str, WeightFn] = {}


def register(name: str):
    def deco(fn: WeightFn) -> WeightFn:
        WEIGHTINGS[name] = fn
        return fn
    return deco


@register("uniform")
def _uniform(ds, c, ctx):
    return {"weight": torch.ones(len(ds))}, {}


@register("oracle")
def _oracle(ds, c, ctx):
    return {"weight": ds.columns["oracle"].clone()}, {}


@register("filtered")
def _filtered(ds, c, ctx):
    return {"weight": ds.columns["ep_success"].clone()}, {}


def discounted_return(ds, gamma: float) -> Tensor:
    """[N] Q of each window: discounted dense return-to-go; a successful episode's last
    reward repeats forever (success is absorbing: the recording stops after success)."""
    out = []
    for e in ds.episodes:
        r = e.rewards.astype(np.float64)
        q = np.zeros(len(r))
        tail = r[-1] / (1 - gamma) if (e.succeeded and gamma < 1) else 0.0
        acc = tail
        for t in range(len(r) - 1, -1, -1):
            acc = r[t] + gamma * acc
            q[t] = acc
        out.append(q)
    return torch.from_numpy(np.concatenate(out)).float()


def knn_baseline(ctx: Tensor, value: Tensor, episode: Tensor, k: int, chunk: int = 1024) -> Tensor:
    """[N] mean of ``value`` over the k nearest contexts from other episodes."""
    out = []
    for s in range(0, ctx.shape[0], chunk):
        d = torch.cdist(ctx[s:s + chunk], ctx)
        d = d.masked_fill(episode[s:s + chunk, None] == episode[None], float("inf"))
        idx = d.topk(min(k, ctx.shape[0] - 1), largest=False).indices
        out.append(value[idx].mean(1))
    return torch.cat(out)


@register("awr")
def _awr(ds, c, ctx):
    q = discounted_return(ds, c.gamma)
    obs = ds.obs[:, -1]
    z = (obs - obs.mean(0)) / obs.std(0).clamp(min=1e-3)
    v = knn_baseline(z, q, ds.columns["episode"], c.knn)
    adv = q - v
    w = torch.exp(adv / (c.awr_beta * adv.std().clamp(min=1e-6))).clamp(max=c.awr_w_max)
    return {"weight": w, "awr_adv": adv}, {"awr/adv_std": float(adv.std()), "awr/clip_frac": float((w >= c.awr_w_max).float().mean())}


def _scorer_cache_path(c: WeightingConfig, spec: Dict[str, Any], cache_dir: str) -> str:
    sc = asdict(c.scorer_config())
    fit_keys = {k: sc[k] for k in ("k", "neighbours", "steps", "ablate", "seed")}
    key = hashlib.sha256(json.dumps({"fit": fit_keys, "data": spec, "v": 1}, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(cache_dir, f"scorer_{key}.safetensors")


@register("ptr")
def _ptr(ds, c, ctx):
    scorer = PTRScorer(c.scorer_config())
    t0 = time.perf_counter()
    fit: Dict[str, float] = {}
    if c.scorer_data == "target":
        fit = scorer.fit(ds)
    else:
        path = _scorer_cache_path(c, ctx["pretrain_spec"], ctx["cache_dir"]) if c.cache else None
        if path and os.path.isfile(path):
            state = load_file(path)
            dims = (state["norm.ctx_mean"].numel(), ds.exec_steps * ds.actions.shape[-1], state["norm.y_mean"].numel())
            scorer.load_state_dict(state, dims)
            fit = {"scorer/cached": 1.0}
        else:
            fit = scorer.fit(ctx["pretrain_dataset"]())
            if path:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                save_file(scorer.state_dict(), path + ".tmp")
                os.replace(path + ".tmp", path)
    s = scorer.score(ds)
    extra = {**fit, **{k: v for k, v in diagnostics(s["r"], ds.columns["source"], s).items()
                       if (k.startswith("scorer/") or k.startswith("ptr/auroc_") or k.startswith("ptr/raw/"))
                       and (c.ablate or "acc_abl" not in k)},
             "ptr/r_min": float(s["r"].min()), "ptr/r_max": float(s["r"].max()), "scorer/total_s": time.perf_counter() - t0}
    return {"weight": s["r"].clone(), "ptr_score": s["r"], "ptr_raw": s["raw"]}, extra


def weight_diagnostics(w: Tensor, source: Tensor, episode: Tensor) -> Dict[str, float]:
    """AUROC (windows and episodes, clean vs corrupted), ESS, mass / share / mean weight per source."""
    is_clean = source == SOURCES.index("clean")
    out = {"weights/auroc_clean_vs_corrupted": auroc(w, is_clean),
           "weights/auroc_episodes": _episode_auroc(w, is_clean, episode),
           "weights/ess": effective_sample_size(w.clamp(min=0) + 1e-12)}
    total = float(w.sum())
    for i, name in enumerate(SOURCES):
        m = source == i
        if bool(m.any()):
            out[f"weights/mass/{name}"] = float(w[m].sum()) / max(total, 1e-12)
            out[f"weights/share/{name}"] = float(m.float().mean())
            out[f"weights/mean_w/{name}"] = float(w[m].mean())
    return out


def _episode_auroc(w: Tensor, is_clean: Tensor, episode: Tensor) -> float:
    m = int(episode.max()) + 1
    tot = torch.zeros(m, dtype=torch.float64).index_add_(0, episode, w.double())
    cnt = torch.zeros(m, dtype=torch.float64).index_add_(0, episode, torch.ones_like(w, dtype=torch.float64))
    clean = torch.zeros(m, dtype=torch.bool)
    clean[episode[is_clean]] = True
    keep = cnt > 0
    return auroc((tot / cnt.clamp(min=1))[keep], clean[keep])


def apply_weighting(ds, c: WeightingConfig, ctx: Dict[str, Any]) -> Dict[str, float]:
    """Compute the method's columns, attach them to ``ds`` and return the diagnostics."""
    t0 = time.perf_counter()
    cols, extra = WEIGHTINGS[c.method](ds, c, ctx)
    for k, v in cols.items():
        ds.set_column(k, v)
    diag = {"weights/method": c.method, **weight_diagnostics(ds.columns["weight"], ds.columns["source"], ds.columns["episode"]),
            **extra, "weights/compute_s": time.perf_counter() - t0}
    return diag


def plot_weight_mass(diag: Dict[str, Any], path: str, title: str = "") -> Optional[str]:
    """Bar chart: share of windows vs share of weight mass per source."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    names = [s for s in SOURCES if f"weights/share/{s}" in diag]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    ax.bar(x - 0.2, [diag[f"weights/share/{s}"] for s in names], 0.4, label="share of windows", color="0.7")
    ax.bar(x + 0.2, [diag[f"weights/mass/{s}"] for s in names], 0.4, label="share of weight mass", color="tab:blue")
    ax.set_xticks(x, names)
    ax.set_ylabel("fraction")
    auc = diag.get("weights/auroc_clean_vs_corrupted", float("nan"))
    ax.set_title(f"{title} {diag.get('weights/method', '')}: AUROC {auc:.2f}, ESS {diag.get('weights/ess', float('nan')):.2f}".strip())
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
