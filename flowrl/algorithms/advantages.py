"""Group statistics and advantages (pure functions on globally gathered rewards).

values: [N] or [N, A] (per-agent); group_ids: [N] long; valid: like values, bool.
Statistics use only valid members; the std is the population std (ddof = 0), as in
Flow-GRPO. Groups with fewer than two valid members get zero advantage.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

Tensor = torch.Tensor


def _segments(group_ids: Tensor, like: Tensor) -> Tuple[Tensor, Tuple[int, ...]]:
    """(group index of each row [N], shape [G, *like.shape[1:]] of a per-group buffer)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max()) + 1 if inv.numel() else 0
    return inv, (g,) + tuple(like.shape[1:])


def group_stats(values: Tensor, group_ids: Tensor, valid: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Per-sample (group mean, group std, group valid count), each shaped like values."""
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    values = values.double()
    inv, shape = _segments(group_ids, values)
    w = valid.double()
    cnt = torch.zeros(shape, dtype=torch.float64).index_add_(0, inv, w)
    total = torch.zeros(shape, dtype=torch.float64).index_add_(0, inv, values * w)
    mean = total / cnt.clamp(min=1)
    sq = torch.zeros(shape, dtype=torch.float64).index_add_(0, inv, (values - mean[inv]) ** 2 * w)
    std = (sq / cnt.clamp(min=1)).sqrt()
    return mean[inv], std[inv], cnt[inv]


def group_normalize(
    values: Tensor, group_ids: Tensor, valid: Optional[Tensor] = None, *, std_eps: float = 1e-4,
    global_std: bool = False, clip: Optional[float] = None,
) -> Tensor:
    """Advantages A = (r - group mean) / (std + eps); std per group or global (valid only).

    Returns float32 like values; invalid entries and groups with < 2 valid members get 0.
    """
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    mean, std, cnt = group_stats(values, group_ids, valid)
    if global_std:
        v = values.double()[valid]
        std = torch.full_like(mean, float(v.std(unbiased=False)) if v.numel() > 1 else 0.0)
    adv = (values.double() - mean) / (std + std_eps)
    adv = torch.where(valid & (cnt >= 2), adv, torch.zeros_like(adv))
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return adv.float()


def group_all(mask: Tensor, group_ids: Tensor) -> Tensor:
    """Per-sample: True where every member of the sample's group is True. mask: [N] or [N, A]."""
    inv, shape = _segments(group_ids, mask)
    bad = torch.zeros(shape, dtype=torch.float64).index_add_(0, inv, (~mask).double())
    return bad[inv] == 0


def best_of_group(values: Tensor, group_ids: Tensor, valid: Optional[Tensor] = None, tol: float = 1e-9) -> Tensor:
    """Centred best-of-group indicator, like values (float32): 1/k - 1/n for each of the k
    valid members tied at the group's best reward, -1/n for the other valid members
    (n = valid members), 0 for invalid members and groups with fewer than 2.

    It sums to 0 over a group, so a best chosen at random has zero expected gradient:
    used as an advantage, it is the policy-gradient form of distilling best-of-n selection.
    """
    if valid is None:
        valid = torch.ones_like(values, dtype=torch.bool)
    v = values.double()
    inv, shape = _segments(group_ids, v)
    masked = torch.where(valid, v, torch.full_like(v, float("-inf")))
    index = inv.view(-1, *([1] * (v.ndim - 1))).expand_as(v)
    best = torch.full(shape, float("-inf"), dtype=torch.float64).scatter_reduce(0, index, masked, "amax")[inv]
    top = valid & (v >= best - tol)
    k = torch.zeros(shape, dtype=torch.float64).index_add_(0, inv, top.double())[inv]
    n = torch.zeros(shape, dtype=torch.float64).index_add_(0, inv, valid.double())[inv]
    out = top.double() / k.clamp(min=1) - 1.0 / n.clamp(min=1)
    return torch.where(valid & (n >= 2), out, torch.zeros_like(out)).float()


def zero_std_fraction(values: Tensor, group_ids: Tensor, valid: Optional[Tensor] = None, tol: float = 1e-6) -> float:
    """Fraction of groups whose valid rewards all coincide (no learning signal)."""
    _, std, _ = group_stats(values, group_ids, valid)
    _, first = _first_of_group(group_ids)
    s = std[first]
    return float((s <= tol).double().mean()) if s.numel() else 0.0


def _first_of_group(group_ids: Tensor) -> Tuple[Tensor, Tensor]:
    uniq, inv = torch.unique(group_ids, return_inverse=True)
    idx = torch.arange(len(group_ids))
    first = torch.full((len(uniq),), len(group_ids), dtype=torch.long).scatter_reduce(0, inv, idx, reduce="amin")
    return uniq, first


def per_reward_normalize(
    per_reward: Dict[str, Tensor], per_valid: Dict[str, Tensor], weights: Dict[str, float],
    group_ids: Tensor, *, std_eps: float = 1e-4,
) -> Tuple[Tensor, Tensor]:
    """Multi-reward balancing: normalise each reward within its groups, then sum with weights.

    A hard reward (small spread) is not drowned by an easy one (large spread).
    Returns (advantage [N], valid [N]): valid only where every weighted reward is valid.
    """
    total, valid = None, None
    for name, score in per_reward.items():
        w = float(weights.get(name, 1.0))
        if w == 0:
            continue
        v = per_valid[name]
        a = w * group_normalize(score, group_ids, v, std_eps=std_eps)
        total = a if total is None else total + a
        valid = v if valid is None else valid & v
    if total is None:
        raise ValueError("per_reward_normalize: every reward has weight 0")
    return torch.where(valid, total, torch.zeros_like(total)), valid
