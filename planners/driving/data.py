"""Expert demonstrations: record, recover controls by inverse dynamics, cache, serve.

``record_demos`` drives seeded scenes with the expert, stores every agent's trajectory
and recovers the controlled agents' (accel, steer) from their states by inverse
dynamics (checked: re-simulating the recovered controls reproduces the states;
``meta["inverse_dynamics_max_error_m"]``). ``save_demos`` writes one safetensors file
plus a small JSON of metadata (never pickle); ``DemoDataset`` serves windows
(observation at tick t, the next ``horizon`` controls) as a ``flowrl.data.OfflineDataset``.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from safetensors.torch import load_file, save_file

from flowrl._fields import hfield
from flowrl.data import OfflineDataset
from planners.driving.dynamics import bicycle_rollout, inverse_dynamics, wheelbase_of
from planners.driving.expert import ExpertConfig, run_expert
from planners.driving.metrics import episode_metrics
from planners.driving.scenes import SCENE_KINDS, Scene, SceneConfig, make_scenes
from planners.driving.sim import DrivingEnv, DrivingEnvConfig, stack_records

Tensor = torch.Tensor
STATIC = [f.name for f in fields(Scene) if f.name not in ("agents", "agent_mask", "route_s")]


@dataclass
class DemoConfig:
    """Which demonstrations to record and how they are cut into training windows."""

    num_scenes: int = hfield(64, "scenes (seeds first_seed ...) driven by the expert")
    first_seed: int = hfield(0, "seed of the first scene")
    episode_steps: int = hfield(80, "ticks recorded per scene (10 Hz)")
    horizon: int = hfield(20, "control steps H per training window")
    stride: int = hfield(5, "ticks between window starts")
    expert_seed: int = hfield(0, "seed of the expert's parameters and noise")
    chunk: int = hfield(64, "scenes simulated together")
    yield_prob: float = hfield(0.0, "the expert's yield_prob: share of agents that yield at conflict points "
                                    "(ExpertConfig); 0 = the imperfect expert alone")

    def __post_init__(self) -> None:
        if not 0.0 <= self.yield_prob <= 1.0:
            raise ValueError(f"data.demos.yield_prob={self.yield_prob} is out of range; set it in [0, 1]")


@torch.no_grad()
def record_demos(config: DemoConfig, scene: Optional[SceneConfig] = None, expert: Optional[ExpertConfig] = None,
                 device: Any = "cpu") -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    """Drive the scenes with the expert -> (tensors, metadata).

    tensors: the static ``Scene`` fields [S, ...] plus
      agents_full [S, N, T_hist + E, 8] (history then every recorded tick),
      route_s [S, N, E + 1], ctrl_states [S, A, E + 1, 4], controls [S, A, E, 2].
    """
    env = DrivingEnv(DrivingEnvConfig(scene=scene or SceneConfig(), episode_steps=config.episode_steps), device)
    if expert is not None and expert.yield_prob != config.yield_prob:  # the cache key must describe the demos
        raise ValueError(f"expert.yield_prob={expert.yield_prob} differs from the demo config's {config.yield_prob}; "
                         "set it in DemoConfig.yield_prob")
    expert = expert or ExpertConfig(yield_prob=config.yield_prob)
    seeds = list(range(config.first_seed, config.first_seed + config.num_scenes))
    parts: List[Dict[str, Tensor]] = []
    per_kind: Dict[str, List[Dict[str, float]]] = {}
    max_err = 0.0
    for c0 in range(0, len(seeds), config.chunk):
        sc = make_scenes(seeds[c0:c0 + config.chunk], env.config.scene)
        state = env.reset_scene(sc)
        s0 = state.s[:, : state.num_slots].clone()
        final, out = run_expert(env, state, config.episode_steps, expert, seed=config.expert_seed + c0)
        wb = wheelbase_of(sc.agents[:, : sc.num_slots, -1, 5])
        controls = inverse_dynamics(out["ctrl_states"].cpu(), wb)
        replay = bicycle_rollout(out["ctrl_states"][..., 0, :].cpu(), controls, wb)
        valid = sc.controlled[:, : sc.num_slots]
        err = (replay[..., :2] - out["ctrl_states"][..., 1:, :2].cpu()).norm(dim=-1)[valid]
        max_err = max(max_err, float(err.max()) if err.numel() else 0.0)
        rec = stack_records(out["records"], final, env.config, s0)
        for k, name in enumerate(SCENE_KINDS):
            sel = sc.kind == k
            if bool(sel.any()):
                sub = type(rec)(**{f.name: getattr(rec, f.name)[sel] for f in fields(rec)})
                per_kind.setdefault(name, []).append({**episode_metrics(sub), "n": int((sub.valid).sum())})
        part = {k: getattr(sc, k).cpu() for k in STATIC}
        part.update(agents_full=torch.cat([sc.agents, out["agents"]], 2).cpu(), route_s=out["route_s"].cpu(),
                    ctrl_states=out["ctrl_states"].cpu(), controls=controls)
        parts.append(part)
    tensors = {k: _cat_padded([p[k] for p in parts], k) for k in parts[0]}
    meta = {
        "config": asdict(config), "scene": asdict(env.config.scene), "expert": asdict(expert),
        "inverse_dynamics_max_error_m": max_err, "expert_metrics": _merge(per_kind),
        "layout": "see planners/driving/data.py record_demos",
    }
    return tensors, meta


def _merge(per_kind: Dict[str, List[Dict[str, float]]]) -> Dict[str, Dict[str, float]]:
    out = {}
    for kind, rows in per_kind.items():
        n = sum(r["n"] for r in rows)
        out[kind] = {k: sum(r[k] * r["n"] for r in rows) / max(n, 1) for k in rows[0] if k != "n"}
        out[kind]["agents"] = n
    return out


def _cat_padded(xs: List[Tensor], name: str) -> Tensor:
    """Concatenate along scenes, padding the route dims (routes repeat their end)."""
    if name in ("routes", "lane_routes"):
        r = max(x.shape[2] for x in xs)
        xs = [torch.cat([x, x[:, :, -1:].expand(-1, -1, r - x.shape[2], -1)], 2) if x.shape[2] < r else x for x in xs]
    if name == "lane_routes":
        m = max(x.shape[1] for x in xs)
        xs = [torch.cat([x, x.new_zeros(x.shape[0], m - x.shape[1], *x.shape[2:])], 1) for x in xs]
    return torch.cat(xs, 0)


def save_demos(tensors: Dict[str, Tensor], meta: Dict[str, Any], directory: str) -> None:
    """Write ``demos.safetensors`` and ``meta.json`` into ``directory``."""
    os.makedirs(directory, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(directory, "demos.safetensors"))
    with open(os.path.join(directory, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=2)


def load_demos(directory: str) -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    with open(os.path.join(directory, "meta.json")) as fh:
        meta = json.load(fh)
    return load_file(os.path.join(directory, "demos.safetensors")), meta


def build_demos(directory: str, config: DemoConfig, scene: Optional[SceneConfig] = None,
                expert: Optional[ExpertConfig] = None) -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    """Load the cache in ``directory`` if it was recorded with ``config``, else record and save it."""
    meta_path = os.path.join(directory, "meta.json")
    if os.path.isfile(meta_path):
        tensors, meta = load_demos(directory)
        if meta.get("config") == asdict(config):
            return tensors, meta
    tensors, meta = record_demos(config, scene, expert)
    save_demos(tensors, meta, directory)
    return tensors, meta


class DemoDataset(OfflineDataset):
    """Windows of the demonstrations: item = observation ``Scene`` at tick t, x0 = the
    expert's next H controls [A, H, 2] (physical accel, steer).

    ``get(indices)`` returns (Scene batch, controls [B, A, H, 2], columns) with columns
    ego_state [B, A, 4], expert_states [B, A, H, 4] (states reached by the expert),
    agent_valid [B, A] (controlled slot in use), tick [B], scene_index [B].
    """

    def __init__(self, tensors: Dict[str, Tensor], horizon: int, stride: int, eval_fraction: float = 0.1):
        self.t = tensors
        self.horizon = horizon
        s, _, steps = tensors["controls"].shape[:3]
        starts = list(range(0, steps - horizon + 1, stride))
        n_eval = max(1, int(round(s * eval_fraction))) if s > 1 else 0
        self.train_scenes = list(range(s - n_eval))
        self.eval_scenes = list(range(s - n_eval, s))
        self.windows = [(i, t) for i in self.train_scenes for t in starts]

    @staticmethod
    def from_directory(directory: str, eval_fraction: float = 0.1) -> "DemoDataset":
        tensors, meta = load_demos(directory)
        return DemoDataset(tensors, meta["config"]["horizon"], meta["config"]["stride"], eval_fraction)

    def __len__(self) -> int:
        return len(self.windows)

    def observation(self, scene_idx: Tensor, tick: Tensor) -> Scene:
        """Scene batch at ticks ``tick`` [B] of scenes ``scene_idx`` [B]."""
        full = self.t["agents_full"][scene_idx]  # [B, N, T_hist + E, 8]
        t_hist = full.shape[2] - self.t["controls"].shape[2]
        idx = tick[:, None] + torch.arange(t_hist)[None]
        agents = torch.gather(full, 2, idx[:, None, :, None].expand(-1, full.shape[1], -1, full.shape[3]))
        route_s = torch.gather(self.t["route_s"][scene_idx], 2, tick[:, None, None].expand(-1, full.shape[1], 1))[..., 0]
        static = {k: self.t[k][scene_idx] for k in STATIC}
        return Scene(agents=agents, agent_mask=agents[:, :, -1, 7] > 0, route_s=route_s, **static)

    def get(self, indices: Tensor):
        pairs = [self.windows[int(i)] for i in indices]
        scene_idx = torch.tensor([p[0] for p in pairs])
        tick = torch.tensor([p[1] for p in pairs])
        obs = self.observation(scene_idx, tick)
        h = self.horizon
        steps = tick[:, None] + torch.arange(h)[None]
        ctrl = self.t["controls"][scene_idx]  # [B, A, E, 2]
        x0 = torch.gather(ctrl, 2, steps[:, None, :, None].expand(-1, ctrl.shape[1], -1, 2))
        st = self.t["ctrl_states"][scene_idx]
        ego = torch.gather(st, 2, tick[:, None, None, None].expand(-1, st.shape[1], 1, 4))[:, :, 0]
        reached = torch.gather(st, 2, (steps + 1)[:, None, :, None].expand(-1, st.shape[1], -1, 4))
        a = ctrl.shape[1]
        cols = {"ego_state": ego, "expert_states": reached, "agent_valid": obs.controlled[:, :a] & obs.agent_mask[:, :a],
                "tick": tick, "scene_index": scene_idx}
        return obs, x0, cols

    def eval_items(self) -> Sequence[int]:
        """Held-out scene seeds (the last ``eval_fraction`` of the recorded scenes)."""
        return [int(self.t["seed"][i]) for i in self.eval_scenes]
