"""Rule-based traffic, batched over scenes x agents: IDM, path leaders, gap acceptance at
conflict points, MOBIL lane changes. Pure functions of tensors.

Shapes: ``B`` scenes, ``N`` agents, ``K`` path samples ahead of each agent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import torch

from planners.driving.geometry import pairwise_sqdist

Tensor = torch.Tensor
INF = 1e6


def idm_accel(v: Tensor, v_lead: Tensor, gap: Tensor, params: Tensor) -> Tensor:
    """Intelligent Driver Model acceleration.

    v, v_lead, gap: [...] (gap = bumper-to-bumper metres; >= INF / 2 means no leader);
    params: [..., 5] (v0, T, a_max, b, s0). Returns [...]:
    a = a_max (1 - (v / v0)^4 - (s* / gap)^2),  s* = s0 + max(0, v T + v dv / (2 sqrt(a_max b))).
    """
    v0, t_head, a_max, b, s0 = params.unbind(-1)
    dv = v - v_lead
    s_star = s0 + (v * t_head + v * dv / (2 * (a_max * b).sqrt())).clamp(min=0.0)
    free = 1 - (v / v0.clamp(min=0.1)) ** 4
    inter = torch.where(gap < INF / 2, (s_star / gap.clamp(min=0.1)) ** 2, torch.zeros_like(gap))
    return a_max * (free - inter)


def idm_equilibrium_gap(v: float, params: Tuple[float, float, float, float, float]) -> float:
    """Closed-form steady-state gap behind a leader at the same constant speed v < v0:
    s_e = (s0 + v T) / sqrt(1 - (v / v0)^4)."""
    v0, t_head, _, _, s0 = params
    return (s0 + v * t_head) / (1 - (v / v0) ** 4) ** 0.5


@dataclass
class Leaders:
    """gap [B, N] to the nearest vehicle in the path ahead (INF if none), its speed along
    the path lead_speed [B, N], and in_path [B, N, N] (j is in i's path ahead)."""

    gap: Tensor
    lead_speed: Tensor
    in_path: Tensor


def path_leaders(path_xy: Tensor, path_h: Tensor, along: Tensor, pos: Tensor, heading: Tensor, speed: Tensor,
                 length: Tensor, alive: Tensor, lookahead: Tensor, threshold: float = 2.0) -> Leaders:
    """Vehicles near each agent's own future path count as leaders.

    path_xy [B, N, K, 2] / path_h [B, N, K]: samples of i's route ahead at distances
    along [K]; pos [B, N, 2], heading/speed/length [B, N]; alive [B, N] bool;
    lookahead [B, N] metres (samples beyond it are ignored, e.g. a short-sighted expert).
    j is in i's path if its centre is within ``threshold`` of a sample and in front of i.
    """
    b, n, k, _ = path_xy.shape
    d2 = pairwise_sqdist(path_xy.reshape(b, n * k, 2), pos).view(b, n, k, n)  # [B, i, K, j]
    near = (d2 < threshold**2) & (along[None, None, :, None] <= lookahead[:, :, None, None])
    ahead = ((pos[:, None, :, :] - pos[:, :, None, :]) * torch.stack([heading.cos(), heading.sin()], -1)[:, :, None]).sum(-1) > 0
    ok = alive[:, None, :] & alive[:, :, None] & ahead & ~torch.eye(n, dtype=torch.bool, device=pos.device)
    near = near & ok[:, :, None, :]
    # first sample near j (samples are sorted by distance): max of descending weights, a
    # uint8 max-reduction (much faster on CPU than argmax over a strided dim)
    w = torch.arange(k, 0, -1, device=pos.device).to(torch.uint8 if k < 256 else torch.int32)
    first = (near.to(w.dtype) * w[None, None, :, None]).amax(dim=2)  # k - k_first; 0 if none
    k_ij = (k - first.long()).clamp(max=k - 1)
    along_ij = torch.where(first > 0, along[k_ij], torch.full_like(speed[:, :, None].expand(-1, -1, n), INF))  # [B, i, j]
    in_path = along_ij < INF / 2
    gap_ij = torch.where(in_path, along_ij - 0.5 * (length[:, :, None] + length[:, None, :]), torch.full_like(along_ij, INF))
    gap, lead = gap_ij.min(dim=2)
    k_lead = torch.gather(k_ij, 2, lead[..., None])  # [B, N, 1]
    h_at = torch.gather(path_h, 2, k_lead).squeeze(-1)
    # refine the leader's gap: project it onto the path direction at the matched sample
    p_at = torch.gather(path_xy, 2, k_lead[..., None].expand(-1, -1, 1, 2)).squeeze(2)
    p_lead = torch.gather(pos, 1, lead[..., None].expand(-1, -1, 2))
    gap = gap + ((p_lead - p_at) * torch.stack([h_at.cos(), h_at.sin()], -1)).sum(-1)
    h_lead = torch.gather(heading, 1, lead)
    v_lead = torch.gather(speed, 1, lead) * torch.cos(h_lead - h_at)
    gap = torch.where(gap_ij.min(dim=2).values < INF / 2, gap, torch.full_like(gap, INF))
    return Leaders(gap, v_lead.clamp(min=0.0), in_path)


def conflict_gaps(path_xy: Tensor, along: Tensor, speed: Tensor, priority: Tensor, length: Tensor, alive: Tensor,
                  in_path: Tensor, critical_gap: float, rows: int = 0, b_stop: float = 6.0,
                  threshold: float = 3.0) -> Tensor:
    """Gap acceptance at conflict points (where two future paths cross or merge).

    path_xy [B, N, K, 2] at distances along [K]; speed/priority/length [B, N]; alive [B, N];
    in_path [B, N, N] from ``path_leaders`` (pairs already following each other are skipped).
    Agent i yields to j when j has right of way (a higher priority: main road, ring; or the
    same priority and an earlier arrival) and reaches the conflict point less than
    ``critical_gap`` seconds after i would, unless i can no longer stop before it.
    Only agents i >= ``rows`` are evaluated (background vehicles). Returns the gap
    [B, N - rows] to a virtual stopped leader before i's first such point (INF if none).
    """
    b, n, k, _ = path_xy.shape
    m = n - rows
    flat = path_xy.reshape(b, n * k, 2)
    hit = (pairwise_sqdist(flat[:, rows * k:], flat) < threshold**2).view(b, m, k, n, k)  # [B, i, k_i, j, k_j]
    hit_i = hit.any(-1).transpose(2, 3)  # [B, i, j, k_i]
    hit_j = hit.any(2)  # [B, i, j, k_j]
    big = torch.full((), INF, device=path_xy.device)
    s_i = torch.where(hit_i, along, big).min(-1).values  # [B, i, j]
    s_j = torch.where(hit_j, along, big).min(-1).values
    sl = slice(rows, n)
    conflict = (s_i < INF / 2) & alive[:, sl, None] & alive[:, None, :] & ~in_path[:, sl] & ~in_path.transpose(1, 2)[:, sl]
    idx = torch.arange(n, device=path_xy.device)
    conflict &= idx[None, rows:, None] != idx[None, None, :]
    t_i = s_i / speed[:, sl].clamp(min=3.0)[:, :, None]
    t_j = s_j / speed.clamp(min=0.5)[:, None, :]
    p_i, p_j = priority[:, sl, None], priority[:, None, :]
    first = (t_j < t_i) | ((t_j == t_i) & (idx[None, None, :] < idx[None, rows:, None]))
    right_of_way = (p_j > p_i) | ((p_j == p_i) & first)
    committed = s_i < (speed[:, sl] ** 2 / (2 * b_stop) + 0.5 * length[:, sl])[:, :, None]
    yield_ = conflict & right_of_way & (t_j < t_i + critical_gap) & ~committed
    gap = torch.where(yield_, s_i - threshold - 0.5 * length[:, sl, None], big)
    return gap.min(-1).values.clamp(min=0.1)


@dataclass
class LaneView:
    """Agents in highway lane coordinates: lon/lat [B, N] metres, lane [B, N] long."""

    lon: Tensor
    lat: Tensor
    lane: Tensor


def lane_view(pos: Tensor, origin: Tensor, direction: Tensor, lane_width: Tensor) -> LaneView:
    """pos [B, N, 2]; origin [B, 2], direction [B] heading of lane 0, lane_width [B]."""
    rel = pos - origin[:, None]
    u = torch.stack([direction.cos(), direction.sin()], -1)[:, None]
    n = torch.stack([-direction.sin(), direction.cos()], -1)[:, None]
    lon, lat = (rel * u).sum(-1), (rel * n).sum(-1)
    return LaneView(lon, lat, torch.round(lat / lane_width[:, None]).long())


def lane_neighbours(view: LaneView, lane: Tensor, alive: Tensor) -> Tuple[Tensor, Tensor]:
    """Leader and follower of each agent in lane ``lane`` [B, N] (by lon), as indices
    [B, N] (-1 if none)."""
    same = (view.lane[:, None, :] == lane[:, :, None]) & alive[:, None, :]
    n = view.lon.shape[1]
    same &= ~torch.eye(n, dtype=torch.bool, device=lane.device)
    dl = view.lon[:, None, :] - view.lon[:, :, None]  # lon_j - lon_i
    ahead = torch.where(same & (dl > 0), dl, torch.full_like(dl, INF))
    behind = torch.where(same & (dl <= 0), -dl, torch.full_like(dl, INF))
    la, li = ahead.min(-1)
    fb, fi = behind.min(-1)
    return torch.where(la < INF / 2, li, -1), torch.where(fb < INF / 2, fi, -1)


def _pair_gap_speed(view: LaneView, speed: Tensor, length: Tensor, rear: Tensor, front: Tensor) -> Tuple[Tensor, Tensor]:
    """Bumper gap and front speed between index tensors rear/front [B, N] (-1 = none)."""
    ok = (rear >= 0) & (front >= 0)
    r, f = rear.clamp(min=0), front.clamp(min=0)
    g = lambda x, i: torch.gather(x, 1, i)  # noqa: E731
    gap = g(view.lon, f) - g(view.lon, r) - 0.5 * (g(length, f) + g(length, r))
    return torch.where(ok, gap, torch.full_like(gap, INF)), torch.where(ok, g(speed, f), torch.zeros_like(gap))


def mobil(view: LaneView, speed: Tensor, length: Tensor, params: Tensor, alive: Tensor, can_change: Tensor,
          num_lanes: Tensor, politeness: float = 0.3, threshold: float = 0.2, b_safe: float = 4.0,
          keep_right: float = 0.1) -> Tensor:
    """MOBIL lane-change decisions: -1 (right), 0 (stay), +1 (left) per agent [B, N] long.

    Change if the new follower stays safe (its IDM accel > -b_safe, no overlap) and
    a_i_new - a_i_old + politeness (a_f_new - a_f_old) > threshold (minus a small bonus
    for moving right). ``params`` [B, N, 5] IDM; ``can_change`` [B, N] bool.
    """
    n_idx = torch.arange(view.lon.shape[1], device=speed.device).expand_as(view.lane)
    lead_cur, _ = lane_neighbours(view, view.lane, alive)
    gap_cur, v_cur = _pair_gap_speed(view, speed, length, n_idx, lead_cur)
    a_cur = idm_accel(speed, v_cur, gap_cur, params)
    best = torch.zeros_like(view.lane)
    best_gain = torch.zeros_like(speed)
    for d in (-1, 1):
        target = view.lane + d
        valid = can_change & (target >= 0) & (target < num_lanes[:, None])
        lead, foll = lane_neighbours(view, target, alive)
        gap_i, v_l = _pair_gap_speed(view, speed, length, n_idx, lead)
        a_new = idm_accel(speed, v_l, gap_i, params)
        gap_f_new, _ = _pair_gap_speed(view, speed, length, foll, n_idx)
        gap_f_old, v_fl = _pair_gap_speed(view, speed, length, foll, lead)
        pf = torch.gather(params, 1, foll.clamp(min=0)[..., None].expand(-1, -1, params.shape[-1]))
        vf = torch.gather(speed, 1, foll.clamp(min=0))
        af_new = torch.where(foll >= 0, idm_accel(vf, speed, gap_f_new, pf), torch.zeros_like(speed))
        af_old = torch.where(foll >= 0, idm_accel(vf, v_fl, gap_f_old, pf), torch.zeros_like(speed))
        safe = (af_new > -b_safe) & (gap_i > 2.0) & (gap_f_new > 2.0)
        gain = a_new - a_cur + politeness * (af_new - af_old) + (keep_right if d < 0 else -keep_right)
        take = valid & safe & (gain > threshold) & (gain > best_gain)
        best = torch.where(take, torch.full_like(best, d), best)
        best_gain = torch.where(take, gain, best_gain)
    return best
