"""MetaWorld (v3) wrapper: seeded reset, state observations, dense reward, success flag.

Needs the ``robot`` extra (metaworld 3.x with mujoco 3.3.x; runs headless on the CPU).
Observations are MetaWorld's 39-d goal-observable state vector: hand xyz (0:3), gripper
opening (3), object 1 pose (4:11), object 2 pose (11:18), the previous frame's copy of
0:18 (18:36) and the goal (36:39). Actions are 4-d in [-1, 1]: hand delta xyz (x 1 cm per
unit) and gripper effort. A reset with the same seed gives the same object / goal layout.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from flowrl._fields import hfield
from flowrl.registry import ENVIRONMENTS

OBS_DIM = 39
ACTION_DIM = 4
HAND = slice(0, 3)
GRIPPER = 3
OBJ = slice(4, 7)

#: tasks the pretraining (clean expert) data covers
SOURCE_TASKS: Tuple[str, ...] = (
    "reach-v3", "push-wall-v3", "pick-place-wall-v3", "door-close-v3", "drawer-open-v3",
    "button-press-topdown-v3", "window-open-v3", "plate-slide-v3", "sweep-v3",
)
#: held-out adaptation tasks
TARGET_TASKS: Tuple[str, ...] = ("push-v3", "pick-place-v3", "door-open-v3")
#: the fixed task vocabulary of the head's task embedding (index = task id)
TASKS: Tuple[str, ...] = SOURCE_TASKS + TARGET_TASKS


def task_id(task: str) -> int:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    return TASKS.index(task)


def _import_metaworld():
    try:
        import metaworld  # noqa: F401
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
        from metaworld import policies
    except ImportError as e:  # pragma: no cover - depends on the extra
        raise ImportError("MetaWorld is missing: pip install 'flowrl[robot]' "
                          "(metaworld>=3.1,<4 with mujoco>=3.3,<3.4)") from e
    return ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE, policies


def expert_policy(task: str):
    """MetaWorld's scripted expert for ``task`` (an object with ``get_action(obs)``)."""
    _, policies = _import_metaworld()
    name = "Sawyer" + "".join(p.capitalize() for p in task.replace("-v3", "").split("-")) + "V3Policy"
    return getattr(policies, name)()


class MetaWorldEnv:
    """One MetaWorld task. ``reset(seed) -> obs [39]``; ``step(a) -> (obs, reward, success)``."""

    def __init__(self, task: str, max_steps: int = 150):
        envs, _ = _import_metaworld()
        task_id(task)
        self.task = task
        self.max_steps = int(max_steps)
        self.env = envs[f"{task}-goal-observable"](seed=0)
        self.t = 0

    def reset(self, seed: int) -> np.ndarray:
        e = self.env
        e._freeze_rand_vec = False
        e.seeded_rand_vec = True
        e.seed(int(seed))
        obs, _ = e.reset()
        e._freeze_rand_vec = True
        self.t = 0
        return np.asarray(obs, dtype=np.float64)

    def step(self, action: np.ndarray) -> Tuple[np.ndarray, float, bool]:
        a = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        obs, reward, _, _, info = self.env.step(a)
        self.t += 1
        return np.asarray(obs, dtype=np.float64), float(reward), bool(info["success"] > 0.5)


def expert_action(policy, obs: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.clip(np.asarray(policy.get_action(obs), dtype=np.float64), -1.0, 1.0)


def evaluate_policy(task: str, act: Callable[[List[np.ndarray], List[int]], List[np.ndarray]],
                    seeds: Sequence[int], max_steps: int = 150, exec_steps: int = 1) -> dict:
    """Closed-loop success rate of a batched policy over ``seeds`` (one env per seed).

    ``act(histories, alive_idx)`` gets each live env's observation history (list of [t+1, 39]
    arrays) and returns, per env, an action array [k, 4]; the first ``exec_steps`` rows run.
    Returns {"success": mean, "return": mean dense return, "per_seed": [...]} .
    """
    envs = [MetaWorldEnv(task, max_steps) for _ in seeds]
    hist = [[e.reset(s)] for e, s in zip(envs, seeds)]
    done = [False] * len(envs)
    succ = [False] * len(envs)
    ret = [0.0] * len(envs)
    t = 0
    while t < max_steps and not all(done):
        alive = [i for i in range(len(envs)) if not done[i]]
        acts = act([np.stack(hist[i]) for i in alive], alive)
        for i, a in zip(alive, acts):
            for k in range(min(exec_steps, len(a))):
                if t + k >= max_steps:
                    break
                obs, r, ok = envs[i].step(a[k])
                hist[i].append(obs)
                ret[i] += r
                if ok:
                    succ[i] = True
                    done[i] = True
                    break
        t += exec_steps
    return {"success": float(np.mean(succ)), "return": float(np.mean(ret)), "per_seed": [bool(s) for s in succ]}


# --------------------------------------------------------------------------- closed-loop environment


@dataclass
class MetaWorldEnvConfig:
    """Batched MetaWorld episodes for closed-loop evaluation (flowrl's Environment protocol)."""

    name: str = hfield("metaworld", "environment name")
    task: Optional[str] = hfield(None, "MetaWorld task (e.g. push-v3); None = each item's own 'task'")
    max_steps: int = hfield(150, "simulator steps per episode (MetaWorld's 150-step horizon for these tasks)")
    exec_steps: int = hfield(4, "actions of each planned chunk executed before replanning (Ta, <= the head's horizon)")
    n_obs: int = hfield(2, "observation history handed to the head (must match head.n_obs)")

    def __post_init__(self) -> None:
        if self.task is not None:
            task_id(self.task)
        if self.max_steps < 1 or not 1 <= self.exec_steps <= self.max_steps or self.n_obs < 1:
            raise ValueError("env.max_steps >= 1, 1 <= env.exec_steps <= env.max_steps and env.n_obs >= 1 required")

    @property
    def num_env_steps(self) -> int:
        """Outer (replanning) steps per episode: ceil(max_steps / exec_steps)."""
        return -(-self.max_steps // self.exec_steps)


@dataclass
class EpisodeBatch:
    """State of B MetaWorld episodes: the simulators, observation histories (lists of [39]
    arrays), per-episode success / return / steps taken and whether each has ended."""

    envs: List[MetaWorldEnv]
    tasks: List[str]
    hist: List[List[np.ndarray]]
    success: np.ndarray
    returns: np.ndarray
    steps: np.ndarray
    done: np.ndarray


class MetaWorldBatchEnv:
    """flowrl ``Environment`` over MetaWorld: one simulator per episode of the batch.

    * ``reset(batch, seeds)``: an item is an int (layout seed; task from the config), a dict
      {"task": name or id, "seed": layout seed} (the robot data source's evaluation items),
      or anything else (the trainer's derived seed is used then). The item's own seed wins,
      so evaluation layouts are the fixed seeds 100000, 100001, ... whatever the run seed.
    * ``observe(state)``: [{"obs": [n_obs, 39] float32, "task": id}] per episode.
    * ``step(state, chunk [B, H, 4])``: runs the first ``exec_steps`` actions of each live
      episode; reward [B] = dense MetaWorld reward summed over the executed steps; done [B]
      = success or the step cap. Finished episodes are left alone (reward 0).
    * ``episode_metrics(state)``: {"success": success rate, "return": mean dense return,
      "steps": mean episode length}.
    Simulators are pooled per task and reused across resets (construction costs ~0.2 s).
    """

    def __init__(self, config: MetaWorldEnvConfig):
        self.config = config
        self._pool: dict = {}

    def _envs(self, tasks: Sequence[str]) -> List[MetaWorldEnv]:
        out, used = [], {}
        for t in tasks:
            pool = self._pool.setdefault(t, [])
            k = used.get(t, 0)
            if k == len(pool):
                pool.append(MetaWorldEnv(t, self.config.max_steps))
            out.append(pool[k])
            used[t] = k + 1
        return out

    def _parse(self, item: Any, seed: int) -> Tuple[str, int]:
        task, s = self.config.task, int(seed)
        if isinstance(item, dict):
            if item.get("task") is not None and self.config.task is None:
                t = item["task"]
                task = TASKS[int(t)] if not isinstance(t, str) else t
            if item.get("seed") is not None:
                s = int(item["seed"])
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            s = int(item)
        if task is None:
            raise ValueError("MetaWorldBatchEnv: set env.task or pass items with a 'task' key")
        return task, s

    def reset(self, batch: Sequence[Any], seeds: Sequence[int]) -> EpisodeBatch:
        parsed = [self._parse(b, s) for b, s in zip(batch, seeds)]
        tasks = [p[0] for p in parsed]
        envs = self._envs(tasks)
        hist = [[e.reset(s)] for e, (_, s) in zip(envs, parsed)]
        b = len(batch)
        return EpisodeBatch(envs, tasks, hist, np.zeros(b, bool), np.zeros(b), np.zeros(b, int), np.zeros(b, bool))

    def observe(self, state: EpisodeBatch) -> List[dict]:
        n = self.config.n_obs
        out = []
        for h, t in zip(state.hist, state.tasks):
            frames = h[-n:]
            frames = [frames[0]] * (n - len(frames)) + frames
            out.append({"obs": torch.from_numpy(np.stack(frames).astype(np.float32)), "task": task_id(t)})
        return out

    def step(self, state: EpisodeBatch, action) -> Tuple[EpisodeBatch, torch.Tensor, torch.Tensor]:
        a = torch.as_tensor(action).detach().float().cpu().numpy()
        if a.ndim == 2:  # a single action per episode
            a = a[:, None]
        b = len(state.envs)
        reward = np.zeros(b)
        for i in range(b):
            if state.done[i]:
                continue
            for k in range(min(self.config.exec_steps, a.shape[1])):
                obs, r, ok = state.envs[i].step(a[i, k])
                state.hist[i].append(obs)
                reward[i] += r
                state.steps[i] += 1
                if ok:
                    state.success[i] = True
                if ok or state.steps[i] >= self.config.max_steps:
                    state.done[i] = True
                    break
        state.returns += reward
        return state, torch.from_numpy(reward).float(), torch.from_numpy(state.done.copy())

    def episode_metrics(self, state: EpisodeBatch) -> dict:
        return {"success": float(state.success.mean()), "return": float(state.returns.mean()),
                "steps": float(state.steps.mean())}


ENVIRONMENTS.register("metaworld", MetaWorldEnvConfig,
                      help="MetaWorld v3 episodes (closed-loop evaluation: success rate, dense return)")(MetaWorldBatchEnv)
