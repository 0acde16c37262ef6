"""Data sources: MetaWorld's scripted experts, clean or corrupted in a known way.

Each source is a recipe for one episode: what the robot EXECUTES, what is LOGGED (the
action column of the dataset and the observations), given the expert's intended action.
Source labels are kept in the data for analysis and oracle baselines; methods must not
read them.

  clean       logged = executed = expert(obs)
  exec_noise  executed = expert + N(0, sigma^2) per step (sigma = 0.6), logged = expert (the
              noise is not recorded)
  embodiment  another robot: executed = gains * command (x sign-flipped, y at half gain); the
              operator compensates (command = expert / gains, clipped) and the log holds the
              commands, in that robot's convention; success stays high
  lag         actuation lag: executed at step t = command of step t - 4 (zeros before);
              logged = commands as issued
  recovery    recovery bursts: with prob 0.04 per step a burst of 8 random actions (logged and
              executed), then the expert recovers
  obs_noise   sensor noise N(0, 0.02^2) on positions (hand, objects) in the logged
              observations; the expert acts on the noisy observation
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from planners.robot.envs import ACTION_DIM, MetaWorldEnv, expert_action, expert_policy

SOURCES = ("clean", "exec_noise", "embodiment", "lag", "recovery", "obs_noise")
#: oracle quality of each source (1 = data to imitate); only the oracle baseline reads it
ORACLE_QUALITY = {"clean": 1.0, "exec_noise": 0.0, "embodiment": 0.0, "lag": 0.0, "recovery": 0.0, "obs_noise": 0.0}

_POS_DIMS = np.r_[0:3, 4:7, 11:14, 18:21, 22:25, 29:32]


@dataclass
class SourceParams:
    exec_sigma: float = 0.6
    gains: Sequence[float] = (-1.0, 0.5, 1.0, 1.0)
    lag: int = 4
    burst_prob: float = 0.04
    burst_len: int = 8
    obs_sigma: float = 0.02


@dataclass
class Episode:
    """One recorded episode. obs: [T+1, 39] (logged), actions: [T, 4] (logged),
    executed: [T, 4] (hidden truth), rewards / success: [T]."""

    task: str
    source: str
    seed: int
    obs: np.ndarray
    actions: np.ndarray
    executed: np.ndarray
    rewards: np.ndarray
    success: np.ndarray
    info: Dict[str, float] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return bool(self.success.any())


def run_episode(task: str, source: str, seed: int, max_steps: int = 150, extra_after_success: int = 10,
                params: Optional[SourceParams] = None, env: Optional[MetaWorldEnv] = None) -> Episode:
    """Roll the expert of ``task`` through ``source``'s corruption; deterministic in ``seed``."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    p = params or SourceParams()
    rng = np.random.default_rng([seed, SOURCES.index(source), 7])
    env = env or MetaWorldEnv(task, max_steps)
    policy = expert_policy(task)
    gains = np.asarray(p.gains, dtype=np.float64)
    obs = env.reset(seed)

    def observe(o: np.ndarray) -> np.ndarray:
        if source != "obs_noise":
            return o
        o = o.copy()
        o[_POS_DIMS] += p.obs_sigma * rng.standard_normal(len(_POS_DIMS))
        return o

    logged_obs = [observe(obs)]
    logged, executed, rewards, success = [], [], [], []
    queue: List[np.ndarray] = [np.zeros(ACTION_DIM)] * p.lag
    burst = 0
    stop_at = None
    for t in range(max_steps):
        a_star = expert_action(policy, logged_obs[-1])
        if source == "clean" or source == "obs_noise":
            cmd = exe = a_star
        elif source == "exec_noise":
            cmd, exe = a_star, np.clip(a_star + p.exec_sigma * rng.standard_normal(ACTION_DIM), -1, 1)
        elif source == "embodiment":
            cmd = np.clip(a_star / gains, -1, 1)
            exe = np.clip(gains * cmd, -1, 1)
        elif source == "lag":
            cmd = a_star
            queue.append(cmd)
            exe = queue.pop(0)
        else:  # recovery
            if burst == 0 and rng.random() < p.burst_prob:
                burst = p.burst_len
            if burst > 0:
                cmd = exe = rng.uniform(-1, 1, ACTION_DIM)
                burst -= 1
            else:
                cmd = exe = a_star
        obs, r, ok = env.step(exe)
        logged.append(cmd)
        executed.append(exe)
        rewards.append(r)
        success.append(ok)
        logged_obs.append(observe(obs))
        if ok and stop_at is None:
            stop_at = t + extra_after_success
        if stop_at is not None and t >= stop_at:
            break
    return Episode(task, source, int(seed), np.stack(logged_obs).astype(np.float32),
                   np.stack(logged).astype(np.float32), np.stack(executed).astype(np.float32),
                   np.asarray(rewards, dtype=np.float32), np.asarray(success, dtype=bool))


def generate(task: str, source: str, seeds: Sequence[int], max_steps: int = 150,
             params: Optional[SourceParams] = None) -> List[Episode]:
    env = MetaWorldEnv(task, max_steps)
    out = []
    for s in seeds:
        t0 = time.perf_counter()
        ep = run_episode(task, source, s, max_steps, params=params, env=env)
        ep.info["gen_s"] = time.perf_counter() - t0
        out.append(ep)
    return out
