"""Driving rewards and evaluation metrics: pure functions of executed-horizon records.

``dense_reward`` is SCORP's per-agent dense reward over an executed horizon:
    r = -w_c * collided + -w_o * off_road + w_p * normalised_progress
        (- w_ttc * frac(TTC < threshold) - w_comfort * frac(comfort violations))
with w_c = 8, w_o = 1, w_p = 4 by default. ``collided`` / ``off_road`` are 1 if it happened
at any tick of the horizon; progress is metres gained along the route divided by what
the agent's desired speed would have covered, clipped to [-1, 1.5].

``episode_metrics`` aggregates ``ChunkRecord``s of a whole episode into per-agent
averages (each agent that exists and is controlled counts once); ``episode_metric_pairs``
keeps each average's weight (agents or agent-ticks) so that averages of several batches
or processes stay exact, and ``metrics_by_kind`` splits them by scene kind.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Dict, Optional, Sequence, Tuple

import torch

Tensor = torch.Tensor


@dataclass
class RewardWeights:
    """Weights of the dense driving reward (SCORP's defaults; TTC and comfort off)."""

    collision: float = 8.0
    offroad: float = 1.0
    progress: float = 4.0
    ttc: float = 0.0
    comfort: float = 0.0
    progress_clip: float = 1.5  # normalised progress above this earns nothing more
    collisions: str = "any"  # which collisions are penalised: any, at_fault or at_fault_or_traffic (``sim``)

    @staticmethod
    def from_env(config) -> "RewardWeights":
        return RewardWeights(config.w_collision, config.w_offroad, config.w_progress, config.w_ttc, config.w_comfort,
                             getattr(config, "progress_clip", 1.5), getattr(config, "collision_reward", "any"))


def normalised_progress(progress: Tensor, expected: Tensor, clip: float = 1.5) -> Tensor:
    """[B, A] metres gained / metres expected at the desired speed, clipped to [-1, clip]."""
    return (progress / expected.clamp(min=1e-3)).clamp(-1.0, clip)


def dense_reward_terms(collision: Tensor, offroad: Tensor, progress: Tensor, expected: Tensor,
                       ttc_unsafe: Optional[Tensor] = None, comfort: Optional[Tensor] = None,
                       weights: RewardWeights = RewardWeights()) -> Tensor:
    """Per-agent dense reward [B, A].

    collision, offroad, ttc_unsafe, comfort: [B, A, E] bool per executed tick;
    progress, expected: [B, A] metres.
    """
    r = -weights.collision * collision.any(-1).float() - weights.offroad * offroad.any(-1).float()
    r = r + weights.progress * normalised_progress(progress, expected, weights.progress_clip)
    if ttc_unsafe is not None and weights.ttc:
        r = r - weights.ttc * ttc_unsafe.float().mean(-1)
    if comfort is not None and weights.comfort:
        r = r - weights.comfort * comfort.float().mean(-1)
    return r


def penalised_collisions(chunk, which: str = "any") -> Tensor:
    """[B, A, E] bool: the collisions of a ``sim.ChunkRecord`` that the reward penalises."""
    if which == "any":
        return chunk.collision
    if which == "at_fault":
        return chunk.collision_at_fault
    if which == "at_fault_or_traffic":
        return chunk.collision_at_fault | chunk.collision_by_traffic
    raise ValueError(f"unknown collision_reward {which!r}")


def dense_reward(chunk, config=None, weights: Optional[RewardWeights] = None) -> Tensor:
    """Dense reward [B, A] of a ``sim.ChunkRecord`` (weights from the env config or given)."""
    w = weights or (RewardWeights.from_env(config) if config is not None else RewardWeights())
    collision = penalised_collisions(chunk, w.collisions)
    return dense_reward_terms(collision, chunk.offroad, chunk.progress, chunk.expected, chunk.ttc_unsafe,
                              chunk.comfort, w)


def cat_records(chunks: Sequence):
    """Concatenate ``ChunkRecord``s along time (progress / expected are summed)."""
    first = chunks[0]
    out = {}
    for f in fields(first):
        vals = [getattr(c, f.name) for c in chunks]
        if f.name in ("progress", "expected"):
            out[f.name] = torch.stack(vals).sum(0)
        elif f.name == "valid":
            out[f.name] = vals[0]
        elif f.name == "pos":
            out[f.name] = torch.cat(vals, 2)
        else:
            out[f.name] = torch.cat(vals, -1)
    return type(first)(**out)


def _pair(x: Tensor, mask: Tensor) -> Tuple[float, float]:
    """(mean of x over mask, number of entries in mask); x and mask broadcast alike."""
    m = mask.float()
    n = float(m.sum())
    return float((x.float() * m).sum()) / max(n, 1.0), n


def episode_metric_pairs(record, s_start: Optional[Tensor] = None, s_end: Optional[Tensor] = None,
                         route_length: Optional[Tensor] = None,
                         expert_pos: Optional[Tensor] = None) -> Dict[str, Tuple[float, float]]:
    """``episode_metrics`` with each mean's weight: {name: (mean, weight)}, the weight being
    the number of agents (rates, progress, route completion) or agent-ticks (speed, TTC,
    comfort, ADE) averaged over."""
    v = record.valid
    vt = v[..., None].expand_as(record.speed)
    out = {
        "collision_rate": _pair(record.collision.any(-1), v),
        "at_fault_collision_rate": _pair(record.collision_at_fault.any(-1), v),
        "offroad_rate": _pair(record.offroad.any(-1), v),
        "avg_speed": _pair(record.speed, vt),
        "progress": _pair(normalised_progress(record.progress, record.expected), v),
        "ttc_unsafe_frac": _pair(record.ttc_unsafe, vt),
        "comfort_violation_frac": _pair(record.comfort, vt),
    }
    if s_start is not None and s_end is not None and route_length is not None:
        done = ((s_end - s_start) / (route_length - s_start).clamp(min=1.0)).clamp(0.0, 1.0)
        out["route_completion"] = _pair(done, v)
    if expert_pos is not None:
        err = (record.pos - expert_pos).norm(dim=-1)
        out["ade"] = _pair(err, vt)
    return out


def episode_metrics(record, s_start: Optional[Tensor] = None, s_end: Optional[Tensor] = None,
                    route_length: Optional[Tensor] = None, expert_pos: Optional[Tensor] = None) -> Dict[str, float]:
    """Per-agent averages over an episode ``record`` (a ``ChunkRecord`` over all E ticks).

    s_start, s_end, route_length: [B, A] for route completion; expert_pos [B, A, E, 2] the
    expert's positions at the same ticks for ADE. Returns
    collision_rate, at_fault_collision_rate, offroad_rate, avg_speed, progress (normalised), ttc_unsafe_frac,
    comfort_violation_frac, and route_completion / ade when their inputs are given.
    """
    pairs = episode_metric_pairs(record, s_start, s_end, route_length, expert_pos)
    return {k: mean for k, (mean, _) in pairs.items()}


KIND_METRICS = ("collision_rate", "at_fault_collision_rate", "offroad_rate", "avg_speed")


def metrics_by_kind(record, kind: Tensor, kinds: Sequence[str],
                    names: Sequence[str] = KIND_METRICS) -> Dict[str, Tuple[float, float]]:
    """{"<name>/<kind>": (mean, weight)} over the agents of the scenes of each kind.

    record: a ``ChunkRecord`` of B scenes; kind [B] long, an index into ``kinds``. Kinds
    with no valid agent in ``record`` are left out (weight 0)."""
    out = {}
    for k, label in enumerate(kinds):
        sub = replace(record, valid=record.valid & (kind.to(record.valid.device) == k)[:, None])
        if not bool(sub.valid.any()):
            continue
        pairs = episode_metric_pairs(sub)
        out.update({f"{name}/{label}": pairs[name] for name in names})
    return out
