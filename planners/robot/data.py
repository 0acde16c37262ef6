"""Robot datasets: pretraining (clean experts on source tasks) and target mixes, cached to disk.

Cache format: ``<name>.safetensors`` (concatenated per-step arrays) + ``<name>.json``
(episode table, per-source success rates, generation timing, the recipe). No pickle.

``RobotDataset`` turns episodes into training windows for the action-chunk head:
  item    {"obs": [n_obs, 39] float32 (history, first frame repeated at the start), "task": int}
  x0      [H, 4] normalised logged action chunk a[t : t+H] (last action repeated past the end)
  columns per window [N]: episode, source (analysis only), task, ep_success, oracle,
          reward (dense reward at t), ret_to_go (dense, undiscounted within the episode), t
and ``weight`` (plus ``ptr_score`` for PTR) from the data config's weighting; for the PTR
scorer, ``consequences``: the logged change obs[t+Ta] - obs[t] over
the robot-centred dims (hand xyz, gripper, object 1 xyz) — the observed post-action outcome.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from flowrl._fields import hfield
from flowrl.data import OfflineDataset
from flowrl.registry import DATASETS
from planners.robot.envs import SOURCE_TASKS, task_id
from planners.robot.sources import ORACLE_QUALITY, SOURCES, Episode, generate
from planners.robot.weighting import WeightingConfig, apply_weighting

Tensor = torch.Tensor

#: episode share per source in each target mix
MIXES: Dict[str, Dict[str, float]] = {
    "mostly_clean": {"clean": 0.7, "exec_noise": 0.06, "embodiment": 0.06, "lag": 0.06, "recovery": 0.06, "obs_noise": 0.06},
    "adversarial": {"clean": 0.2, "exec_noise": 0.16, "embodiment": 0.16, "lag": 0.16, "recovery": 0.16, "obs_noise": 0.16},
    "embodiment_heavy": {"clean": 0.3, "exec_noise": 0.05, "embodiment": 0.5, "lag": 0.05, "recovery": 0.05, "obs_noise": 0.05},
    "clean": {"clean": 1.0},
}
CONSEQUENCE_DIMS = (0, 1, 2, 3, 4, 5, 6)
EVAL_SEED0 = 100_000  # evaluation seeds start here; data seeds stay below


def mix_counts(mix: str, n: int) -> Dict[str, int]:
    if mix not in MIXES:
        raise ValueError(f"unknown mix {mix!r}; choose one of {', '.join(MIXES)}")
    shares = MIXES[mix]
    raw = {k: shares[k] * n for k in shares}
    counts = {k: int(np.floor(v)) for k, v in raw.items()}
    for k in sorted(raw, key=lambda k: counts[k] - raw[k])[: n - sum(counts.values())]:
        counts[k] += 1
    return counts


def data_seed(task: str, source: str, i: int, salt: int = 0) -> int:
    h = hashlib.sha256(f"{task}|{source}|{i}|{salt}".encode()).digest()
    return int.from_bytes(h[:4], "little") % EVAL_SEED0


def build_episodes(spec: Dict[str, Any]) -> List[Episode]:
    """spec: {"kind": "pretrain", "tasks": [...], "episodes_per_task": n} or
    {"kind": "target", "task": t, "mix": m, "episodes": n}; plus "max_steps", "salt"."""
    ms, salt = int(spec.get("max_steps", 150)), int(spec.get("salt", 0))
    eps: List[Episode] = []
    if spec["kind"] == "pretrain":
        for task in spec["tasks"]:
            seeds = [data_seed(task, "clean", i, salt) for i in range(spec["episodes_per_task"])]
            eps += generate(task, "clean", seeds, ms)
    else:
        for source, n in mix_counts(spec["mix"], spec["episodes"]).items():
            seeds = [data_seed(spec["task"], source, i, salt) for i in range(n)]
            eps += generate(spec["task"], source, seeds, ms)
    return eps


def save_episodes(path: str, eps: List[Episode], meta: Dict[str, Any]) -> None:
    """``path``.safetensors + ``path``.json, written atomically."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tensors = {
        "obs": torch.from_numpy(np.concatenate([e.obs for e in eps])),
        "actions": torch.from_numpy(np.concatenate([e.actions for e in eps])),
        "executed": torch.from_numpy(np.concatenate([e.executed for e in eps])),
        "rewards": torch.from_numpy(np.concatenate([e.rewards for e in eps])),
        "success": torch.from_numpy(np.concatenate([e.success for e in eps]).astype(np.uint8)),
    }
    table = [{"task": e.task, "source": e.source, "seed": e.seed, "steps": int(len(e.actions)),
              "succeeded": e.succeeded, "gen_s": round(float(e.info.get("gen_s", 0.0)), 4)} for e in eps]
    per_source: Dict[str, Dict[str, float]] = {}
    for s in SOURCES:
        rows = [r for r in table if r["source"] == s]
        if rows:
            per_source[s] = {"episodes": len(rows), "success_rate": float(np.mean([r["succeeded"] for r in rows]))}
    meta = {**meta, "episodes": table, "per_source": per_source,
            "gen_s_per_episode": float(np.mean([r["gen_s"] for r in table]))}
    save_file({k: v.contiguous() for k, v in tensors.items()}, path + ".safetensors.tmp")
    os.replace(path + ".safetensors.tmp", path + ".safetensors")
    with open(path + ".json.tmp", "w") as fh:
        json.dump(meta, fh, indent=1)
    os.replace(path + ".json.tmp", path + ".json")


def load_episodes(path: str) -> Tuple[List[Episode], Dict[str, Any]]:
    t = {k: v.numpy() for k, v in load_file(path + ".safetensors").items()}
    with open(path + ".json") as fh:
        meta = json.load(fh)
    eps, o, a = [], 0, 0
    for r in meta["episodes"]:
        n = r["steps"]
        eps.append(Episode(r["task"], r["source"], r["seed"], t["obs"][o:o + n + 1], t["actions"][a:a + n],
                           t["executed"][a:a + n], t["rewards"][a:a + n], t["success"][a:a + n].astype(bool)))
        o, a = o + n + 1, a + n
    return eps, meta


def cached_episodes(spec: Dict[str, Any], cache_dir: str) -> Tuple[List[Episode], Dict[str, Any]]:
    """Generate the episodes of ``spec`` once and reuse the cache afterwards."""
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    name = spec["kind"] if spec["kind"] == "pretrain" else f"{spec['task']}_{spec['mix']}"
    path = os.path.join(cache_dir, f"{name}_{key}")
    if not os.path.isfile(path + ".json"):
        t0 = time.perf_counter()
        eps = build_episodes(spec)
        save_episodes(path, eps, {"spec": spec, "gen_s_total": time.perf_counter() - t0})
    return load_episodes(path)


def pretrain_spec(episodes_per_task: int = 30, tasks: Sequence[str] = SOURCE_TASKS, max_steps: int = 150) -> Dict[str, Any]:
    return {"kind": "pretrain", "tasks": list(tasks), "episodes_per_task": int(episodes_per_task), "max_steps": max_steps}


def target_spec(task: str, mix: str, episodes: int = 60, max_steps: int = 150, salt: int = 0) -> Dict[str, Any]:
    return {"kind": "target", "task": task, "mix": mix, "episodes": int(episodes), "max_steps": max_steps, "salt": salt}


# --------------------------------------------------------------------------- windows
class RobotDataset(OfflineDataset):
    """Training windows over episodes (see the module docstring for the layout)."""

    def __init__(self, episodes: List[Episode], horizon: int = 8, n_obs: int = 2, exec_steps: int = 4,
                 action_stats: Optional[Tuple[Tensor, Tensor]] = None, eval_seeds: Sequence[int] = ()):
        if not episodes:
            raise ValueError("RobotDataset needs at least one episode")
        self.horizon, self.n_obs, self.exec_steps = horizon, n_obs, exec_steps
        self.episodes = episodes
        self._eval_seeds = list(eval_seeds)
        ctx, chunks, cons, cols = [], [], [], {k: [] for k in
                                                         ("episode", "source", "task", "ep_success", "oracle", "reward", "ret_to_go", "t")}
        for ei, e in enumerate(episodes):
            T = len(e.actions)
            tt = np.arange(T)
            hist = np.stack([np.clip(tt - k, 0, None) for k in range(n_obs - 1, -1, -1)], 1)  # [T, n_obs]
            ctx.append(e.obs[hist])
            ai = np.clip(tt[:, None] + np.arange(horizon)[None], 0, T - 1)
            chunks.append(e.actions[ai])
            after = np.clip(tt + exec_steps, 0, T)
            cons.append(e.obs[after][:, CONSEQUENCE_DIMS] - e.obs[tt][:, CONSEQUENCE_DIMS])
            rtg = np.cumsum(e.rewards[::-1])[::-1]
            for k, v in (("episode", ei), ("source", SOURCES.index(e.source)), ("task", task_id(e.task)),
                         ("ep_success", float(e.succeeded)), ("oracle", ORACLE_QUALITY[e.source])):
                cols[k].append(np.full(T, v))
            cols["reward"].append(e.rewards)
            cols["ret_to_go"].append(rtg)
            cols["t"].append(tt)
        self.obs = torch.from_numpy(np.concatenate(ctx)).float()            # [N, n_obs, 39]
        self.actions = torch.from_numpy(np.concatenate(chunks)).float()     # [N, H, 4] raw
        self.consequences = torch.from_numpy(np.concatenate(cons)).float()  # [N, C]
        self.columns: Dict[str, Tensor] = {}
        for k, v in cols.items():
            arr = np.concatenate(v)
            self.columns[k] = torch.from_numpy(arr).long() if k in ("episode", "source", "task", "t") else torch.from_numpy(arr.astype(np.float32))
        if action_stats is None:
            flat = self.actions.reshape(-1, self.actions.shape[-1])
            action_stats = (flat.mean(0), flat.std(0).clamp(min=1e-2))
        self.action_mean, self.action_std = (torch.as_tensor(s, dtype=torch.float32) for s in action_stats)

    def __len__(self) -> int:
        return self.obs.shape[0]

    def set_column(self, name: str, values: Tensor) -> None:
        """Attach a per-window column (e.g. PTR weights) that ``get`` returns."""
        values = torch.as_tensor(values).float()
        if values.shape != (len(self),):
            raise ValueError(f"column {name} must be [{len(self)}], got {tuple(values.shape)}")
        self.columns[name] = values

    def items(self, indices: Tensor) -> List[Dict[str, Any]]:
        return [{"obs": self.obs[i], "task": int(self.columns["task"][i])} for i in indices.tolist()]

    def normalised_actions(self, indices: Tensor) -> Tensor:
        return (self.actions[indices] - self.action_mean) / self.action_std

    def get(self, indices: Tensor):
        indices = torch.as_tensor(indices, dtype=torch.long)
        return self.items(indices), self.normalised_actions(indices), {k: v[indices] for k, v in self.columns.items()}

    def eval_items(self) -> Sequence[Any]:
        return self._eval_seeds

    def report(self, output_dir: str) -> Dict[str, Any]:
        """Write the weighting diagnostics (weights.json) and the weight-mass-per-source bar
        chart (weight_mass.png) to ``output_dir``; returns the diagnostics."""
        from planners.robot.weighting import plot_weight_mass

        diag = dict(getattr(self, "diagnostics", {}))
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, "weights.json.tmp"), "w") as fh:
            json.dump(diag, fh, indent=1)
        os.replace(os.path.join(output_dir, "weights.json.tmp"), os.path.join(output_dir, "weights.json"))
        if any(k.startswith("weights/share/") for k in diag):
            plot_weight_mass(diag, os.path.join(output_dir, "weight_mass.png"), str(diag.get("data/task", "")))
        return diag

    def stats(self) -> Dict[str, Tensor]:
        """Normalisation statistics for the head: obs mean/std [39], action mean/std [4]."""
        flat = self.obs[:, -1]
        return {"obs_mean": flat.mean(0), "obs_std": flat.std(0).clamp(min=1e-3),
                "action_mean": self.action_mean.clone(), "action_std": self.action_std.clone()}


# --------------------------------------------------------------------------- registry
@dataclass
class RobotDataConfig:
    """MetaWorld offline data (generated from scripted experts on first use, then cached),
    with a per-window ``weight`` column from ``weighting`` (see planners/robot/weighting.py)."""

    name: str = hfield("metaworld", "data source name")
    kind: str = hfield("target", "pretrain (clean experts on the source tasks) or target (a mix on a held-out task)")
    task: str = hfield("push-v3", "target task (kind=target)")
    mix: str = hfield("adversarial", "target mix: mostly_clean, adversarial, embodiment_heavy, clean")
    episodes: int = hfield(60, "target episodes (kind=target)")
    episodes_per_task: int = hfield(30, "clean episodes per source task (the pretraining data; PTR's scorer data)")
    max_steps: int = hfield(150, "episode length cap")
    salt: int = hfield(0, "changes every data seed (a fresh draw of the same recipe)")
    cache_dir: str = hfield("outputs/robot_data", "where generated episodes are cached (safetensors + json)")
    horizon: int = hfield(8, "action chunk length H (must match the head)")
    n_obs: int = hfield(2, "observation history length (must match the head)")
    exec_steps: int = hfield(4, "actions executed per chunk Ta (the consequence horizon)")
    stats_from: Optional[str] = hfield(None, "head folder whose action statistics normalise x0 (None = this data's own)")
    num_eval: int = hfield(25, "evaluation episodes (layout seeds eval_seed0, eval_seed0 + 1, ...)")
    eval_seed0: int = hfield(EVAL_SEED0, "first evaluation layout seed (data seeds stay below 100000; use "
                                         "200000+ for a validation split that is not the evaluation seeds)")
    weighting: WeightingConfig = hfield(default_factory=WeightingConfig, help="per-window weight column (kind=target)")

    def __post_init__(self) -> None:
        if isinstance(self.weighting, dict):
            self.weighting = WeightingConfig(**self.weighting)
        if self.kind not in ("pretrain", "target"):
            raise ValueError("data.kind must be 'pretrain' or 'target'")
        if self.kind == "target" and self.mix not in MIXES:
            raise ValueError(f"data.mix must be one of {', '.join(MIXES)}")
        if self.kind == "target":
            task_id(self.task)
        if self.num_eval < 1:
            raise ValueError("data.num_eval must be >= 1")


def eval_items(c: RobotDataConfig) -> List[Dict[str, Any]]:
    """Fixed evaluation episodes: {"task", "seed"}; pretraining data evaluates on the source
    tasks in turn, target data on its task."""
    tasks = list(SOURCE_TASKS) if c.kind == "pretrain" else [c.task]
    return [{"task": tasks[i % len(tasks)], "seed": c.eval_seed0 + i} for i in range(c.num_eval)]


def build_dataset(c: RobotDataConfig) -> RobotDataset:
    pspec = pretrain_spec(c.episodes_per_task, max_steps=c.max_steps)
    spec = pspec if c.kind == "pretrain" else target_spec(c.task, c.mix, c.episodes, c.max_steps, c.salt)
    eps, _ = cached_episodes(spec, c.cache_dir)
    stats = None
    if c.stats_from:
        t = load_file(os.path.join(c.stats_from, "stats.safetensors"))
        stats = (t["action_mean"], t["action_std"])
    ds = RobotDataset(eps, c.horizon, c.n_obs, c.exec_steps, stats, eval_seeds=eval_items(c))
    if c.kind == "target":
        def pretrain_dataset() -> RobotDataset:
            return RobotDataset(cached_episodes(pspec, c.cache_dir)[0], c.horizon, c.n_obs, c.exec_steps, stats)

        ctx = {"pretrain_spec": pspec, "cache_dir": c.cache_dir, "pretrain_dataset": pretrain_dataset}
        ds.diagnostics = {"data/task": c.task, "data/mix": c.mix, **apply_weighting(ds, c.weighting, ctx)}
    else:
        ds.set_column("weight", torch.ones(len(ds)))
        ds.diagnostics = {"weights/method": "uniform"}
    return ds


DATASETS.register("metaworld", RobotDataConfig, help="MetaWorld expert data (pretraining or a target mix) with a "
                                                     "per-window weight column (uniform/oracle/filtered/awr/ptr)")(build_dataset)
