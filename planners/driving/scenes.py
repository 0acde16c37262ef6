"""Seeded procedural driving scenes, batched, in a public-dataset-like tensor layout.

Three kinds of scene (``SCENE_KINDS``), each with randomised geometry, traffic density,
speeds and gaps:

* ``highway``: 2-4 straight parallel lanes and an on-ramp that merges into the rightmost
  lane (background traffic changes lanes with MOBIL; ramp vehicles merge with gap
  acceptance).
* ``intersection``: an unsignalised four-way crossing, one lane each way per arm,
  left / straight / right connectors.
* ``roundabout``: a one-lane ring (counter-clockwise, priority on the ring) with four
  arms.

A scene is generated from its seed alone (``make_scene(seed)``), so a batch equals the
stack of its scenes (``Scene.stack``). Agent slots ``[0, A)`` are controlled (``A =
max_controlled``, padded, ``controlled`` marks the real ones), slots ``[A, N)`` are
background traffic. The whole scene is rotated by a random angle, so nothing may
assume an axis-aligned world.

Tensor layout (``B`` scenes, ``N`` agent slots, ``T`` history steps, ``M`` polylines of
``P`` points, ``R`` route points every ``route_spacing`` metres, ``L`` parallel lanes):
see ``Scene``. Feature orders are ``AGENT_FEATURES``, ``POLYLINE_FEATURES``,
``ROUTE_FEATURES``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from flowrl._fields import hfield
from planners.driving import geometry as geo

Tensor = torch.Tensor

DT = 0.1  # seconds per simulator step (10 Hz)
SCENE_KINDS = ("highway", "intersection", "roundabout")
AGENT_FEATURES = ("x", "y", "heading", "vx", "vy", "length", "width", "valid")
POLYLINE_FEATURES = ("x", "y", "cos_h", "sin_h", "half_width", "priority")
ROUTE_FEATURES = ("x", "y", "heading", "priority")
IDM_PARAMS = ("v0", "time_headway", "a_max", "b_comf", "s0")


@dataclass
class SceneConfig:
    """How scenes are generated (sizes fix the padded tensor shapes)."""

    kinds: Tuple[str, ...] = hfield(SCENE_KINDS, "scene kinds drawn uniformly by seed")
    min_controlled: int = hfield(4, "fewest controlled agents per scene")
    max_controlled: int = hfield(8, "most controlled agents per scene (the agent axis A of the planner)")
    min_background: int = hfield(4, "fewest background (IDM) vehicles")
    max_background: int = hfield(10, "most background vehicles (N = max_controlled + max_background)")
    history: int = hfield(10, "history steps T_hist in the agent tensor (10 Hz)")
    polyline_points: int = hfield(20, "points P per lane polyline")
    max_polylines: int = hfield(20, "polyline slots M")
    route_spacing: float = hfield(1.0, "metres between route points")
    route_extend: float = hfield(80.0, "straight extension of every route past its end (metres)")

    def __post_init__(self) -> None:
        if not 1 <= self.min_controlled <= self.max_controlled:
            raise ValueError("scene.min_controlled must be in [1, max_controlled]")
        if not 0 <= self.min_background <= self.max_background:
            raise ValueError("scene.min_background must be in [0, max_background]")
        bad = [k for k in self.kinds if k not in SCENE_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"scene.kinds must be a non-empty subset of {SCENE_KINDS}, got {self.kinds}")
        if self.history < 2:
            raise ValueError("scene.history must be >= 2")

    @property
    def num_agents(self) -> int:
        return self.max_controlled + self.max_background


@dataclass
class Scene:
    """A batch of scenes (also one scene with B = 1). Acts as a sequence of scenes.

    agents:        [B, N, T, 8] ``AGENT_FEATURES`` history, last step = now.
    agent_mask:    [B, N] bool, slot holds a vehicle.
    controlled:    [B, N] bool, controlled by the planner (only slots < A can be).
    polylines:     [B, M, P, 6] lane centrelines, ``POLYLINE_FEATURES``.
    polyline_mask: [B, M] bool.
    routes:        [B, N, R, 4] each agent's centreline route, ``ROUTE_FEATURES``,
                   one point every ``route_spacing`` m, padded by repeating the end.
    route_length:  [B, N] route length in metres (before the straight extension).
    route_s:       [B, N] current progress along the route (metres).
    lane_routes:   [B, L, R, 4] parallel highway lanes (lane 0 rightmost), for MOBIL.
    lane_index:    [B, N] long, which lane route an agent follows (-1: not a highway lane).
    num_lanes:     [B] long (0 outside highways).
    lane_width:    [B] metres.
    idm:           [B, N, 5] ``IDM_PARAMS`` per agent.
    speed_limit:   [B] m/s.
    kind:          [B] long index into ``SCENE_KINDS``.
    seed:          [B] long.
    max_controlled: [B] long, A (the same for every scene of a batch).
    """

    agents: Tensor
    agent_mask: Tensor
    controlled: Tensor
    polylines: Tensor
    polyline_mask: Tensor
    routes: Tensor
    route_length: Tensor
    route_s: Tensor
    lane_routes: Tensor
    lane_index: Tensor
    num_lanes: Tensor
    lane_width: Tensor
    idm: Tensor
    speed_limit: Tensor
    kind: Tensor
    seed: Tensor
    max_controlled: Tensor

    # -- sequence behaviour: Head.encode / Environment.observe hand these around
    def __len__(self) -> int:
        return self.agents.shape[0]

    def __getitem__(self, i) -> "Scene":
        sl = slice(i, i + 1) if isinstance(i, int) else i
        return Scene(**{f.name: getattr(self, f.name)[sl] for f in fields(self)})

    def __iter__(self) -> Iterator["Scene"]:
        return (self[i] for i in range(len(self)))

    @property
    def num_slots(self) -> int:
        """A: the planner's agent axis (controlled agents live in slots [0, A))."""
        return int(self.max_controlled[0])

    def to(self, device) -> "Scene":
        return Scene(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def replace(self, **kw) -> "Scene":
        return replace(self, **kw)

    def tensors(self) -> Dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def stack(scenes: Sequence["Scene"]) -> "Scene":
        """Concatenate scenes along B, padding routes (repeat the end) and lane slots."""
        r = max(s.routes.shape[2] for s in scenes)
        nl = max(s.lane_routes.shape[1] for s in scenes)
        out: Dict[str, List[Tensor]] = {f.name: [] for f in fields(Scene)}
        for s in scenes:
            for f in fields(Scene):
                v = getattr(s, f.name)
                if f.name in ("routes", "lane_routes"):
                    v = _pad_repeat(v, 2, r)
                if f.name == "lane_routes":
                    v = _pad_zeros(v, 1, nl)
                out[f.name].append(v)
        return Scene(**{k: torch.cat(v, 0) for k, v in out.items()})


def _pad_repeat(x: Tensor, dim: int, size: int) -> Tensor:
    n = x.shape[dim]
    if n >= size:
        return x
    last = x.narrow(dim, n - 1, 1)
    reps = [1] * x.ndim
    reps[dim] = size - n
    return torch.cat([x, last.repeat(*reps)], dim)


def _pad_zeros(x: Tensor, dim: int, size: int) -> Tensor:
    n = x.shape[dim]
    if n >= size:
        return x
    shape = list(x.shape)
    shape[dim] = size - n
    return torch.cat([x, x.new_zeros(shape)], dim)


# --------------------------------------------------------------------------- road layouts
@dataclass
class RouteOption:
    """A drivable path through a layout and where vehicles may spawn on it.

    points: [K, 2] dense centreline; priority: [K] (1 = main road / ring);
    spawn_controlled / spawn_background: (s_min, s_max) metres; lane: highway lane or -1.
    """

    points: Tensor
    priority: Tensor
    spawn_controlled: Tuple[float, float]
    spawn_background: Tuple[float, float]
    lane: int = -1
    weight: float = 1.0


@dataclass
class Layout:
    """Geometry of one scene before vehicles are placed.

    lanes: list of ([K, 2] centreline, priority 0/1) drawn as polylines.
    """

    lanes: List[Tuple[Tensor, float]]
    routes: List[RouteOption]
    lane_width: float
    speed_limit: float
    num_lanes: int = 0
    ramp_routes: Tuple[int, ...] = ()


def _u(g: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand((), generator=g))


def _randint(g: torch.Generator, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (), generator=g))


def _t(*xy: float) -> Tensor:
    return torch.tensor(xy, dtype=torch.float32)


def highway_layout(g: torch.Generator) -> Layout:
    """Straight lanes along +x (lane 0 rightmost at y = 0) and a ramp joining lane 0."""
    n = _randint(g, 2, 4)
    w = _u(g, 3.3, 3.9)
    x_merge = _u(g, 110.0, 160.0)
    ramp_len = _u(g, 70.0, 110.0)
    ramp_angle = math.radians(_u(g, 5.0, 10.0))
    length = x_merge + _u(g, 300.0, 340.0)
    speed = _u(g, 22.0, 30.0)
    lanes, routes = [], []
    for k in range(n):
        pts = geo.segment(_t(0.0, k * w), _t(length, k * w), 200)
        lanes.append((pts, 1.0))
        routes.append(RouteOption(pts, torch.ones(len(pts)), (x_merge - 100, x_merge - 15), (0.0, x_merge + 80), lane=k,
                                  weight=1.0))
    start = _t(x_merge - ramp_len, -ramp_len * math.tan(ramp_angle))
    ramp = geo.bezier(start, _t(x_merge - 0.5 * ramp_len, 0.0), _t(x_merge, 0.0), 60)
    lanes.append((ramp, 0.0))
    tail = geo.segment(_t(x_merge, 0.0), _t(length, 0.0), 160)
    pts = geo.concat_paths([ramp, tail])
    prio = torch.cat([torch.zeros(len(ramp)), torch.ones(len(pts) - len(ramp))])
    ramp_arc = float(geo.arc_length(ramp)[-1])
    routes.append(RouteOption(pts, prio, (ramp_arc - 85, ramp_arc - 30), (0.0, ramp_arc - 20), weight=float(n) / 2))
    return Layout(lanes, routes, w, speed, num_lanes=n, ramp_routes=(n,))


def _arm_vectors(angle: float) -> Tuple[Tensor, Tensor]:
    u = _t(math.cos(angle), math.sin(angle))
    return u, _t(-u[1].item(), u[0].item())


def intersection_layout(g: torch.Generator) -> Layout:
    """Four arms (angles jittered), one lane each way; 12 Bezier connectors."""
    w = _u(g, 3.3, 3.9)
    core = w + _u(g, 2.0, 5.0)
    arm_len = _u(g, 70.0, 90.0)
    speed = _u(g, 10.0, 14.0)
    angles = [k * math.pi / 2 + math.radians(_u(g, -8.0, 8.0)) for k in range(4)]
    inbound, outbound = [], []
    for a in angles:
        u, nrm = _arm_vectors(a)
        inbound.append(geo.segment((core + arm_len) * u + 0.5 * w * nrm, core * u + 0.5 * w * nrm, 40))
        outbound.append(geo.segment(core * u - 0.5 * w * nrm, (core + arm_len) * u - 0.5 * w * nrm, 40))
    lanes = [(p, 0.0) for p in inbound + outbound]
    routes = []
    for i in range(4):
        for j in range(4):
            if i == j:
                continue
            p0, d0 = inbound[i][-1], inbound[i][-1] - inbound[i][-2]
            p2, d2 = outbound[j][0], outbound[j][1] - outbound[j][0]
            conn = geo.bezier(p0, geo.line_intersection(p0, d0, p2, d2), p2, 25)
            lanes.append((conn, 0.0))
            pts = geo.concat_paths([inbound[i], conn, outbound[j]])
            spawn = (arm_len - 55.0, arm_len - 8.0)
            routes.append(RouteOption(pts, torch.zeros(len(pts)), spawn, spawn))
    return Layout(lanes, routes, w, speed)


def roundabout_layout(g: torch.Generator) -> Layout:
    """One-lane counter-clockwise ring with four arms; the ring has priority."""
    w = _u(g, 3.5, 4.0)
    radius = _u(g, 14.0, 22.0)
    arm_len = _u(g, 60.0, 80.0)
    speed = _u(g, 8.0, 11.0)
    angles = [k * math.pi / 2 + math.radians(_u(g, -10.0, 10.0)) for k in range(4)]
    centre = _t(0.0, 0.0)
    gap = (0.5 * w + 4.0) / radius  # angular offset of entry / exit points from an arm's axis
    inner = radius + 0.5 * w + 6.0  # where arm lanes end
    ring_pts = lambda a0, a1: geo.arc(centre, radius, a0, a1, max(8, int(radius * (a1 - a0) / 2)))  # noqa: E731
    lanes: List[Tuple[Tensor, float]] = []
    entries, exits, inb, outb = [], [], [], []
    for a in angles:
        u, nrm = _arm_vectors(a)
        p_in0, p_in1 = (inner + arm_len) * u + 0.5 * w * nrm, inner * u + 0.5 * w * nrm
        p_out0, p_out1 = inner * u - 0.5 * w * nrm, (inner + arm_len) * u - 0.5 * w * nrm
        inb.append(geo.segment(p_in0, p_in1, 30))
        outb.append(geo.segment(p_out0, p_out1, 30))
        e_pt = radius * _t(math.cos(a + gap), math.sin(a + gap))
        e_dir = _t(-math.sin(a + gap), math.cos(a + gap))
        entries.append(geo.bezier(p_in1, geo.line_intersection(p_in1, -u, e_pt, e_dir), e_pt, 15))
        x_pt = radius * _t(math.cos(a - gap), math.sin(a - gap))
        x_dir = _t(-math.sin(a - gap), math.cos(a - gap))
        exits.append(geo.bezier(x_pt, geo.line_intersection(x_pt, x_dir, p_out0, u), p_out0, 15))
    for k in range(4):
        a0, a1 = angles[k] - gap, angles[(k + 1) % 4] - gap + (2 * math.pi if k == 3 else 0.0)
        lanes.append((ring_pts(a0, a1), 1.0))
    lanes += [(p, 0.0) for p in inb + outb + entries + exits]
    routes = []
    for i in range(4):
        for turns in (1, 2, 3):
            j = (i + turns) % 4
            a0 = angles[i] + gap
            a1 = angles[j] - gap + (2 * math.pi if j <= i else 0.0)
            ring = ring_pts(a0, a1)
            pieces = [inb[i], entries[i], ring, exits[j], outb[j]]
            pts = geo.concat_paths(pieces)
            n_before = len(geo.concat_paths(pieces[:2]))
            prio = torch.zeros(len(pts))
            prio[n_before:n_before + len(ring) - 1] = 1.0
            ring_end = float(geo.arc_length(geo.concat_paths(pieces[:3]))[-1])
            routes.append(RouteOption(pts, prio, (arm_len - 45.0, arm_len - 5.0), (arm_len - 45.0, ring_end - 5.0)))
    return Layout(lanes, routes, w, speed)


LAYOUTS = {"highway": highway_layout, "intersection": intersection_layout, "roundabout": roundabout_layout}


# --------------------------------------------------------------------------- routes and agents
def route_tensor(opt: RouteOption, spacing: float, extend: float) -> Tuple[Tensor, float]:
    """Resample a route option -> ([R, 4] ``ROUTE_FEATURES``, length in metres)."""
    pts = geo.resample(opt.points, spacing=spacing, extend=extend)
    s_src = geo.arc_length(opt.points)
    s_new = torch.arange(len(pts)) * spacing
    idx = torch.searchsorted(s_src, s_new.clamp(max=float(s_src[-1])), right=True).clamp(1, len(s_src)) - 1
    prio = opt.priority[idx]
    return torch.cat([pts, geo.headings(pts)[:, None], prio[:, None]], dim=1), float(s_src[-1])


def pose_on_route(route: Tensor, s: Tensor, spacing: float) -> Tuple[Tensor, Tensor]:
    """Interpolated (position [..., 2], heading [...]) at progress s on routes [..., R, 4].

    route [..., R, 4] and s [...] share leading dims; s is clamped to the route."""
    r = route.shape[-2]
    f = (s / spacing).clamp(0.0, r - 1.0)
    i0 = f.floor().long().clamp(max=r - 2)
    w = (f - i0).clamp(0.0, 1.0).unsqueeze(-1)
    p0 = torch.gather(route, -2, i0[..., None, None].expand(*i0.shape, 1, 4)).squeeze(-2)
    p1 = torch.gather(route, -2, (i0 + 1)[..., None, None].expand(*i0.shape, 1, 4)).squeeze(-2)
    pos = p0[..., :2] + w * (p1[..., :2] - p0[..., :2])
    return pos, p0[..., 2] + w.squeeze(-1) * geo.wrap_angle(p1[..., 2] - p0[..., 2])


def _place(g: torch.Generator, layout: Layout, count: int, controlled: bool, placed: List[Tuple[Tensor, int, float]],
           routes: List[Tuple[Tensor, float]], spacing: float, force_ramp: int = 0) -> List[Tuple[int, float]]:
    """Pick (route option index, s) for ``count`` vehicles at least 8 m from the others."""
    weights = torch.tensor([r.weight for r in layout.routes])
    out = []
    for k in range(count):
        for _ in range(40):
            if k < force_ramp and layout.ramp_routes:
                ri = layout.ramp_routes[_randint(g, 0, len(layout.ramp_routes) - 1)]
            else:
                ri = int(torch.multinomial(weights, 1, generator=g))
            lo, hi = layout.routes[ri].spawn_controlled if controlled else layout.routes[ri].spawn_background
            s = _u(g, max(lo, 0.0), max(hi, lo + 1.0))
            pos, _ = pose_on_route(routes[ri][0], torch.tensor(s), spacing)
            if all(float((pos - q).norm()) > 8.0 for q, _, _ in placed):
                placed.append((pos, ri, s))
                out.append((ri, s))
                break
    return out


def _history(route: Tensor, s: float, speed: float, length: float, width: float, steps: int, spacing: float) -> Tensor:
    """[T, 8] constant-speed history along the route ending at progress s."""
    back = s - speed * DT * torch.arange(steps - 1, -1, -1, dtype=torch.float32)
    pos, head = pose_on_route(route.expand(steps, -1, -1), back, spacing)
    valid = (back >= 0).float()
    vel = speed * torch.stack([head.cos(), head.sin()], dim=-1)
    dims = torch.tensor([length, width]).expand(steps, 2)
    return torch.cat([pos, head[:, None], vel, dims, valid[:, None]], dim=1) * valid[:, None]


def make_scene(seed: int, config: Optional[SceneConfig] = None, kind: Optional[str] = None) -> Scene:
    """One scene (B = 1) from its seed alone; ``kind`` overrides the seed's draw."""
    cfg = config or SceneConfig()
    g = torch.Generator().manual_seed(int(seed))
    kind_draw = cfg.kinds[_randint(g, 0, len(cfg.kinds) - 1)]
    kind = kind or kind_draw
    layout = LAYOUTS[kind](g)
    sp = cfg.route_spacing
    routes = [route_tensor(opt, sp, cfg.route_extend) for opt in layout.routes]
    n_ctrl = _randint(g, cfg.min_controlled, cfg.max_controlled)
    n_bg = _randint(g, cfg.min_background, cfg.max_background)
    placed: List[Tuple[Tensor, int, float]] = []
    ramp_first = _randint(g, 1, 2) if kind == "highway" else 0
    ctrl = _place(g, layout, n_ctrl, True, placed, routes, sp, force_ramp=ramp_first)
    bg = _place(g, layout, n_bg, False, placed, routes, sp)
    a_max, n_slots, t_hist = cfg.max_controlled, cfg.num_agents, cfg.history
    r_len = max(len(r[0]) for r in routes)
    agents = torch.zeros(n_slots, t_hist, len(AGENT_FEATURES))
    route_t = torch.zeros(n_slots, r_len, len(ROUTE_FEATURES))
    route_t[:] = routes[0][0][-1]
    route_length = torch.zeros(n_slots)
    route_s = torch.zeros(n_slots)
    lane_index = torch.full((n_slots,), -1, dtype=torch.long)
    idm = torch.zeros(n_slots, len(IDM_PARAMS))
    mask = torch.zeros(n_slots, dtype=torch.bool)
    slots = [(i, v) for i, v in enumerate(ctrl)] + [(a_max + i, v) for i, v in enumerate(bg)]
    for slot, (ri, s) in slots:
        rt, rl = routes[ri]
        speed = layout.speed_limit * _u(g, 0.6, 1.0)
        length, width = _u(g, 4.2, 5.2), _u(g, 1.8, 2.1)
        agents[slot] = _history(rt, s, speed, length, width, t_hist, sp)
        route_t[slot] = _pad_repeat(rt, 0, r_len)
        route_length[slot], route_s[slot], mask[slot] = rl, s, True
        lane_index[slot] = layout.routes[ri].lane
        idm[slot] = torch.tensor([layout.speed_limit * _u(g, 0.85, 1.15), _u(g, 1.0, 1.8), _u(g, 1.0, 2.0),
                                  _u(g, 1.5, 2.5), _u(g, 1.5, 3.0)])
    lane_routes = torch.stack([_pad_repeat(routes[k][0], 0, r_len) for k in range(layout.num_lanes)]) \
        if layout.num_lanes else torch.zeros(0, r_len, len(ROUTE_FEATURES))
    polylines = torch.zeros(cfg.max_polylines, cfg.polyline_points, len(POLYLINE_FEATURES))
    poly_mask = torch.zeros(cfg.max_polylines, dtype=torch.bool)
    for m, (pts, prio) in enumerate(layout.lanes[: cfg.max_polylines]):
        p = geo.resample(pts, num=cfg.polyline_points)
        h = geo.headings(p)
        polylines[m] = torch.stack([p[:, 0], p[:, 1], h.cos(), h.sin(), torch.full_like(h, 0.5 * layout.lane_width),
                                    torch.full_like(h, prio)], dim=1)
        poly_mask[m] = True
    controlled = torch.zeros(n_slots, dtype=torch.bool)
    controlled[: len(ctrl)] = True
    scene = Scene(
        agents=agents[None], agent_mask=mask[None], controlled=controlled[None], polylines=polylines[None],
        polyline_mask=poly_mask[None], routes=route_t[None], route_length=route_length[None], route_s=route_s[None],
        lane_routes=lane_routes[None], lane_index=lane_index[None],
        num_lanes=torch.tensor([layout.num_lanes]), lane_width=torch.tensor([layout.lane_width]), idm=idm[None],
        speed_limit=torch.tensor([layout.speed_limit]), kind=torch.tensor([SCENE_KINDS.index(kind)]),
        seed=torch.tensor([int(seed)]), max_controlled=torch.tensor([a_max]),
    )
    return rotate_scene(scene, _u(g, -math.pi, math.pi))


def rotate_scene(scene: Scene, angle: float) -> Scene:
    """Rotate every coordinate and heading of a scene about the origin."""
    def rot_xy_h(x: Tensor, hi: int, extra: Tuple[int, ...] = ()) -> Tensor:
        x = x.clone()
        x[..., :2] = geo.rotate(x[..., :2], angle)
        if hi >= 0:
            x[..., hi] = geo.wrap_angle(x[..., hi] + angle)
        for j in extra:
            x[..., j:j + 2] = geo.rotate(x[..., j:j + 2], angle)
        return x

    agents = rot_xy_h(scene.agents, 2, (3,)) * scene.agents[..., 7:8]
    polys = rot_xy_h(scene.polylines, -1, (2,)) * scene.polyline_mask[..., None, None]
    return scene.replace(agents=agents, polylines=polys, routes=rot_xy_h(scene.routes, 2),
                         lane_routes=rot_xy_h(scene.lane_routes, 2))


def make_scenes(seeds: Sequence[int], config: Optional[SceneConfig] = None, kind: Optional[str] = None) -> Scene:
    """A batch: ``Scene.stack`` of ``make_scene`` for each seed (order kept)."""
    return Scene.stack([make_scene(s, config, kind) for s in seeds])
