"""The two-layer MDP's side of the Trainer: closed-loop rollouts for training and the
closed-loop evaluation (the environment is the reward). Functions of a ``Trainer``."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Dict, List, Optional, Sequence

import torch

from flowrl import rng
from flowrl.mdp import ClosedLoop
from flowrl.registry import ConfigError

Tensor = torch.Tensor


def rollout(trainer, it: int, items, samples: Sequence[int], group: int, group_ids: Tensor, sample_ids: Tensor):
    """Two-layer rollout. Without candidates, each (episode, env step) chain becomes a row
    whose reward is the episode's return (the environment is the reward) and groups
    are the episodes of an item; with the environment's ``candidates_per_state`` = G
    (which must equal the algorithm's group size), each item runs ONE episode, every
    state gets G scored candidates (the best is executed) and a group is one
    (episode, env step). Rows after an episode ended are invalid. Returns (rollout
    dict, CompositeOutput-like, group ids [rows], sample ids [rows])."""
    from rewards.base import CompositeOutput

    c = trainer.cfg
    cand = int(getattr(c.env, "candidates_per_state", 0) or 0)
    e = c.env.num_env_steps
    if cand and cand != group:
        raise ConfigError(f"algorithm.group_size: per-state groups need group_size == env.candidates_per_state "
                          f"({group} != {cand}); set both to the same G")
    loop = ClosedLoop(trainer.head, trainer.sampler, trainer.chain, e, velocity_fn=trainer.model, candidates_per_state=cand,
                      stochastic=trainer.chain.stochastic_steps(it), ode_sampler=trainer.ode_sampler)
    if cand:  # one episode per item; candidates (not episodes) fill the group
        keep = [i for i, j in enumerate(samples) if j % group == 0]
        prompts = [samples[i] // group for i in keep]
        items = [items[i] for i in keep]

        def gens(env_step: int):
            return [rng.generator(c.seed, rng.STREAM_CHAIN, it, p, m, env_step) for p in prompts for m in range(cand)]

        def init_gens(env_step: int):  # the algorithm's shared_init_noise: one starting noise per state
            return [rng.generator(c.seed, rng.STREAM_INIT, it, p, -1, env_step) for p in prompts for _ in range(cand)]

        seeds = [rng.derive_seed(c.seed, rng.STREAM_INIT, it, p) for p in prompts]
        res = loop.rollout(trainer.env, items, seeds, gens, init_gens if trainer.algorithm.shared_init_noise else None)
        total, valid = res.scores.float(), res.score_valid
        state_ids = (group_ids[keep].repeat_interleave(e) * e + torch.arange(e).repeat(len(keep)))
        group_ids = state_ids.repeat_interleave(cand)
        sample_ids = group_ids * cand + torch.arange(cand).repeat(len(keep) * e)
        per, per_valid = {"candidate": total}, {"candidate": valid}
    else:
        def gens(env_step: int):
            return [rng.generator(c.seed, rng.STREAM_CHAIN, it, j // group, j % group, env_step) for j in samples]

        def init_gens(env_step: int):  # shared_init_noise: the episodes of an item start each chain alike
            return [rng.generator(c.seed, rng.STREAM_INIT, it, j // group, -1, env_step) for j in samples]

        seeds = [rng.derive_seed(c.seed, rng.STREAM_INIT, it, j // group) for j in samples]
        res = loop.rollout(trainer.env, items, seeds, gens, init_gens if trainer.algorithm.shared_init_noise else None)
        total = res.returns.repeat_interleave(e, dim=0).float()
        valid = res.alive.view(-1, *([1] * (total.ndim - 1))).expand_as(total)
        group_ids, sample_ids = group_ids.repeat_interleave(e), sample_ids.repeat_interleave(e)
        per, per_valid = {"return": total}, {"return": valid}
    metrics = {"episode_return": float(res.returns.float().mean())}
    scored = CompositeOutput(total, valid, per, per_valid, metrics)
    out = {"states": res.states, "times": res.times, "log_probs": res.log_probs, "velocities": None,
           "cond": res.cond}
    return out, scored, group_ids, sample_ids


def metric_sum(value, episodes: float) -> List[float]:
    """An ``episode_metrics`` value -> [weighted sum, weight]: a float counts once per
    episode, a (mean, weight) pair with its own weight (e.g. the number of agents)."""
    if isinstance(value, (tuple, list)):
        mean, weight = float(value[0]), float(value[1])
        return [mean * weight if weight > 0 else 0.0, weight]
    return [float(value) * episodes, episodes]


@torch.no_grad()
def evaluate(trainer, seed: int, tag: Optional[str] = None) -> Dict[str, float]:
    """Mean episode return on the eval items with the evaluation sampler (one chain per
    state, no candidates: the planner's own quality; with ``eval.best_of`` = G, G chains per
    state and the environment executes the best: the headroom oracle), plus the environment's
    ``episode_metrics(state)`` when it has them (a float is averaged over episodes, a
    (mean, weight) pair by its weight, so that per-agent or per-subset means stay exact
    across processes; a key whose total weight is 0 is left out), and its
    ``save_rollouts(state, output_dir, tag)`` drawings (main process) when ``tag`` is given."""
    c = trainer.cfg
    all_items = list(trainer.data.eval_items())[: c.eval.num_items]
    spi = c.eval.samples_per_item
    mine = list(range(trainer.rank, len(all_items) * spi, trainer.world))
    times = trainer.eval_times()
    g = c.eval.best_of
    loop = ClosedLoop(trainer.head, trainer.eval_sampler, trainer.chain, c.env.num_env_steps,
                      velocity_fn=trainer.model, times=times, candidates_per_state=g if g > 1 else 0)
    n_plain = len(all_items) * spi

    def streams(j: int) -> List[int]:
        """Candidate 0 of episode j draws what best_of 1 draws (stream j); the others draw
        streams past all of those."""
        return [j] + [n_plain + j * (g - 1) + k for k in range(g - 1)]

    ctx = trainer.ema.applied() if trainer.ema is not None else nullcontext()
    with ctx:
        res = loop.rollout(trainer.env, [all_items[j // spi] for j in mine],
                           [rng.derive_seed(seed, rng.STREAM_EVAL, j) for j in mine],
                           lambda e: [rng.generator(seed, rng.STREAM_EVAL, s, e) for j in mine for s in streams(j)])
    ret = res.returns.float().reshape(len(mine), -1).mean(dim=1)
    extra = trainer.env.episode_metrics(res.final_state) if hasattr(trainer.env, "episode_metrics") and mine else {}
    n = float(len(mine))
    sums = {"return": [float(ret.sum()), n], **{k: metric_sum(v, n) for k, v in extra.items()}}
    total = trainer._all_sum_dict(sums)  # keys may differ between ranks (a rank with no episodes)
    out = {k: total[k][0] / max(total[k][1], 1e-12) for k in ["return"] + sorted(set(total) - {"return"})
           if k == "return" or total[k][1] > 0}
    if tag is not None and trainer.is_main and hasattr(trainer.env, "save_rollouts"):
        trainer.env.save_rollouts(res.final_state, c.output_dir, tag)
    return out
