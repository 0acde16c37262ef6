"""A rule-based expert for the controlled agents: IDM + pure pursuit, randomised, noisy and
deliberately imperfect, so that post-training has headroom.

* Longitudinal: IDM behind the nearest vehicle in its own path, with a per-agent
  lookahead that is short outside highways (it notices crossing traffic late) and a
  desired speed reduced before curves (lateral acceleration limit).
* No cooperative yielding and no gap acceptance by default: it never slows down for a
  vehicle that is about to cut into its path (merging or crossing), it only brakes once
  that vehicle is in its path. ``yield_prob`` makes that share of agents (drawn per agent
  and scene) yield at conflict points with the background traffic's gap acceptance, so
  that the demonstrations hold both behaviours at a merge or crossing.
* Lateral: pure pursuit on its route centreline.
* Randomised parameters per agent (derived from the scene seed) and AR(1) noise on both
  controls (multimodal demonstrations).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from flowrl._fields import hfield
from planners.driving import traffic
from planners.driving.dynamics import wheelbase_of
from planners.driving.geometry import wrap_angle
from planners.driving.scenes import SCENE_KINDS
from planners.driving.sim import DrivingEnv, SimState, route_points

Tensor = torch.Tensor


@dataclass
class ExpertConfig:
    """The demonstrator of the controlled agents."""

    lookahead_highway: Tuple[float, float] = hfield((30.0, 40.0), "range of the leader lookahead on highways (m)")
    lookahead_urban: Tuple[float, float] = hfield((8.0, 16.0), "range of the (short) lookahead at intersections / roundabouts (m)")
    pursuit_gain: Tuple[float, float] = hfield((0.5, 0.8), "range of the pure-pursuit lookahead time (s)")
    lateral_accel: Tuple[float, float] = hfield((2.0, 3.5), "range of the comfortable lateral acceleration (m/s^2)")
    accel_noise: float = hfield(0.3, "stationary std of the AR(1) acceleration noise (m/s^2)")
    steer_noise: float = hfield(0.01, "stationary std of the AR(1) steering noise (rad)")
    noise_corr: float = hfield(0.9, "AR(1) correlation of the noise between ticks")
    yield_prob: float = hfield(0.0, "share of agents that yield at conflict points (gap acceptance, as background "
                                    "traffic does); 0 = none: the deliberately imperfect expert")

    def __post_init__(self) -> None:
        if not 0.0 <= self.yield_prob <= 1.0:
            raise ValueError(f"expert.yield_prob={self.yield_prob} must lie in [0, 1]")


@dataclass
class ExpertParams:
    """Per controlled agent [B, A]: lookahead (m), pursuit gain (s), lateral accel limit,
    and whether it yields at conflict points (bool)."""

    lookahead: Tensor
    pursuit_gain: Tensor
    lateral_accel: Tensor
    yields: Optional[Tensor] = None


def expert_params(state: SimState, config: ExpertConfig, generator: torch.Generator) -> ExpertParams:
    """Draw per-agent parameters for the scenes of ``state``."""
    sc = state.scene
    b, a = sc.kind.shape[0], sc.num_slots
    u = lambda r: r[0] + (r[1] - r[0]) * torch.rand(b, a, generator=generator)  # noqa: E731
    highway = (sc.kind.cpu() == SCENE_KINDS.index("highway"))[:, None]
    look = torch.where(highway, u(config.lookahead_highway), u(config.lookahead_urban))
    dev = sc.kind.device
    params = ExpertParams(look.to(dev), u(config.pursuit_gain).to(dev), u(config.lateral_accel).to(dev))
    if config.yield_prob > 0:  # drawn after the others, so yield_prob = 0 leaves every other draw unchanged
        params.yields = (torch.rand(b, a, generator=generator) < config.yield_prob).to(dev)
    return params


def curve_speed(bank: Tensor, route_id: Tensor, s: Tensor, spacing: float, lat_accel: Tensor,
                horizon: float = 30.0, samples: int = 7) -> Tensor:
    """[B, A] highest speed that keeps lateral acceleration below ``lat_accel`` on the
    route ahead (curvature from heading changes over ``samples`` points)."""
    ds = horizon / (samples - 1)
    along = torch.arange(samples, device=s.device, dtype=s.dtype) * ds
    pts = route_points(bank, route_id, s[..., None] + along, spacing)
    kappa = wrap_angle(pts[..., 1:, 2] - pts[..., :-1, 2]).abs().amax(-1) / ds
    return (lat_accel / kappa.clamp(min=1e-4)).sqrt()


def pure_pursuit(state: Tensor, target: Tensor, wheelbase: Tensor) -> Tensor:
    """Steering [B, A] toward target [B, A, 2] from state [B, A, 4] (x, y, heading, speed)."""
    d = target - state[..., :2]
    alpha = wrap_angle(torch.atan2(d[..., 1], d[..., 0]) - state[..., 2])
    ld = d.norm(dim=-1).clamp(min=1.0)
    return torch.atan(2 * wheelbase * torch.sin(alpha) / ld)


def expert_controls(env: DrivingEnv, state: SimState, params: ExpertParams, noise: Tensor) -> Tensor:
    """Controls [B, A, 2] (accel, steer) of the expert for the controlled slots, given the
    current AR(1) noise sample noise [B, A, 2]."""
    sc = state.scene
    a, sp = sc.num_slots, env.config.scene.route_spacing
    length = sc.agents[:, :, -1, 5]
    along = env.along
    path = route_points(state.bank, state.route_id, state.s[..., None] + along, sp)
    look = torch.cat([params.lookahead, torch.zeros_like(state.speed[:, a:])], 1)
    lead = traffic.path_leaders(path[..., :2], path[..., 2], along, state.pos, state.heading, state.speed, length,
                                state.alive, look)
    v = state.speed[:, :a]
    idm = sc.idm[:, :a].clone()
    v_curve = curve_speed(state.bank, state.route_id[:, :a], state.s[:, :a], sp, params.lateral_accel)
    idm[..., 0] = torch.minimum(idm[..., 0], v_curve.clamp(min=3.0))
    accel = traffic.idm_accel(v, lead.lead_speed[:, :a], lead.gap[:, :a], idm)
    if params.yields is not None and bool(params.yields.any()):
        cgap = traffic.conflict_gaps(path[..., ::3, :2], along[::3], state.speed, path[:, :, 0, 3], length,
                                     state.alive, lead.in_path, env.config.critical_gap)[:, :a]
        stop = traffic.idm_accel(v, torch.zeros_like(v), cgap, idm)
        accel = torch.where(params.yields, torch.minimum(accel, stop), accel)
    accel = accel.clamp(-8.0, 4.0)
    ld = (2.0 + params.pursuit_gain * v).clamp(4.0, 25.0)
    target = route_points(state.bank, state.route_id[:, :a], (state.s[:, :a] + ld)[..., None], sp)[:, :, 0, :2]
    steer = pure_pursuit(state.controlled_state(), target, wheelbase_of(length[:, :a]))
    return torch.stack([accel, steer], -1) + noise


def next_noise(noise: Tensor, config: ExpertConfig, generator: torch.Generator) -> Tensor:
    """AR(1) update of the control noise [B, A, 2] (stationary stds from the config)."""
    std = torch.tensor([config.accel_noise, config.steer_noise])
    rho = config.noise_corr
    fresh = torch.randn(noise.shape, generator=generator) * std * (1 - rho**2) ** 0.5
    return rho * noise + fresh.to(noise.device)


@torch.no_grad()
def run_expert(env: DrivingEnv, state: SimState, steps: int, config: Optional[ExpertConfig] = None,
               seed: int = 0):
    """Drive ``steps`` ticks with the expert. Returns (final state, list of per-tick
    records from ``DrivingEnv.tick``, list of SimStates before each tick's move is NOT kept:
    the controlled states [B, A, steps + 1, 4] and all agents' features [B, N, steps, 8])."""
    cfg = config or ExpertConfig()
    g = torch.Generator().manual_seed(int(seed))
    params = expert_params(state, cfg, g)
    noise = torch.zeros(state.pos.shape[0], state.num_slots, 2)
    noise = next_noise(noise, ExpertConfig(noise_corr=0.0, accel_noise=cfg.accel_noise, steer_noise=cfg.steer_noise), g)
    seg = env.segments(state.scene)
    ctrl_states, agents, s_hist, alive, recs = [state.controlled_state()], [], [state.s], [state.alive], []
    for _ in range(steps):
        u = expert_controls(env, state, params, noise.to(state.pos.device))
        state, rec = env.tick(state, u, seg)
        noise = next_noise(noise, cfg, g)
        ctrl_states.append(state.controlled_state())
        agents.append(state.history[:, :, -1])
        s_hist.append(state.s)
        alive.append(state.alive)
        recs.append(rec)
    return state, {
        "ctrl_states": torch.stack(ctrl_states, 2), "agents": torch.stack(agents, 2),
        "route_s": torch.stack(s_hist, 2), "alive": torch.stack(alive, 2), "records": recs,
    }
