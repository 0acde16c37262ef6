"""The multi-agent planner denoiser over joint control chunks (SCORP-style).

x [B, A, H, 2]: normalised (accel, steer) of every controlled slot over H ticks
(``normalise_controls`` / ``denormalise_controls``). The network:

* scene encoder: an MLP over each agent's history (scene frame), a PointNet over each
  lane polyline, then transformer layers over all agent + polyline tokens;
* query tokens, one per controlled slot: the noisy chunk, the slot's own agent token,
  and its route ahead + speed in its own frame;
* decoder blocks alternating inter-agent self-attention and cross-attention to the scene
  tokens (then an MLP), each sub-layer conditioned on the time t with AdaLN-Zero: the
  modulation (shift, scale, gate) comes from a zero-initialised linear layer, so every
  block is the identity at initialisation;
* a final AdaLN layer and a linear head to the velocity [B, A, H, 2] (zero-initialised, DiT).

``scene_features(scene)`` turns observation ``Scene``s into the conditioning dict the
network reads (all [B, ...] tensors: fits ``Head.encode``). ``rollout_controls`` runs a
chunk through the bicycle model so that losses can be put on the reached states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import nn

from flowrl._fields import hfield
from planners.driving.dynamics import bicycle_rollout, wheelbase_of
from planners.driving.scenes import Scene
from planners.driving.sim import route_points

Tensor = torch.Tensor
CONTROL_SCALE = (3.0, 0.2)  # (accel m/s^2, steer rad) per unit of x
POS_SCALE, VEL_SCALE = 50.0, 10.0
ROUTE_AHEAD = (0.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)  # metres of route fed per controlled agent


def normalise_controls(u: Tensor) -> Tensor:
    """Physical (accel, steer) [..., 2] -> network units."""
    return u / u.new_tensor(CONTROL_SCALE)


def denormalise_controls(x: Tensor) -> Tensor:
    """Network units [..., 2] -> physical (accel, steer)."""
    return x * x.new_tensor(CONTROL_SCALE)


def rollout_controls(state: Tensor, controls: Tensor, wheelbase: Tensor) -> Tensor:
    """Differentiable rollout: ego state [B, A, 4] (x, y, heading, speed), physical
    controls [B, A, H, 2], wheelbase [B, A] -> states [B, A, H, 4] after each tick."""
    return bicycle_rollout(state, controls, wheelbase)


# --------------------------------------------------------------------------- features
def _to_frame(xy: Tensor, origin: Tensor, angle: Tensor) -> Tensor:
    """Points [B, ..., 2] into frames (origin [B, 2], angle [B]) broadcast over the middle dims."""
    shape = [xy.shape[0]] + [1] * (xy.ndim - 2)
    c, s = angle.cos().view(shape), angle.sin().view(shape)
    d = xy - origin.view(xy.shape[0], *([1] * (xy.ndim - 2)), 2)
    return torch.stack([c * d[..., 0] + s * d[..., 1], -s * d[..., 0] + c * d[..., 1]], -1)


@torch.no_grad()
def leader_features(now: Tensor, valid: Tensor, a: int, lane_half_width: float = 2.0,
                    max_gap: float = 50.0) -> Tensor:
    """[B, A, 3] per controlled slot: (gap to the nearest vehicle ahead in its lane / max_gap,
    clipped to 1; closing speed / 10 m/s; 1 if there is such a leader). now: [B, N, 8]
    current ``AGENT_FEATURES``; valid: [B, N] bool. A leader is within ``lane_half_width``
    of the slot's heading line, ahead of it, and heading the same way (cos > 0.5); the gap
    is bumper to bumper."""
    pos, hdg, vel, length = now[..., :2], now[..., 2], now[..., 3:5], now[..., 5]
    c, s = hdg[:, :a].cos()[..., None], hdg[:, :a].sin()[..., None]      # [B, A, 1]
    rel = pos[:, None] - pos[:, :a, None]                                 # [B, A, N, 2]
    fwd = c * rel[..., 0] + s * rel[..., 1]
    lat = -s * rel[..., 0] + c * rel[..., 1]
    same_way = torch.cos(hdg[:, None] - hdg[:, :a, None]) > 0.5
    gap = fwd - (length[:, :a, None] + length[:, None]) / 2
    n = now.shape[1]
    is_leader = (valid[:, None] & (fwd > 0) & (lat.abs() < lane_half_width) & same_way
                 & ~torch.eye(a, n, dtype=torch.bool, device=now.device))
    gap = torch.where(is_leader, gap.clamp(min=0), torch.full_like(gap, max_gap))
    best, idx = gap.min(dim=-1)                                           # [B, A]
    lead_vel = torch.gather(vel, 1, idx[..., None].expand(-1, -1, 2))     # [B, A, 2]
    own = c[..., 0] * vel[:, :a, 0] + s[..., 0] * vel[:, :a, 1]
    lead = c[..., 0] * lead_vel[..., 0] + s[..., 0] * lead_vel[..., 1]
    has = is_leader.any(dim=-1)
    closing = torch.where(has, own - lead, torch.zeros_like(own))
    return torch.stack([(best / max_gap).clamp(max=1.0), closing / VEL_SCALE, has.float()], -1)


@torch.no_grad()
def scene_features(scene: Scene) -> Dict[str, Tensor]:
    """Conditioning tensors for the denoiser from observation scenes (``DrivingEnv.observe``
    or ``DemoDataset``). Scene frame: origin at the controlled agents' mean position,
    x axis along slot 0's heading; positions / 50 m, speeds / 10 m/s.

    agents [B, N, T * 9], agent_mask [B, N], polylines [B, M, P, 6], polyline_mask [B, M],
    ego [B, A, 3 + 2 * len(ROUTE_AHEAD)] (own speed, desired speed, wheelbase, route ahead
    in its own frame), agent_valid [B, A], ego_state [B, A, 4] (physical, for rollouts),
    wheelbase [B, A].
    """
    a = scene.num_slots
    now = scene.agents[:, :, -1]
    ctrl = scene.controlled & scene.agent_mask
    w = ctrl.float()[..., None]
    origin = (now[..., :2] * w).sum(1) / w.sum(1).clamp(min=1)
    angle = now[:, 0, 2]
    ag = scene.agents
    xy = _to_frame(ag[..., :2], origin, angle) / POS_SCALE
    h = ag[..., 2] - angle[:, None, None]
    vel = _to_frame(ag[..., 3:5] + origin[:, None, None], origin, angle) / VEL_SCALE
    valid = ag[..., 7:8]
    feats = torch.cat([xy, h.cos()[..., None], h.sin()[..., None], vel, ag[..., 5:6] / 5.0, ag[..., 6:7] / 2.0, valid], -1)
    agents = (feats * valid).flatten(2)
    pl = scene.polylines
    pxy = _to_frame(pl[..., :2], origin, angle) / POS_SCALE
    pdir = _to_frame(pl[..., 2:4] + origin[:, None, None], origin, angle)
    polylines = torch.cat([pxy, pdir, pl[..., 4:5] / 2.0, pl[..., 5:6]], -1) * scene.polyline_mask[..., None, None]
    # route ahead of each controlled slot, in its own frame
    ahead = torch.tensor(ROUTE_AHEAD, device=now.device)
    pts = route_points(scene.routes[:, :a], torch.arange(a, device=now.device).expand(len(scene), a),
                       scene.route_s[:, :a, None] + ahead, 1.0)[..., :2]  # spacing of SceneConfig default
    ego_xy, ego_h = now[:, :a, :2], now[:, :a, 2]
    rel = pts - ego_xy[:, :, None]
    c, s = ego_h.cos()[..., None], ego_h.sin()[..., None]
    local = torch.stack([c * rel[..., 0] + s * rel[..., 1], -s * rel[..., 0] + c * rel[..., 1]], -1) / 20.0
    speed = now[:, :a, 3:5].norm(dim=-1)
    length = now[:, :a, 5]
    ego = torch.cat([speed[..., None] / VEL_SCALE, scene.idm[:, :a, :1] / VEL_SCALE,
                     wheelbase_of(length)[..., None] / 3.0, local.flatten(2)], -1)
    return {
        "agents": agents, "agent_mask": scene.agent_mask, "agent_controlled": scene.controlled,
        "polylines": polylines, "polyline_mask": scene.polyline_mask,
        "ego": ego * ctrl[:, :a, None], "agent_valid": ctrl[:, :a],
        "leader": leader_features(now, scene.agent_mask & (now[..., 7] > 0), a) * ctrl[:, :a, None],
        "ego_state": torch.cat([ego_xy, ego_h[..., None], speed[..., None]], -1),
        "wheelbase": wheelbase_of(length).clamp(min=1.0),
    }


# --------------------------------------------------------------------------- network
@dataclass
class PlannerConfig:
    """Size of the multi-agent denoiser (defaults train on a CPU in minutes)."""

    horizon: int = hfield(20, "control steps H per chunk (10 Hz)")
    history: int = hfield(10, "history steps T of the agent tensor")
    points: int = hfield(20, "points P per polyline")
    d_model: int = hfield(64, "token width")
    heads: int = hfield(4, "attention heads")
    encoder_layers: int = hfield(1, "transformer layers over scene tokens")
    decoder_blocks: int = hfield(2, "decoder blocks (self-attn + cross-attn + MLP each)")
    mlp_ratio: int = hfield(2, "MLP hidden width / d_model")
    leader_features: bool = hfield(False, "feed each controlled agent its leader's gap and closing speed "
                                          "(``leader_features``) as an extra ego input")

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError("model.d_model must be divisible by model.heads")


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """[B] times in [0, 1] -> [B, dim] sinusoidal features (scaled by 1000 as in DiT)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    ang = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([ang.cos(), ang.sin()], -1)


def mlp(dims, act=nn.SiLU) -> nn.Sequential:
    layers = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """AdaLN: x [B, S, d], shift/scale [B, d]."""
    return x * (1 + scale[:, None]) + shift[:, None]


class DecoderBlock(nn.Module):
    """Inter-agent self-attention, cross-attention to scene tokens, MLP; each AdaLN-Zero."""

    def __init__(self, d: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.self_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.cross_attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm3 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = mlp([d, mlp_ratio * d, d], act=nn.GELU)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 9 * d))
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    def forward(self, h: Tensor, c: Tensor, agent_pad: Tensor, scene: Tensor, scene_pad: Tensor) -> Tensor:
        """h [B, A, d] agent queries, c [B, d] time conditioning, agent_pad [B, A] (True = ignore),
        scene [B, S, d] tokens, scene_pad [B, S]."""
        sh1, sc1, g1, sh2, sc2, g2, sh3, sc3, g3 = self.ada(c).chunk(9, dim=-1)
        q = modulate(self.norm1(h), sh1, sc1)
        h = h + g1[:, None] * self.self_attn(q, q, q, key_padding_mask=agent_pad, need_weights=False)[0]
        q = modulate(self.norm2(h), sh2, sc2)
        h = h + g2[:, None] * self.cross_attn(q, scene, scene, key_padding_mask=scene_pad, need_weights=False)[0]
        return h + g3[:, None] * self.mlp(modulate(self.norm3(h), sh3, sc3))


class PlannerDenoiser(nn.Module):
    """v(x, t | scene): x [B, A, H, 2], t [B], cond from ``scene_features`` -> [B, A, H, 2]."""

    def __init__(self, config: Optional[PlannerConfig] = None):
        super().__init__()
        cfg = self.config = config or PlannerConfig()
        d = cfg.d_model
        self.agent_enc = mlp([cfg.history * 9 + 1, 2 * d, d])
        self.point_enc = mlp([6, d, d])
        self.poly_out = mlp([d, d, d])
        self.type_emb = nn.Embedding(3, d)  # background agent, controlled agent, polyline
        layer = nn.TransformerEncoderLayer(d, cfg.heads, cfg.mlp_ratio * d, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.encoder_layers, enable_nested_tensor=False)
        self.x_in = mlp([cfg.horizon * 2, d, d])
        self.ego_in = mlp([3 + 2 * len(ROUTE_AHEAD), d, d])
        self.leader_in = mlp([3, d, d]) if cfg.leader_features else None
        self.t_emb = mlp([d, d, d])
        self.blocks = nn.ModuleList([DecoderBlock(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.decoder_blocks)])
        self.final_norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.out = nn.Linear(d, cfg.horizon * 2)
        for m in (self.final_ada[1], self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def encode_scene(self, cond: Dict[str, Tensor]):
        """Scene tokens [B, N + M, d], their padding mask [B, N + M] and agent tokens [B, N, d]."""
        ctrl = cond["agent_controlled"].long()
        agents = self.agent_enc(torch.cat([cond["agents"], ctrl[..., None].float()], -1)) + self.type_emb(ctrl)
        pts = self.point_enc(cond["polylines"])  # [B, M, P, d]
        polys = self.poly_out(pts.max(dim=2).values) + self.type_emb.weight[2]
        tokens = torch.cat([agents, polys], 1)
        pad = ~torch.cat([cond["agent_mask"], cond["polyline_mask"]], 1)
        tokens = self.encoder(tokens, src_key_padding_mask=pad)
        return tokens, pad, tokens[:, : agents.shape[1]]

    def forward(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        b, a, hzn, _ = x.shape
        scene, scene_pad, agent_tok = self.encode_scene(cond)
        h = self.x_in(x.reshape(b, a, hzn * 2)) + agent_tok[:, :a] + self.ego_in(cond["ego"])
        if self.leader_in is not None:
            h = h + self.leader_in(cond["leader"])
        c = self.t_emb(timestep_embedding(t, self.config.d_model))
        agent_pad = ~cond["agent_valid"]
        # a scene without a valid controlled slot would attend to nothing: let it see itself
        agent_pad = agent_pad & agent_pad.sum(1, keepdim=True).lt(a)
        for blk in self.blocks:
            h = blk(h, c, agent_pad, scene, scene_pad)
        shift, scale = self.final_ada(c).chunk(2, dim=-1)
        return self.out(modulate(self.final_norm(h), shift, scale)).view(b, a, hzn, 2)


# --------------------------------------------------------------------------- pretraining loss
def denoising_loss(model: PlannerDenoiser, cond: Dict[str, Tensor], controls: Tensor, generator: torch.Generator,
                   state_weight: float = 1.0) -> Dict[str, Tensor]:
    """Flow-matching loss on expert controls [B, A, H, 2] (physical) plus a loss on the states
    reached by the one-step denoised controls (flowrl time: x_t = (1 - t) x0 + t eps, v = eps - x0).

    Returns {"loss", "fm", "state"}; only valid controlled slots count.
    """
    x0 = normalise_controls(controls)
    b = x0.shape[0]
    t = torch.rand(b, generator=generator).to(x0.device)
    eps = torch.randn(x0.shape, generator=generator).to(x0.device)
    tb = t.view(b, 1, 1, 1)
    xt = (1 - tb) * x0 + tb * eps
    v = model(xt, t, cond)
    mask = cond["agent_valid"].float()[..., None, None]
    denom = mask.sum().clamp(min=1) * x0.shape[2]
    fm = (((v - (eps - x0)) ** 2) * mask).sum() / (denom * 2)
    x0_hat = xt - tb * v
    reached = rollout_controls(cond["ego_state"], denormalise_controls(x0_hat), cond["wheelbase"])
    target = rollout_controls(cond["ego_state"], controls, cond["wheelbase"])
    state = ((((reached[..., :2] - target[..., :2]) / 2.0) ** 2).sum(-1, keepdim=True) * mask).sum() / denom
    return {"loss": fm + state_weight * state, "fm": fm.detach(), "state": state.detach()}
