"""The denoising chain as a Markov decision process.

* ``time_grid``: the K+1 times of a chain (uniform or SD3-style shifted), t_0 = 1 -> t_K = 0.
* ``DenoisingChain``: the grid plus the trainable-step window (train only a subset of
  steps, as MixGRPO / Flow-GRPO-Fast do) and the two views of an action:
  - step level (GRPO family): one action = one transition x_{t_k} -> x_{t_{k+1}};
  - trajectory level (FDFO, PTR): one action = the whole chain.
* ``sample_chain``: run a chain with a head and a stateless sampler, recording what the
  algorithm needs (states, log-probs, velocities).
* ``ClosedLoop``: the two-layer MDP (SCORP / DPPO construction): an outer environment step
  wraps a whole inner chain; each (episode, env step) chain becomes one row of a
  Trajectory whose reward is the episode's return, so step-level algorithms apply as is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch

from flowrl._fields import hfield
from flowrl.samplers.base import Sampler
from flowrl.types import Trajectory

Tensor = torch.Tensor


def time_grid(num_steps: int, shift: Optional[float] = 1.0) -> Tensor:
    """[K+1] decreasing times from 1 to 0.

    shift = 1 gives the uniform grid; shift > 1 gives SD3's shifted sigmas
    t' = shift * t / (1 + (shift - 1) * t), which spends more steps at high noise.
    """
    if num_steps < 1:
        raise ValueError("chain.num_steps must be >= 1")
    t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    if shift is not None and shift != 1.0:
        t = shift * t / (1 + (shift - 1) * t)
    return t.float()


@dataclass
class ChainConfig:
    """How a chain is discretised and which of its steps are trained."""

    num_steps: int = hfield(10, "denoising steps K of a training rollout (Flow-GRPO trains with 10)")
    shift: Optional[float] = hfield(None, "time shift t' = s t / (1 + (s - 1) t) (1 = uniform); null = the head's own "
                                          "scheduler grid (SD3/FLUX/DDIM) or uniform for heads without one")
    train_window_start: int = hfield(0, "first trainable step index (MixGRPO window start)")
    train_window_size: int = hfield(0, "number of trainable steps from the start (0 = all steps)")
    window_slide_every: int = hfield(0, "slide the window by one step every N iterations (MixGRPO; 0 = fixed)")
    train_fraction: float = hfield(1.0, "random fraction of the window trained per iteration (Flow-GRPO timestep_fraction)")
    ode_outside_window: bool = hfield(False, "training rollouts take the deterministic (evaluation) sampler's step "
                                             "outside the trainable window, so only trained steps add noise "
                                             "(MixGRPO's mixed ODE-SDE sampling)")

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError("chain.num_steps must be >= 1")
        if not 0 <= self.train_window_start < self.num_steps:
            raise ValueError(f"chain.train_window_start must be in [0, {self.num_steps - 1}]")
        if self.train_window_size < 0:
            raise ValueError("chain.train_window_size must be >= 0 (0 = all steps)")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ValueError("chain.train_fraction must be in (0, 1]")


class DenoisingChain:
    """A discretised chain and its trainable window.

    >>> chain = DenoisingChain(ChainConfig(num_steps=4))
    >>> chain.times.shape
    torch.Size([5])
    """

    def __init__(self, config: ChainConfig, times: Optional[Tensor] = None):
        """``times``: a [K+1] grid from the head's scheduler, used when ``config.shift`` is null."""
        self.config = config
        if times is not None and config.shift is None:
            if times.shape != (config.num_steps + 1,):
                raise ValueError(f"the head's time grid has {times.shape[0]} points, expected {config.num_steps + 1}")
            self.times = times.float()
        else:
            self.times = time_grid(config.num_steps, config.shift)

    @property
    def num_steps(self) -> int:
        return self.config.num_steps

    def window(self, iteration: int = 0) -> Tensor:
        """[W] long, the trainable step indices at training ``iteration`` (no randomness)."""
        c = self.config
        size = c.train_window_size or (c.num_steps - c.train_window_start)
        start = c.train_window_start
        if c.window_slide_every > 0:
            span = max(c.num_steps - size, 0) + 1
            start = (start + iteration // c.window_slide_every) % span
        end = min(start + size, c.num_steps)
        return torch.arange(start, end)

    def reachable_steps(self) -> Tensor:
        """[R] sorted step indices that ``window`` covers at some iteration (all of its positions
        when it slides)."""
        c = self.config
        if c.window_slide_every <= 0:
            return self.window(0)
        size = c.train_window_size or (c.num_steps - c.train_window_start)
        positions = max(c.num_steps - size, 0) + 1
        return torch.cat([self.window(i * c.window_slide_every) for i in range(positions)]).unique()

    def stochastic_steps(self, iteration: int = 0) -> Optional[Tensor]:
        """[K] bool, the steps a training rollout samples with noise at ``iteration``: the
        window's with ``ode_outside_window``, else None (every step)."""
        if not self.config.ode_outside_window:
            return None
        mask = torch.zeros(self.num_steps, dtype=torch.bool)
        mask[self.window(iteration)] = True
        return mask

    def trainable_steps(self, iteration: int, generator: Optional[torch.Generator] = None) -> Tensor:
        """[S] sorted step indices trained this iteration (a random subset of the window
        when ``train_fraction < 1``, drawn with ``generator`` so all processes agree)."""
        steps = self.window(iteration)
        n = max(1, round(len(steps) * self.config.train_fraction))
        if n < len(steps):
            pick = torch.randperm(len(steps), generator=generator)[:n]
            steps = steps[pick.sort().values]
        return steps

    @staticmethod
    def step_view(traj: Trajectory, steps: Tensor) -> Dict[str, Tensor]:
        """Flatten chosen steps of every chain into transitions (action = one step).

        Returns a dict of [B*S, ...] tensors: x, x_next, t, t_next, step, sample_idx and,
        when recorded, old_log_prob [B*S] (or [B*S, A]) and v_old.
        """
        b, s = traj.batch_size, len(steps)
        sample_idx = torch.arange(b).repeat_interleave(s)
        step_idx = steps.repeat(b)
        out = {
            "sample_idx": sample_idx,
            "step": step_idx,
            "x": traj.states[sample_idx, step_idx],
            "x_next": traj.states[sample_idx, step_idx + 1],
            "t": traj.times[sample_idx, step_idx],
            "t_next": traj.times[sample_idx, step_idx + 1],
        }
        if traj.log_probs is not None:
            out["old_log_prob"] = traj.log_probs[sample_idx, step_idx]
        if traj.velocities is not None:
            out["v_old"] = traj.velocities[sample_idx, step_idx]
        return out

    @staticmethod
    def trajectory_view(traj: Trajectory) -> Tuple[Tensor, Tensor]:
        """Action = the whole chain: (initial states [B, ...], final states [B, ...])."""
        return traj.states[:, 0], traj.states[:, -1]


@torch.no_grad()
def sample_chain(
    velocity_fn: Callable[[Tensor, Tensor, Dict[str, Tensor]], Tensor],
    sampler: Sampler,
    x_init: Tensor,
    cond: Dict[str, Tensor],
    times: Tensor,
    chain_generators: Optional[Sequence[torch.Generator]] = None,
    record_velocity: bool = False,
    event_ndim: Optional[int] = None,
    stochastic: Optional[Tensor] = None,
    ode_sampler: Optional[Sampler] = None,
) -> Dict[str, Optional[Tensor]]:
    """Run one chain per sample.

    x_init: [B, ...] noise at t = times[0]; times: [K+1]; chain_generators: B generators
    (sample i's step noise comes only from generator i). stochastic: optional [K] bool;
    where it is False, step k is ``ode_sampler``'s deterministic step (MixGRPO) and its
    log-prob is recorded as 0 (such a step is never trained). Returns
    states [B, K+1, ...], times [B, K+1], log_probs [B, K(, A)] or None, velocities
    [B, K, ...] or None.
    """
    if stochastic is not None and ode_sampler is None:
        raise ValueError("sample_chain: a stochastic-step mask needs an ode_sampler for the other steps")
    b = x_init.shape[0]
    x = sampler.init(x_init, chain_generators)
    states, log_probs, velocities = [x], [], []
    for k in range(len(times) - 1):
        t = times[k].expand(b).to(x.device)
        t_next = times[k + 1].expand(b).to(x.device)
        v = velocity_fn(x, t, cond)
        noisy = stochastic is None or bool(stochastic[k])
        if noisy:
            out = sampler.step(v, x, t, t_next, generator=chain_generators, event_ndim=event_ndim)
            x, lp = out.x_next, out.log_prob
        else:
            x, lp = ode_sampler.step(v, x, t, t_next).x_next, 0.0
        states.append(x)
        log_probs.append(lp)
        if record_velocity:
            velocities.append(v)
    # a step without a log-prob was deterministic (an ODE step, or a sampler's std-0 step such
    # as CPS's last): it is recorded as 0 and must not be trained (the trainer refuses a window that reaches it)
    ref = next((lp for lp in log_probs if isinstance(lp, Tensor)), None)
    has_lp = ref is not None
    if has_lp:
        log_probs = [lp if isinstance(lp, Tensor) else torch.zeros_like(ref) for lp in log_probs]
    return {
        "states": torch.stack(states, dim=1),
        "times": times.to(x.device).unsqueeze(0).expand(b, -1).contiguous(),
        "log_probs": torch.stack(log_probs, dim=1) if has_lp else None,
        "velocities": torch.stack(velocities, dim=1) if record_velocity else None,
    }


class Environment(Protocol):
    """What the two-layer helper needs from a closed-loop environment (batched).

    Optional methods, used when present:

    * ``check_head(head)``: raise ``ConfigError`` if the head cannot drive this
      environment (the trainer calls it once both are built);

    * ``score_candidates(state, actions, num_candidates) -> score`` or ``(score, valid)``:
      per-state candidate groups (``ClosedLoop(candidates_per_state=G)``, SCORP's "G samples
      per state, execute the best one, update on all G"). ``actions`` [B * G, ...] holds G
      candidate actions per episode, candidate-major within an episode (rows b*G .. b*G+G-1
      belong to episode b); the environment scores each from a copy of ``state`` without
      advancing it. score / valid: [B * G] or [B * G, A].
    * ``episode_metrics(state) -> {name: float or (mean, weight)}``: means over the episodes
      of ``state`` (evaluation reports them next to the return); a float is weighted by
      episodes, a (mean, weight) pair by its weight (agents, agent-ticks, a subset's size).
    * ``save_rollouts(state, directory, tag) -> paths``: draw some evaluated episodes.

    An environment config may set ``candidates_per_state`` (0 = groups of whole episodes)
    next to the required ``num_env_steps``.
    """

    def reset(self, batch: Sequence[Any], seeds: Sequence[int]) -> Any:
        """Start one episode per item; returns the environment state."""

    def observe(self, state: Any) -> Sequence[Any]:
        """Per-episode observations, the items ``Head.encode`` takes."""

    def step(self, state: Any, action: Tensor) -> Tuple[Any, Tensor, Tensor]:
        """Execute actions [B, ...]; returns (state, reward [B] or [B, A], done [B] bool)."""


@dataclass
class ClosedLoopResult:
    """rows: one chain per (episode, env step[, candidate]), flattened episode-major.

    states [R, K+1, ...], times [R, K+1], log_probs [R, K(, A)], cond {k: [R, ...]},
    episode [R] long (which episode a row belongs to), env_step [R] long,
    alive [R] bool (False for chains planned after the episode ended),
    returns [B] or [B, A] (sum of the executed rewards over the episode).
    R = B * E, or B * E * G with candidates (row order episode, env step, candidate), then
    also candidate [R] long, scores [R] or [R, A] (each candidate's score) and
    score_valid like scores (False where invalid or the episode had ended).
    final_state: the environment state after the last step (for ``episode_metrics``).
    """

    states: Tensor
    times: Tensor
    log_probs: Optional[Tensor]
    cond: Dict[str, Tensor]
    episode: Tensor
    env_step: Tensor
    alive: Tensor
    returns: Tensor
    candidate: Optional[Tensor] = None
    scores: Optional[Tensor] = None
    score_valid: Optional[Tensor] = None
    final_state: Any = None


def _expand_like(mask: Tensor, like: Tensor) -> Tensor:
    """[N] bool -> like's shape (broadcast over trailing dims)."""
    return mask.view(-1, *([1] * (like.ndim - 1))).expand_as(like)


class ClosedLoop:
    """Two-layer MDP: each outer environment step runs a whole inner denoising chain.

    The inner chain's final state is the action chunk handed to ``env.step``. Two ways to
    form groups:

    * ``candidates_per_state = 0``: the trainer treats each (episode, env step) chain as a
      sample whose reward is the episode's return (DPPO-style; groups = episodes of the
      same item);
    * ``candidates_per_state = G`` (SCORP): at every env step G chains are sampled per
      episode, ``env.score_candidates`` scores each from a copy of the state, the best one
      (highest score, averaged over valid agents) is executed, and the G chains form one
      group whose rewards are their scores.

    Per-step log-probs stay exact Gaussian ones in both modes.
    """

    def __init__(self, head, sampler: Sampler, chain: DenoisingChain, num_env_steps: int,
                 velocity_fn: Optional[Callable[[Tensor, Tensor, Dict[str, Tensor]], Tensor]] = None,
                 times: Optional[Tensor] = None, candidates_per_state: int = 0,
                 stochastic: Optional[Tensor] = None, ode_sampler: Optional[Sampler] = None):
        """stochastic, ode_sampler: as in ``sample_chain`` (MixGRPO's noisy window)."""
        self.head, self.sampler, self.chain, self.num_env_steps = head, sampler, chain, num_env_steps
        self.stochastic, self.ode_sampler = stochastic, ode_sampler
        self.velocity_fn = velocity_fn or head.velocity
        self.times = chain.times if times is None else times
        if candidates_per_state < 0 or candidates_per_state == 1:
            raise ValueError("candidates_per_state must be 0 (episode groups) or >= 2")
        self.candidates_per_state = candidates_per_state

    @torch.no_grad()
    def rollout(
        self,
        env: Environment,
        batch: Sequence[Any],
        seeds: Sequence[int],
        make_generators: Callable[[int], Sequence[torch.Generator]],
        make_init_generators: Optional[Callable[[int], Sequence[torch.Generator]]] = None,
    ) -> ClosedLoopResult:
        """``make_generators(env_step)`` gives the generators for that step's chains: B of
        them, or B * G (candidate-major within an episode) with candidates. Each chain's
        starting noise is drawn from its own generator first, unless
        ``make_init_generators(env_step)`` (as many) gives separate ones, e.g. one seed
        repeated over a group so that its chains differ only by their step noise."""
        state = env.reset(batch, seeds)
        b = len(batch)
        g = self.candidates_per_state
        reps = max(g, 1)
        if g and not hasattr(env, "score_candidates"):
            raise ValueError(f"{type(env).__name__} has no score_candidates(state, actions, num_candidates); "
                             f"set the environment's candidates_per_state to 0")
        alive = torch.ones(b, dtype=torch.bool)
        returns = None
        rows: List[Dict[str, Any]] = []
        for e in range(self.num_env_steps):
            cond = self.head.encode(env.observe(state))
            if g:
                cond = {k: v.repeat_interleave(g, dim=0) for k, v in cond.items()}
            gens = make_generators(e)
            if len(gens) != b * reps:
                raise ValueError(f"make_generators gave {len(gens)} generators for {b * reps} chains")
            init_gens = gens if make_init_generators is None else make_init_generators(e)
            if len(init_gens) != b * reps:
                raise ValueError(f"make_init_generators gave {len(init_gens)} generators for {b * reps} chains")
            x0 = self.head.init_noise(cond, init_gens)
            res = sample_chain(self.velocity_fn, self.sampler, x0, cond, self.times, gens,
                               event_ndim=self.head.event_ndim, stochastic=self.stochastic,
                               ode_sampler=self.ode_sampler)
            action = self.head.decode(res["states"][:, -1], cond)
            row = {**res, "cond": cond, "alive": alive.repeat_interleave(reps)}
            if g:
                out = env.score_candidates(state, action, g)
                score, valid = out if isinstance(out, tuple) else (out, torch.ones_like(out, dtype=torch.bool))
                score, valid = score.cpu(), valid.cpu() & _expand_like(row["alive"], valid)
                w = valid.float().reshape(b * g, -1)
                mean = (score.float().reshape(b * g, -1) * w).sum(1) / w.sum(1).clamp(min=1)
                mean = torch.where(w.sum(1) > 0, mean, torch.full_like(mean, -float("inf")))
                pick = mean.view(b, g).argmax(dim=1)  # first best on ties
                action = action.view(b, g, *action.shape[1:])[torch.arange(b), pick.to(action.device)]
                row.update(score=score, score_valid=valid)
            state, reward, done = env.step(state, action)
            reward = reward.cpu()
            mask = alive.view(-1, *([1] * (reward.ndim - 1))).to(reward.dtype)
            returns = reward * mask if returns is None else returns + reward * mask
            rows.append(row)
            alive = alive & ~done.bool().cpu()

        def cat(key: str) -> Tensor:  # [B * reps] per step -> rows ordered (episode, step, candidate)
            x = torch.stack([r[key].reshape(b, reps, *r[key].shape[1:]) for r in rows], dim=1)
            return x.flatten(0, 2)

        has_lp = all(r["log_probs"] is not None for r in rows)
        e_n = self.num_env_steps
        return ClosedLoopResult(
            states=cat("states"),
            times=cat("times"),
            log_probs=cat("log_probs") if has_lp else None,
            cond={k: torch.stack([r["cond"][k].reshape(b, reps, *r["cond"][k].shape[1:]) for r in rows], 1).flatten(0, 2)
                  for k in rows[0]["cond"]},
            episode=torch.arange(b).repeat_interleave(e_n * reps),
            env_step=torch.arange(e_n).repeat_interleave(reps).repeat(b),
            alive=cat("alive"),
            returns=returns,
            candidate=torch.arange(reps).repeat(b * e_n) if g else None,
            scores=cat("score") if g else None,
            score_valid=cat("score_valid") if g else None,
            final_state=state,
        )
