"""Batched, vectorised closed-loop driving simulator (torch, CPU or GPU).

``DrivingEnv`` implements ``flowrl.mdp.Environment``:

    env = DrivingEnv(DrivingEnvConfig(), device="cpu")
    state = env.reset(batch, seeds)            # batch: any sequence of len B (ignored) or a Scene
    obs = env.observe(state)                   # a Scene (sequence of B scenes) at the current time
    state, reward, done = env.step(state, controls)   # controls [B, A, H, 2] physical (accel, steer)

Per 0.1 s tick: controlled agents move by the kinematic bicycle model (``dynamics``);
background vehicles follow their route centreline with IDM, yield at conflict points
(gap acceptance) and change lanes with MOBIL on highways. After each tick the
controlled agents are checked for collisions (oriented boxes, separating axis test
against every other vehicle), leaving the road (a box corner farther from every lane
centreline than half a lane width) and route progress. ``env.step`` executes the first
``execute_steps`` controls of a chunk and returns the per-agent dense reward
(``metrics.dense_reward``) over them; per-tick records are in ``state.last_chunk``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from flowrl._fields import hfield
from planners.driving import geometry as geo
from planners.driving import traffic
from planners.driving.dynamics import bicycle_step, wheelbase_of
from planners.driving.scenes import DT, SCENE_KINDS, Scene, SceneConfig, make_scene, make_scenes

Tensor = torch.Tensor


@dataclass
class DrivingEnvConfig:
    """The closed-loop driving environment."""

    name: str = hfield("driving", "environment name")
    scene: SceneConfig = hfield(default_factory=SceneConfig, help="procedural scene generation")
    episode_steps: int = hfield(80, "simulator ticks per episode (10 Hz)")
    execute_steps: int = hfield(5, "ticks of each planned chunk executed before replanning (5 = 2 Hz)")
    accel_limits: Tuple[float, float] = hfield((-8.0, 6.0), "clamp of controlled accelerations (m/s^2)")
    steer_limit: float = hfield(0.7, "clamp of controlled steering angles (rad)")
    bg_lookahead: float = hfield(40.0, "background path lookahead for leaders (m)")
    path_samples: int = hfield(16, "samples of each route ahead (leaders; every third one for conflicts)")
    critical_gap: float = hfield(2.5, "gap acceptance: seconds a yielding vehicle wants before the priority one")
    lane_change_every: int = hfield(5, "ticks between MOBIL decisions")
    lane_change_time: float = hfield(1.0, "time constant (s) of the lateral move of a lane change")
    lane_change_cooldown: float = hfield(4.0, "seconds before a vehicle may change lane again")
    offroad_candidates: int = hfield(24, "lane segments nearest to a vehicle tested against its corners")
    offroad_tolerance: float = hfield(0.0, "metres a corner may exceed half the lane width before off-road")
    ttc_threshold: float = hfield(1.5, "time-to-collision (s) counted as unsafe")
    w_collision: float = hfield(8.0, "reward weight of a collision in the executed horizon (SCORP)")
    collision_reward: str = hfield("any", "collisions the reward penalises: any (SCORP: both vehicles), at_fault "
                                          "(not a vehicle hit from behind) or at_fault_or_traffic (also one hit from "
                                          "behind by background traffic, which a cut-in causes); metrics count every collision")
    w_offroad: float = hfield(1.0, "reward weight of leaving the road in the executed horizon (SCORP)")
    w_progress: float = hfield(4.0, "reward weight of normalised progress (SCORP)")
    w_ttc: float = hfield(0.0, "reward weight of the fraction of ticks with TTC below ttc_threshold")
    w_comfort: float = hfield(0.0, "reward weight of the fraction of ticks with comfort violations")
    progress_clip: float = hfield(1.5, "normalised progress (metres gained / metres at the desired speed) is clipped "
                                       "to [-1, progress_clip] in the reward (1 = no reward for exceeding the desired speed)")
    candidates_per_state: int = hfield(10, "closed-loop training (SCORP): G candidate chunks are planned per state, "
                                           "scored by simulating each from a copy of the state, the best is executed "
                                           "and all G form the group (0 = groups of whole episodes)")
    score_steps: int = hfield(0, "ticks each candidate chunk is simulated to score it (0 = the whole chunk; "
                                 "at most the planner's horizon)")
    expert_seed: int = hfield(0, "seed of the expert run on evaluation scenes (ADE to the expert)")
    render_scenes: int = hfield(3, "evaluation scenes drawn to before/after GIFs (0 = none)")
    scene_cache: int = hfield(4096, "scenes kept in memory by seed (0 = regenerate every reset)")

    def __post_init__(self) -> None:
        if isinstance(self.scene, dict):
            self.scene = SceneConfig(**self.scene)
        if self.execute_steps < 1 or self.episode_steps < self.execute_steps:
            raise ValueError("env.execute_steps must be in [1, episode_steps]")
        if self.candidates_per_state < 0 or self.score_steps < 0:
            raise ValueError("env.candidates_per_state and env.score_steps must be >= 0")
        if self.collision_reward not in COLLISION_REWARDS:
            raise ValueError(f"env.collision_reward must be one of {COLLISION_REWARDS}")
        if self.candidates_per_state == 1:
            raise ValueError("env.candidates_per_state: use 0 (episode groups) or >= 2 (per-state groups)")

    @property
    def num_env_steps(self) -> int:
        """Outer (replanning) steps per episode: ceil(episode_steps / execute_steps)."""
        return -(-self.episode_steps // self.execute_steps)


COLLISION_REWARDS = ("any", "at_fault", "at_fault_or_traffic")


@dataclass
class ChunkRecord:
    """Per-tick records of the controlled slots over one executed chunk (``E`` ticks).

    collision/collision_at_fault/collision_by_traffic (``collision_blame``; hit from behind by a
    background vehicle)/offroad/ttc_unsafe/comfort: [B, A, E] bool;
    speed/accel/curvature: [B, A, E];
    pos: [B, A, E, 2]; progress: [B, A] metres gained; expected: [B, A] metres at the
    agent's desired speed (normaliser of progress); valid: [B, A] controlled and present.
    """

    collision: Tensor
    collision_at_fault: Tensor
    collision_by_traffic: Tensor
    offroad: Tensor
    ttc_unsafe: Tensor
    comfort: Tensor
    speed: Tensor
    accel: Tensor
    curvature: Tensor
    pos: Tensor
    progress: Tensor
    expected: Tensor
    valid: Tensor


@dataclass
class SimState:
    """Dynamic state of B scenes with N vehicles each (static data in ``scene``).

    pos [B, N, 2], heading/speed/s/lat/cooldown [B, N], route_id [B, N] long into the
    route bank [B, N + L, R, 4] (own routes, then highway lane routes), alive [B, N],
    history [B, N, T, 8], tick [B] long, last_chunk: the latest executed ``ChunkRecord``.
    """

    scene: Scene
    bank: Tensor
    pos: Tensor
    heading: Tensor
    speed: Tensor
    s: Tensor
    lat: Tensor
    cooldown: Tensor
    route_id: Tensor
    alive: Tensor
    history: Tensor
    tick: Tensor
    last_chunk: Optional[ChunkRecord] = None
    s_start: Optional[Tensor] = None
    episode: Optional[ChunkRecord] = None
    trace: Optional[list] = None

    @property
    def num_slots(self) -> int:
        return self.scene.num_slots

    def controlled_state(self) -> Tensor:
        """[B, A, 4] (x, y, heading, speed) of the controlled slots."""
        a = self.num_slots
        return torch.cat([self.pos[:, :a], self.heading[:, :a, None], self.speed[:, :a, None]], -1)


# --------------------------------------------------------------------------- route lookups
def route_points(bank: Tensor, route_id: Tensor, s: Tensor, spacing: float) -> Tensor:
    """Interpolated route features at progress s.

    bank [B, Q, R, 4]; route_id [B, N] long; s [B, N, K] metres -> [B, N, K, 4]
    (x, y, heading, priority), clamped to the route's ends.
    """
    b, q, r, f = bank.shape
    flat = bank.reshape(-1, f)
    base = ((torch.arange(b, device=bank.device)[:, None] * q + route_id) * r)[..., None]
    x = (s / spacing).clamp(0.0, r - 1.0)
    i0 = x.floor().long().clamp(max=r - 2)
    w = (x - i0).clamp(0.0, 1.0).unsqueeze(-1)
    p0, p1 = flat[base + i0], flat[base + i0 + 1]
    out = p0 + w * (p1 - p0)
    head = p0[..., 2] + w[..., 0] * geo.wrap_angle(p1[..., 2] - p0[..., 2])
    return torch.cat([out[..., :2], head[..., None], out[..., 3:]], -1)


def project_on_route(bank: Tensor, route_id: Tensor, s_prev: Tensor, pos: Tensor, spacing: float,
                     back: int = 3, ahead: int = 8) -> Tensor:
    """Progress s [B, N] of pos [B, N, 2] near the previous progress s_prev [B, N] (a local
    window, so loops such as a roundabout never jump)."""
    offs = torch.arange(-back, ahead + 1, device=pos.device, dtype=pos.dtype) * spacing
    cand_s = (torch.floor(s_prev / spacing) * spacing)[..., None] + offs
    pts = route_points(bank, route_id, cand_s.clamp(min=0.0), spacing)
    d = (pts[..., :2] - pos[:, :, None]).norm(dim=-1)
    k = d.argmin(-1, keepdim=True)
    p = torch.gather(pts, 2, k[..., None].expand(-1, -1, 1, 4)).squeeze(2)
    along = ((pos - p[..., :2]) * torch.stack([p[..., 2].cos(), p[..., 2].sin()], -1)).sum(-1)
    return (torch.gather(cand_s.clamp(min=0.0), 2, k).squeeze(2) + along).clamp(min=0.0)


# --------------------------------------------------------------------------- checks
def collision_pairs(pos: Tensor, heading: Tensor, length: Tensor, width: Tensor, alive: Tensor, a: int) -> Tensor:
    """[B, A, N] bool: controlled slot i's box overlaps present vehicle j's box (j != i)."""
    n = pos.shape[1]
    ov = geo.boxes_overlap(pos[:, :a, None], heading[:, :a, None], length[:, :a, None], width[:, :a, None],
                           pos[:, None], heading[:, None], length[:, None], width[:, None])
    ov &= alive[:, :a, None] & alive[:, None, :]
    ov &= ~torch.eye(a, n, dtype=torch.bool, device=pos.device)
    return ov


def partner_ahead(pos: Tensor, heading: Tensor, a: int) -> Tensor:
    """[B, A, N] bool: vehicle j's centre is not behind slot i's centre (along i's heading)."""
    rel = pos[:, None] - pos[:, :a, None]  # [B, A, N, 2]
    fwd = torch.stack([heading[:, :a].cos(), heading[:, :a].sin()], -1)[:, :, None]
    return (rel * fwd).sum(-1) >= 0


def collision_blame(pairs: Tensor, pos: Tensor, heading: Tensor, background: Tensor) -> Tuple[Tensor, Tensor]:
    """([B, A] at fault, [B, A] hit by traffic) bool for the controlled slots.

    pairs [B, A, N] from ``collision_pairs``; pos [B, N, 2], heading [B, N]; background [B, N].
    At fault: slot i collides with a vehicle whose centre is not behind i's centre. A vehicle
    hit only from behind (every partner's centre has a negative coordinate along i's heading)
    is not at fault: the rule of thumb of rear-end blame (nuPlan also scores at-fault
    collisions). Hit by traffic: a background vehicle hits slot i from behind. Background
    traffic follows IDM, so it rear-ends a planned vehicle only after a cut-in too close in
    front of it or braking harder than it can follow: the planned vehicle's doing.
    """
    ahead = partner_ahead(pos, heading, pairs.shape[1])
    return (pairs & ahead).any(-1), (pairs & ~ahead & background[:, None]).any(-1)


def offroad(pos: Tensor, heading: Tensor, length: Tensor, width: Tensor, seg_a: Tensor, seg_b: Tensor,
            seg_hw: Tensor, candidates: int = 24, tolerance: float = 0.0) -> Tensor:
    """[B, V] bool: a box corner is farther than half a lane width from every lane segment.

    pos [B, V, 2], heading/length/width [B, V]; segments from ``geometry.segments_of``
    (a, b [B, S, 2], half width hw [B, S]). Only the ``candidates`` segments nearest the
    box centre are tested against its corners (exact unless lanes are very dense).
    """
    mid, half = 0.5 * (seg_a + seg_b), 0.5 * (seg_b - seg_a).norm(dim=-1)
    # lower bound of the centre's distance to each segment, for picking candidates
    lb = geo.pairwise_sqdist(pos, mid).clamp(min=0.0).sqrt() - half[:, None] - seg_hw[:, None]  # [B, V, S]
    k = min(candidates, lb.shape[-1])
    idx = lb.topk(k, dim=-1, largest=False).indices  # [B, V, k]
    gather = lambda t: torch.gather(t[:, None].expand(-1, idx.shape[1], -1, *t.shape[2:]), 2,  # noqa: E731
                                    idx.view(*idx.shape, *([1] * (t.ndim - 2))).expand(*idx.shape, *t.shape[2:]))
    a, b, hw = gather(seg_a), gather(seg_b), gather(seg_hw)  # [B, V, k, (2)]
    corners = geo.box_corners(pos, heading, length, width)  # [B, V, 4, 2]
    d = geo.point_segment_distance(corners[:, :, :, None], a[:, :, None], b[:, :, None]) - hw[:, :, None]
    return (d.min(-1).values > tolerance).any(-1)


def time_to_collision(pos: Tensor, vel: Tensor, radius: Tensor, alive: Tensor, a: int, horizon: float = 10.0) -> Tensor:
    """[B, A] smallest time until the discs (radius [B, N]) of controlled slot i and any other
    vehicle touch, under constant velocities (vel [B, N, 2]); ``horizon`` if never; 0 if touching."""
    n = pos.shape[1]
    p = pos[:, None] - pos[:, :a, None]  # [B, A, N, 2]
    w = vel[:, None] - vel[:, :a, None]
    r = radius[:, :a, None] + radius[:, None]
    aa = (w * w).sum(-1)
    bb = 2 * (p * w).sum(-1)
    cc = (p * p).sum(-1) - r * r
    disc = bb * bb - 4 * aa * cc
    t = (-bb - disc.clamp(min=0).sqrt()) / (2 * aa).clamp(min=1e-9)
    t = torch.where((disc >= 0) & (t >= 0) & (aa > 1e-9), t, torch.full_like(t, horizon))
    t = torch.where(cc <= 0, torch.zeros_like(t), t)
    t = t.masked_fill(~(alive[:, :a, None] & alive[:, None]), horizon)
    t = t.masked_fill(torch.eye(a, n, dtype=torch.bool, device=pos.device), horizon)
    return t.min(-1).values.clamp(max=horizon)


# --------------------------------------------------------------------------- the environment
class DrivingEnv:
    """Batched closed-loop driving world (``flowrl.mdp.Environment``)."""

    def __init__(self, config: Optional[DrivingEnvConfig] = None, device: Any = "cpu"):
        self.config = config or DrivingEnvConfig()
        self.device = torch.device(device)
        self.along = torch.linspace(0.0, self.config.bg_lookahead, self.config.path_samples, device=self.device)
        self._scene_cache: Dict[int, Scene] = {}
        self._expert_cache: Dict[Any, Tensor] = {}

    # ---- Environment protocol
    def reset(self, batch: Sequence[Any], seeds: Sequence[int]) -> SimState:
        """One episode per item. ``batch`` may be a ``Scene`` (used as is) or items: an int
        item is the scene's seed (the driving data sources hand out scene seeds), any other
        item takes its scene from ``seeds``."""
        if isinstance(batch, Scene):
            return self.reset_scene(batch)
        ids = [int(i) if isinstance(i, int) else int(s) for i, s in zip(batch, seeds)]
        return self.reset_scene(self.scenes(ids))

    def scenes(self, seeds: Sequence[int]) -> Scene:
        """``make_scenes(seeds)`` through a per-seed cache (scene generation is pure Python)."""
        if not self.config.scene_cache:
            return make_scenes(list(seeds), self.config.scene)
        cache = self._scene_cache
        for s in seeds:
            if s not in cache:
                if len(cache) >= self.config.scene_cache:
                    cache.pop(next(iter(cache)))
                cache[s] = make_scene(s, self.config.scene)
        return Scene.stack([cache[s] for s in seeds])

    def observe(self, state: SimState) -> Scene:
        """The scenes at the current time (history = last T ticks, route_s = progress)."""
        return state.scene.replace(agents=state.history, agent_mask=state.alive, route_s=state.s)

    @torch.no_grad()
    def step(self, state: SimState, action: Tensor) -> Tuple[SimState, Tensor, Tensor]:
        """Execute the first ``execute_steps`` of controls [B, A, H, 2] (physical units).

        Returns (state, reward [B, A] (0 on empty slots), done [B] bool)."""
        from planners.driving.metrics import cat_records, dense_reward

        e = min(self.config.execute_steps, action.shape[2])
        s_before = state.s[:, : state.num_slots].clone()
        seg = self.segments(state.scene)
        trace = list(state.trace or [])
        recs = []
        for k in range(e):
            state, rec = self.tick(state, action[:, :, k].to(self.device), seg)
            recs.append(rec)
            trace.append((state.pos, state.heading, state.alive, rec["collision"]))
        chunk = stack_records(recs, state, self.config, s_before)
        episode = chunk if state.episode is None else cat_records([state.episode, chunk])
        state = replace(state, last_chunk=chunk, episode=episode, trace=trace)
        reward = dense_reward(chunk, self.config) * chunk.valid
        done = state.tick >= self.config.episode_steps
        return state, reward, done

    def check_head(self, head) -> None:
        """Called by the trainer once the head is built: a chunk must cover the ticks this
        environment executes and scores (ConfigError otherwise)."""
        from flowrl.registry import ConfigError

        horizon = head.config.planner.horizon
        for key in ("execute_steps", "score_steps"):
            if getattr(self.config, key) > horizon:
                raise ConfigError(f"env.{key}={getattr(self.config, key)} is longer than the planner's "
                                  f"{horizon}-tick chunk; set env.{key} <= {horizon}")

    # ---- per-state candidate groups (flowrl.mdp.ClosedLoop, candidates_per_state)
    @torch.no_grad()
    def score_candidates(self, state: SimState, actions: Tensor, num_candidates: int) -> Tuple[Tensor, Tensor]:
        """Score G candidate chunks per scene by simulating each from a copy of the state.

        actions [B * G, A, H, 2] physical, candidate-major within a scene (rows b*G .. b*G+G-1
        belong to scene b). Each copy runs ``score_steps`` ticks (0 = the whole chunk) with
        the same background traffic model (deterministic), so the best candidate's first
        ``execute_steps`` ticks are exactly what ``step`` then executes. Returns the dense
        per-agent reward over the simulated ticks [B * G, A] and its validity [B * G, A]
        (controlled slot in use and the scene's episode not over).
        """
        from planners.driving.metrics import dense_reward

        g = int(num_candidates)
        copy = expand_state(state, g)
        steps = min(self.config.score_steps or actions.shape[2], actions.shape[2])
        seg = self.segments(copy.scene)
        s_before = copy.s[:, : copy.num_slots].clone()
        recs = []
        for k in range(steps):
            copy, rec = self.tick(copy, actions[:, :, k].to(self.device), seg)
            recs.append(rec)
        chunk = stack_records(recs, copy, self.config, s_before)
        valid = chunk.valid & (state.tick < self.config.episode_steps).repeat_interleave(g)[:, None]
        return dense_reward(chunk, self.config) * valid, valid

    # ---- evaluation hooks (flowrl's closed-loop evaluation calls them when present)
    @torch.no_grad()
    def episode_metrics(self, state: SimState) -> Dict[str, Tuple[float, float]]:
        """Per-agent averages over the executed episodes of ``state``, each with its weight
        (``metrics.episode_metric_pairs``): collision_rate, at_fault_collision_rate,
        offroad_rate, avg_speed, progress, ttc_unsafe_frac, comfort_violation_frac,
        route_completion and ade (to the expert driving the same scenes from the same start,
        ``expert_seed``); then collision, at-fault, off-road and speed per scene kind
        (``collision_rate/highway``, ...; ``metrics.metrics_by_kind``)."""
        from planners.driving.metrics import episode_metric_pairs, metrics_by_kind

        rec = state.episode
        if rec is None:
            return {}
        a = state.num_slots
        expert = self.expert_positions(state.scene, rec.pos.shape[2])
        out = episode_metric_pairs(rec, s_start=state.s_start, s_end=state.s[:, :a],
                                   route_length=state.scene.route_length[:, :a], expert_pos=expert)
        return {**out, **metrics_by_kind(rec, state.scene.kind, SCENE_KINDS)}

    def expert_positions(self, scene: Scene, ticks: int) -> Tensor:
        """[B, A, ticks, 2] positions of the controlled agents when the expert drives the scenes."""
        from planners.driving.expert import run_expert

        key = (tuple(int(s) for s in scene.seed.tolist()), ticks)
        if key not in self._expert_cache:
            if len(self._expert_cache) > 8:
                self._expert_cache.clear()
            _, out = run_expert(self, self.reset_scene(scene), ticks, seed=self.config.expert_seed)
            self._expert_cache[key] = out["ctrl_states"][:, :, 1:, :2]
        return self._expert_cache[key]

    def save_rollouts(self, state: SimState, directory: str, tag: str) -> List[str]:
        """Draw the first ``render_scenes`` executed episodes to ``directory/rollouts/<tag>-scene<seed>.gif``
        (controlled vehicles blue, red while colliding; background green). Returns the paths."""
        from planners.driving.render import render, save_gif

        n = min(self.config.render_scenes, len(state.scene))
        if not n or not state.trace:
            return []
        out_dir = os.path.join(directory, "rollouts")
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for i in range(n):
            ctrl = state.scene.controlled[i, : state.num_slots]
            centre = state.trace[0][0][i, : state.num_slots][ctrl].mean(0) if bool(ctrl.any()) else None
            frames = []
            for pos, heading, alive, col in state.trace:
                view = replace(state, pos=pos[i:i + 1], heading=heading[i:i + 1], alive=alive[i:i + 1],
                               scene=state.scene[i])
                frames.append(render(view, 0, size=360, center=centre, flags=col[i]))
            path = os.path.join(out_dir, f"{tag}-scene{int(state.scene.seed[i])}.gif")
            save_gif(frames, path)
            frames[-1].save(path[:-4] + "-last.png")
            paths.append(path)
        return paths

    # ---- internals
    def reset_scene(self, scene: Scene) -> SimState:
        scene = scene.to(self.device)
        b, n = scene.agent_mask.shape
        last = scene.agents[:, :, -1]
        bank = torch.cat([scene.routes, scene.lane_routes], 1)
        route_id = torch.arange(n, device=self.device).expand(b, n).clone()
        on_lane = scene.lane_index >= 0
        route_id = torch.where(on_lane, n + scene.lane_index.clamp(min=0), route_id)
        speed = last[..., 3:5].norm(dim=-1)
        return SimState(
            scene=scene, bank=bank, pos=last[..., :2].clone(), heading=last[..., 2].clone(), speed=speed,
            s=scene.route_s.clone(), lat=torch.zeros_like(speed), cooldown=torch.zeros_like(speed),
            route_id=route_id, alive=scene.agent_mask.clone(), history=scene.agents.clone(),
            tick=torch.zeros(b, dtype=torch.long, device=self.device), s_start=scene.route_s[:, : scene.num_slots].clone(),
        )

    def segments(self, scene: Scene) -> Tuple[Tensor, Tensor, Tensor]:
        return geo.segments_of(scene.polylines[..., :2], scene.polyline_mask, scene.polylines[..., 0, 4])

    def tick(self, state: SimState, controls: Tensor, segments=None) -> Tuple[SimState, Dict[str, Tensor]]:
        """Advance every scene by one 0.1 s tick; controls [B, A, 2] for the controlled slots."""
        cfg, sc = self.config, state.scene
        a, sp = sc.num_slots, cfg.scene.route_spacing
        length, width = sc.agents[:, :, -1, 5], sc.agents[:, :, -1, 6]
        ctrl = state.alive & sc.controlled
        bg = state.alive & ~sc.controlled
        # -- background accelerations from the current (pre-move) state
        bg_acc, decision = self.background_accel(state, length)
        # -- controlled: bicycle model
        lo, hi = cfg.accel_limits
        u = torch.stack([controls[..., 0].clamp(lo, hi), controls[..., 1].clamp(-cfg.steer_limit, cfg.steer_limit)], -1)
        x0 = torch.cat([state.pos[:, :a], state.heading[:, :a, None], state.speed[:, :a, None]], -1)
        x1 = bicycle_step(x0, u, wheelbase_of(length[:, :a]))
        keep = ctrl[:, :a, None]
        x1 = torch.where(keep, x1, x0)
        # -- background: IDM along the route, lateral offset decays after a lane change
        v_new = (state.speed + bg_acc * DT).clamp(min=0.0)
        s_bg = state.s + 0.5 * (state.speed + v_new) * DT
        route_id, lat, cooldown = state.route_id, state.lat, (state.cooldown - DT).clamp(min=0.0)
        if decision is not None:
            route_id, lat, cooldown = self.apply_lane_changes(state, decision, route_id, lat, cooldown)
        lat = lat * torch.exp(torch.tensor(-DT / cfg.lane_change_time))
        pts = route_points(state.bank, route_id, s_bg[..., None], sp)[:, :, 0]
        nrm = torch.stack([-pts[..., 2].sin(), pts[..., 2].cos()], -1)
        bg_pos = pts[..., :2] + lat[..., None] * nrm
        bg_head = pts[..., 2] - torch.atan2(lat * (1 - torch.exp(torch.tensor(-DT / cfg.lane_change_time))),
                                             (v_new * DT).clamp(min=1e-3))
        pos = torch.where(bg[..., None], bg_pos, state.pos)
        heading = torch.where(bg, bg_head, state.heading)
        speed = torch.where(bg, v_new, state.speed)
        s = torch.where(bg, s_bg, state.s)
        pos = torch.cat([x1[..., :2], pos[:, a:]], 1)
        heading = torch.cat([x1[..., 2], heading[:, a:]], 1)
        speed = torch.cat([x1[..., 3], speed[:, a:]], 1)
        s_ctrl = project_on_route(state.bank, route_id[:, :a], state.s[:, :a], pos[:, :a], sp)
        s = torch.cat([torch.where(ctrl[:, :a], s_ctrl, s[:, :a]), s[:, a:]], 1)
        # background vehicles leave at the end of their route
        alive = state.alive & ~(bg & (s > sc.route_length + 10.0))
        vel = speed[..., None] * torch.stack([heading.cos(), heading.sin()], -1)
        now = torch.cat([pos, heading[..., None], vel, length[..., None], width[..., None], alive[..., None].float()], -1)
        now = now * alive[..., None]
        history = torch.cat([state.history[:, :, 1:], now[:, :, None]], 2)
        new = replace(state, pos=pos, heading=heading, speed=speed, s=s, lat=lat, cooldown=cooldown,
                      route_id=route_id, alive=alive, history=history, tick=state.tick + 1)
        # -- checks for the controlled slots
        seg = segments if segments is not None else self.segments(sc)
        pairs = collision_pairs(pos, heading, length, width, alive, a)
        fault, by_traffic = collision_blame(pairs, pos, heading, bg)
        rec = {
            "collision": pairs.any(-1) & ctrl[:, :a],
            "collision_at_fault": fault & ctrl[:, :a],
            "collision_by_traffic": by_traffic & ctrl[:, :a],
            "offroad": offroad(pos[:, :a], heading[:, :a], length[:, :a], width[:, :a], *seg,
                               candidates=cfg.offroad_candidates, tolerance=cfg.offroad_tolerance) & ctrl[:, :a],
            "ttc": time_to_collision(pos, vel, 0.5 * width + 0.5, alive, a),
            "speed": speed[:, :a], "accel": u[..., 0] * keep[..., 0],
            "curvature": torch.tan(u[..., 1]) / wheelbase_of(length[:, :a]) * keep[..., 0],
            "pos": pos[:, :a], "s": s[:, :a],
        }
        return new, rec

    def background_accel(self, state: SimState, length: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        """IDM accelerations [B, N] (leader in path, conflict yielding) and MOBIL decisions."""
        cfg, sc = self.config, state.scene
        sp = cfg.scene.route_spacing
        path = route_points(state.bank, state.route_id, state.s[..., None] + self.along, sp)  # [B, N, K, 4]
        look = torch.full_like(state.speed, cfg.bg_lookahead)
        lead = traffic.path_leaders(path[..., :2], path[..., 2], self.along, state.pos, state.heading, state.speed,
                                    length, state.alive, look)
        prio = path[:, :, 0, 3]
        a = sc.num_slots
        cgap = traffic.conflict_gaps(path[:, :, ::3, :2], self.along[::3], state.speed, prio, length, state.alive,
                                     lead.in_path, cfg.critical_gap, rows=a)
        cgap = torch.cat([torch.full_like(state.speed[:, :a], traffic.INF), cgap], 1)
        acc = torch.minimum(traffic.idm_accel(state.speed, lead.lead_speed, lead.gap, sc.idm),
                            traffic.idm_accel(state.speed, torch.zeros_like(cgap), cgap, sc.idm))
        acc = acc.clamp(-9.0, None)
        decision = None
        due = bool((state.tick[0] % cfg.lane_change_every) == 0)
        if due and bool((sc.num_lanes > 1).any()):
            decision = self.lane_decisions(state, length)
        return acc, decision

    def lane_decisions(self, state: SimState, length: Tensor) -> Tensor:
        sc = state.scene
        n = state.pos.shape[1]
        l0 = state.bank[:, n] if state.bank.shape[1] > n else state.bank[:, 0]
        view = traffic.lane_view(state.pos, l0[:, 0, :2], l0[:, 0, 2], sc.lane_width)
        on_lane = (state.route_id >= n) & ~sc.controlled & state.alive & (state.cooldown <= 0) & (state.lat.abs() < 0.3)
        return traffic.mobil(view, state.speed, length, sc.idm, state.alive, on_lane, sc.num_lanes)

    def apply_lane_changes(self, state: SimState, decision: Tensor, route_id: Tensor, lat: Tensor, cooldown: Tensor):
        sc = state.scene
        go = decision != 0
        w = sc.lane_width[:, None]
        new_id = torch.where(go, route_id + decision, route_id)
        lat = torch.where(go, lat - decision.float() * w, lat)
        cooldown = torch.where(go, torch.full_like(cooldown, self.config.lane_change_cooldown), cooldown)
        return new_id, lat, cooldown


def expand_state(state: SimState, g: int) -> SimState:
    """G copies of every scene of ``state`` (scene b -> rows b*G .. b*G+G-1); records and the
    trace are dropped."""
    rep = lambda t: t.repeat_interleave(g, 0)  # noqa: E731
    sc = Scene(**{f.name: rep(getattr(state.scene, f.name)) for f in fields(Scene)})
    kw = {f.name: rep(getattr(state, f.name)) for f in fields(SimState)
          if isinstance(getattr(state, f.name), Tensor)}
    return SimState(scene=sc, **kw)


def stack_records(recs, state: SimState, config: DrivingEnvConfig, s_before: Tensor) -> ChunkRecord:
    """Per-tick dicts (from ``DrivingEnv.tick``) -> ``ChunkRecord`` for the controlled slots;
    s_before [B, A] is the route progress before the chunk's first tick."""
    e = len(recs)
    sc = state.scene
    a = sc.num_slots
    st = lambda k: torch.stack([r[k] for r in recs], -1)  # noqa: E731
    valid = sc.controlled[:, :a] & sc.agent_mask[:, :a]
    accel, curv = st("accel"), st("curvature")
    s_hist = st("s")
    v_ref = sc.idm[:, :a, 0]
    return ChunkRecord(
        collision=st("collision"), collision_at_fault=st("collision_at_fault"),
        collision_by_traffic=st("collision_by_traffic"), offroad=st("offroad"), ttc_unsafe=st("ttc") < config.ttc_threshold,
        comfort=(accel.abs() > 6.0) | (curv.abs() > 0.3), speed=st("speed"), accel=accel, curvature=curv,
        pos=torch.stack([r["pos"] for r in recs], 2), progress=(s_hist[..., -1] - s_before) * valid,
        expected=v_ref * DT * e, valid=valid,
    )
