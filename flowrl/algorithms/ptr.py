"""PTR: posterior-transition reweighting for conservative offline adaptation.

Reference: "Conservative Offline Robot Policy Learning via Posterior-Transition
Reweighting" (arXiv 2603.16542). Reward-free: a transition scorer is trained with InfoNCE
to identify each sample's observed post-action consequence (its latent target) among K
candidates; the posterior of the true target, times K, is the PTR score

    r_i = K * softmax(logits_i)[true]          (1 = chance, K = certain)

(a scorer may pass any calibrated ratio here, e.g. the action-attributable ratio of a full
and an action-ablated scorer, see planners/robot/scorer.py). The weight mixes the clipped
score with uniform,

    w_i = (1 - lam) + lam * clip(r_i, w_min, w_max),

with clip bounds taken from the spread of r (quantiles) unless fixed, and the head's
ordinary per-sample loss is reduced by self-normalised weighted regression
sum_i w_i l_i / sum_i w_i (``flow_matching.weighted_regression``; the trainer divides by
``unit_norm`` = w summed over the global minibatch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from flowrl._fields import hfield
from flowrl.algorithms.flow_matching import FlowMatching, FlowMatchingConfig, weighted_regression
from flowrl.registry import ALGORITHMS

Tensor = torch.Tensor

__all__ = ["PTRConfig", "PTR", "info_nce_loss", "posterior_scores", "clip_bounds", "ptr_weights",
           "weighted_regression", "effective_sample_size", "auroc"]


def info_nce_loss(logits: Tensor, target: Tensor) -> Tensor:
    """[B] cross-entropy of the true candidate's index; logits [B, K], target [B] long."""
    return F.cross_entropy(logits.float(), target.long(), reduction="none")


def posterior_scores(logits: Tensor, target: Tensor) -> Tensor:
    """[B] r = K * posterior of the true candidate (uniform posterior -> 1)."""
    k = logits.shape[-1]
    return k * torch.softmax(logits.float(), -1).gather(-1, target.long().view(-1, 1)).squeeze(-1)


def clip_bounds(r: Tensor, q_lo: float = 0.1, q_hi: float = 0.9) -> Tuple[float, float]:
    """(w_min, w_max) = quantiles of r: bounds that follow the scores' actual spread."""
    if not 0.0 <= q_lo < q_hi <= 1.0:
        raise ValueError("need 0 <= q_lo < q_hi <= 1")
    r = r.float().flatten()
    return float(torch.quantile(r, q_lo)), float(torch.quantile(r, q_hi))


def ptr_weights(r: Tensor, lam: float, w_min: float, w_max: float) -> Tensor:
    """w = (1 - lam) + lam * clip(r, w_min, w_max); r [B] -> w [B]."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError("lam must be in [0, 1]")
    if w_min > w_max:
        raise ValueError("w_min must be <= w_max")
    return (1.0 - lam) + lam * r.float().clamp(w_min, w_max)


def effective_sample_size(w: Tensor) -> float:
    """(sum w)^2 / sum w^2 divided by n: 1 = uniform, 1/n = one sample carries everything."""
    w = w.double().flatten()
    return float(w.sum() ** 2 / (w.pow(2).sum() * w.numel()).clamp(min=1e-300))


def auroc(score: Tensor, positive: Tensor) -> float:
    """Area under the ROC curve of ``score`` for ``positive`` (bool) vs the rest (ties count 1/2)."""
    s, p = score.double().flatten(), positive.bool().flatten()
    n_pos, n_neg = int(p.sum()), int((~p).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = torch.empty_like(s)
    order = torch.argsort(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    # average ranks over ties
    uniq, inv = torch.unique(s, return_inverse=True)
    sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, ranks)
    cnts = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, torch.ones_like(ranks))
    ranks = (sums / cnts)[inv]
    return float((ranks[p].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@dataclass
class PTRConfig(FlowMatchingConfig):
    """PTR-weighted flow / epsilon matching on an offline dataset with a PTR score column."""

    name: str = hfield("ptr", "algorithm name")
    score_key: str = hfield("ptr_score", "dataset column holding the PTR score r of each sample")
    lam: float = hfield(1.0, "mix between uniform (0) and the clipped PTR score (1)")
    q_lo: float = hfield(0.1, "lower clip bound = this quantile of r (when w_min is unset)")
    q_hi: float = hfield(0.9, "upper clip bound = this quantile of r (when w_max is unset)")
    w_min: Optional[float] = hfield(None, "fixed lower clip bound (None = quantile q_lo of the batch's r)")
    w_max: Optional[float] = hfield(None, "fixed upper clip bound (None = quantile q_hi of the batch's r)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError("algorithm.lam must be in [0, 1]")
        if not 0.0 <= self.q_lo < self.q_hi <= 1.0:
            raise ValueError("algorithm.q_lo / q_hi must satisfy 0 <= q_lo < q_hi <= 1")
        if self.w_min is not None and self.w_max is not None and self.w_min > self.w_max:
            raise ValueError("algorithm.w_min must be <= algorithm.w_max")
        if self.weight_key is not None:
            raise ValueError("algorithm.weight_key: PTR computes its own weights from score_key; leave weight_key unset")


class PTR(FlowMatching):
    """Flow matching whose per-sample weights are PTR weights of the ``score_key`` column.

    Set w_min / w_max from the whole dataset's r (``clip_bounds``) for weights that do not
    depend on the batch; unset, each batch's quantiles are used.
    """

    config: PTRConfig

    def make_offline_units(self, x0: Tensor, columns: Dict[str, Tensor]) -> Dict[str, Tensor]:
        c = self.config
        if c.score_key not in columns:
            raise ValueError(f"algorithm.score_key: the dataset has no column '{c.score_key}' (has {sorted(columns)}); "
                             "score the dataset with a transition scorer first")
        r = columns[c.score_key].float()
        lo, hi = clip_bounds(r, c.q_lo, c.q_hi)
        w = ptr_weights(r, c.lam, lo if c.w_min is None else c.w_min, hi if c.w_max is None else c.w_max)
        return {"sample_idx": torch.arange(x0.shape[0]), "x0": x0, "weight": w}


@ALGORITHMS.register("ptr", PTRConfig, help="PTR: posterior-transition reweighted offline flow / epsilon matching")
def build_ptr(config: PTRConfig) -> PTR:
    return PTR(config)
