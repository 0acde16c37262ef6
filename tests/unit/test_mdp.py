import torch; torch.set_num_threads(1)  # noqa: E702,I001
# Analytic-oracle tests for flowrl.mdp: time grids, trainable windows, step views,
# sample_chain and the two-layer ClosedLoop rollout.

import pytest

from flowrl.mdp import ChainConfig, ClosedLoop, DenoisingChain, sample_chain, time_grid
from flowrl.samplers import EulerSampler, FlowCPSSampler, FlowSDESampler
from flowrl.testing import ToyHead, ToyHeadConfig, ToyReachConfig, ToyReachEnv
from flowrl.testing import assert_close
from flowrl.types import Trajectory

torch.manual_seed(0)


def close(a, b, atol=1e-6):
    assert_close(a, b, atol)


def gens(n, base=0):
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


# ----------------------------------------------------------------------------- time grid
def test_time_grid_uniform():
    g = time_grid(4)
    close(g, [1.0, 0.75, 0.5, 0.25, 0.0])
    assert g.dtype == torch.float32
    assert float(g[0]) == 1.0 and float(g[-1]) == 0.0
    assert bool((g[1:] < g[:-1]).all())
    with pytest.raises(ValueError):
        time_grid(0)


def test_time_grid_shifted():
    # t' = 3t / (1 + 2t): .75 -> 2.25/2.5 = .9 ; .5 -> 1.5/2 = .75 ; .25 -> .75/1.5 = .5
    g = time_grid(4, shift=3.0)
    close(g, [1.0, 0.9, 0.75, 0.5, 0.0])
    assert float(g[0]) == 1.0 and float(g[-1]) == 0.0
    assert bool((g[1:] < g[:-1]).all())
    # shifted times lie above the uniform ones in the interior (more steps at high noise)
    assert bool((g[1:-1] > time_grid(4)[1:-1]).all())


# ----------------------------------------------------------------------------- windows
def _chain(**kw):
    return DenoisingChain(ChainConfig(**kw))


def test_window_start_and_size():
    assert _chain(num_steps=10).window().tolist() == list(range(10))
    assert _chain(num_steps=10, train_window_start=2, train_window_size=3).window().tolist() == [2, 3, 4]
    # size 0 = all steps from the start
    assert _chain(num_steps=10, train_window_start=7).window().tolist() == [7, 8, 9]
    # a window running past the end is cut at K
    assert _chain(num_steps=10, train_window_start=8, train_window_size=5).window().tolist() == [8, 9]
    # a fixed window does not move with the iteration
    assert _chain(num_steps=10, train_window_start=2, train_window_size=3).window(17).tolist() == [2, 3, 4]


def test_window_sliding():
    # K = 5, size 3: starts 0..2 (span 5 - 3 + 1 = 3); slide by one every 2 iterations, wrapping
    c = _chain(num_steps=5, train_window_size=3, window_slide_every=2)
    got = [c.window(i).tolist() for i in range(8)]
    assert got == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [1, 2, 3], [2, 3, 4], [2, 3, 4], [0, 1, 2], [0, 1, 2]]
    # starting at 1: iteration 2 -> start 2, iteration 4 -> (1 + 2) % 3 = 0
    c1 = _chain(num_steps=5, train_window_start=1, train_window_size=3, window_slide_every=2)
    assert [c1.window(i).tolist() for i in (0, 2, 4)] == [[1, 2, 3], [2, 3, 4], [0, 1, 2]]


def test_trainable_steps_fraction():
    c = _chain(num_steps=10, train_fraction=0.3)
    a = c.trainable_steps(0, torch.Generator().manual_seed(5))
    b = c.trainable_steps(0, torch.Generator().manual_seed(5))
    assert len(a) == 3  # round(10 * .3)
    assert a.tolist() == b.tolist()  # deterministic for a given generator
    assert set(a.tolist()) <= set(range(10))
    for seed in range(8):  # always sorted and distinct, whatever the draw
        s = c.trainable_steps(0, torch.Generator().manual_seed(seed)).tolist()
        assert s == sorted(s) and len(set(s)) == 3
    # different generators draw different subsets (over a few seeds, not all equal)
    draws = {tuple(c.trainable_steps(0, torch.Generator().manual_seed(s)).tolist()) for s in range(6)}
    assert len(draws) > 1
    # inside a window: a subset of the window; fraction 1 = the whole window
    w = _chain(num_steps=10, train_window_start=4, train_window_size=4, train_fraction=0.5)
    s = w.trainable_steps(0, torch.Generator().manual_seed(1))
    assert len(s) == 2 and set(s.tolist()) <= {4, 5, 6, 7} and s.tolist() == sorted(s.tolist())
    assert _chain(num_steps=6).trainable_steps(3).tolist() == list(range(6))
    # at least one step: round(4 * .1) = 0 -> 1
    assert len(_chain(num_steps=4, train_fraction=0.1).trainable_steps(0, torch.Generator().manual_seed(0))) == 1


def test_chain_config_validation():
    with pytest.raises(ValueError):
        ChainConfig(num_steps=4, train_window_start=4)
    with pytest.raises(ValueError):
        ChainConfig(num_steps=4, train_fraction=0.0)
    with pytest.raises(ValueError):
        ChainConfig(num_steps=4, train_window_size=-1)


# ----------------------------------------------------------------------------- step view
def _hand_traj():
    # B = 2, K = 3, states [2, 4, 3] with value 100 b + 10 k + j
    b, k, j = torch.meshgrid(torch.arange(2), torch.arange(4), torch.arange(3), indexing="ij")
    states = (100 * b + 10 * k + j).float()
    times = time_grid(3).expand(2, -1)
    log_probs = torch.tensor([[0.1, 0.2, 0.3], [1.1, 1.2, 1.3]])
    vel = -states[:, :3]
    return Trajectory(states=states, times=times, cond={}, group_ids=torch.tensor([0, 0]),
                      sample_ids=torch.arange(2), log_probs=log_probs, velocities=vel)


def test_step_view_shapes_and_values():
    traj = _hand_traj()
    u = DenoisingChain.step_view(traj, torch.tensor([0, 2]))
    assert u["sample_idx"].tolist() == [0, 0, 1, 1]
    assert u["step"].tolist() == [0, 2, 0, 2]
    assert u["x"].shape == (4, 3) and u["x_next"].shape == (4, 3)
    close(u["x"][:, 0], [0, 20, 100, 120])
    close(u["x_next"][:, 0], [10, 30, 110, 130])
    close(u["t"], [1.0, 1 / 3, 1.0, 1 / 3])
    close(u["t_next"], [2 / 3, 0.0, 2 / 3, 0.0])
    close(u["old_log_prob"], [0.1, 0.3, 1.1, 1.3])
    close(u["v_old"][:, 0], [0, -20, -100, -120])


def test_step_view_x_next_is_next_x():
    traj = _hand_traj()
    u = DenoisingChain.step_view(traj, torch.arange(3))
    for i in range(2):
        rows = (u["sample_idx"] == i).nonzero().flatten()
        assert torch.equal(u["x_next"][rows[:-1]], u["x"][rows[1:]])
        assert torch.equal(u["t_next"][rows[:-1]], u["t"][rows[1:]])
    x0, x_final = DenoisingChain.trajectory_view(traj)
    close(x0[:, 0], [0, 100])
    close(x_final[:, 0], [30, 130])
    no_lp = DenoisingChain.step_view(traj.replace(log_probs=None, velocities=None), torch.arange(3))
    assert "old_log_prob" not in no_lp and "v_old" not in no_lp


# ----------------------------------------------------------------------------- sample_chain
def test_sample_chain_euler_constant_velocity():
    # dx/dt = c from t = 1 to t_k: x_{t_k} = x1 - (1 - t_k) c; the end is x1 - c
    c = torch.tensor([0.5, -1.0])
    x1 = torch.randn(3, 2, generator=torch.Generator().manual_seed(2))
    times = time_grid(4, shift=3.0)  # [1, .9, .75, .5, 0]
    res = sample_chain(lambda x, t, cond: c.expand_as(x), EulerSampler(), x1, {}, times, record_velocity=True)
    assert res["states"].shape == (3, 5, 2)
    assert res["log_probs"] is None
    close(res["states"][:, -1], x1 - c)
    for k, tk in enumerate([1.0, 0.9, 0.75, 0.5, 0.0]):
        close(res["states"][:, k], x1 - (1 - tk) * c)
    close(res["times"], times.expand(3, -1))
    close(res["velocities"], c.expand(3, 4, 2))


def _vel(x, t, cond):
    return 0.5 * x - t[:, None] * torch.tensor([1.0, -2.0])


def test_sample_chain_sde_log_probs_rescore():
    sampler = FlowSDESampler.flow_grpo(0.7)
    x1 = torch.randn(3, 2, generator=torch.Generator().manual_seed(4))
    times = time_grid(4)
    res = sample_chain(_vel, sampler, x1, {}, times, gens(3, 10))
    lp, st = res["log_probs"], res["states"]
    assert lp.shape == (3, 4) and torch.isfinite(lp).all()
    for k in range(4):
        x, xn = st[:, k], st[:, k + 1]
        t, tn = times[k].expand(3), times[k + 1].expand(3)
        out = sampler.step(_vel(x, t, {}), x, t, tn, x_next=xn)
        close(lp[:, k], out.log_prob, atol=1e-5)
    # the chain is stochastic (not the deterministic Euler one) ...
    ode = sample_chain(_vel, EulerSampler(), x1, {}, times)
    assert float((ode["states"][:, -1] - st[:, -1]).abs().max()) > 1e-3
    # ... and sample i's noise comes only from generator i: sample 1 alone reproduces its chain
    alone = sample_chain(_vel, sampler, x1[1:2], {}, times, gens(1, 11))
    close(alone["states"][0], st[1], atol=1e-6)
    close(alone["log_probs"][0], lp[1], atol=1e-5)


def test_sample_chain_records_a_deterministic_sampler_step_as_zero():
    """CPS's last step (to t = 0) has std 0: the chain keeps the other steps' log-probs and
    records 0 there, as for an ODE step; the step itself is the endpoint x0_hat = x - t v."""
    sampler = FlowCPSSampler(eta=0.5)
    x1 = torch.randn(3, 2, generator=torch.Generator().manual_seed(5))
    times = time_grid(4)
    res = sample_chain(_vel, sampler, x1, {}, times, gens(3, 10))
    lp, st = res["log_probs"], res["states"]
    assert lp.shape == (3, 4) and bool((lp[:, :3] != 0).all()) and torch.equal(lp[:, 3], torch.zeros(3))
    for k in range(3):
        t, tn = times[k].expand(3), times[k + 1].expand(3)
        close(lp[:, k], sampler.step(_vel(st[:, k], t, {}), st[:, k], t, tn, x_next=st[:, k + 1]).log_prob, atol=1e-5)
    close(st[:, 4], st[:, 3] - times[3] * _vel(st[:, 3], times[3].expand(3), {}), atol=1e-6)


def test_reachable_steps_cover_every_window_position():
    assert DenoisingChain(ChainConfig(num_steps=5, train_window_size=2)).reachable_steps().tolist() == [0, 1]
    sliding = DenoisingChain(ChainConfig(num_steps=5, train_window_size=2, window_slide_every=3))
    assert sliding.reachable_steps().tolist() == [0, 1, 2, 3, 4]
    assert DenoisingChain(ChainConfig(num_steps=5, train_window_start=2)).reachable_steps().tolist() == [2, 3, 4]


def test_stochastic_steps_follow_the_window():
    assert DenoisingChain(ChainConfig(num_steps=5, train_window_size=2)).stochastic_steps(0) is None  # opt-in
    chain = DenoisingChain(ChainConfig(num_steps=5, train_window_size=2, window_slide_every=2, ode_outside_window=True))
    assert chain.stochastic_steps(0).tolist() == [True, True, False, False, False]
    assert chain.stochastic_steps(2).tolist() == [False, True, True, False, False]  # slides with the window


def test_sample_chain_ode_outside_the_stochastic_steps():
    sampler, ode = FlowSDESampler.flow_grpo(0.7), EulerSampler()
    x1 = torch.randn(3, 2, generator=torch.Generator().manual_seed(4))
    times = time_grid(4)
    mask = torch.tensor([True, True, False, False])
    res = sample_chain(_vel, sampler, x1, {}, times, gens(3, 10), stochastic=mask, ode_sampler=ode)
    st, lp = res["states"], res["log_probs"]
    # the noisy steps are exactly the SDE chain's first two steps (same generators) ...
    full = sample_chain(_vel, sampler, x1, {}, times, gens(3, 10))
    close(st[:, :3], full["states"][:, :3])
    close(lp[:, :2], full["log_probs"][:, :2], atol=1e-5)
    # ... and the others are Euler steps x + (t_next - t) v, recorded with log-prob 0
    for k in (2, 3):
        t = times[k].expand(3)
        close(st[:, k + 1], st[:, k] + (times[k + 1] - times[k]) * _vel(st[:, k], t, {}), atol=1e-6)
    assert torch.equal(lp[:, 2:], torch.zeros(3, 2))
    # all steps noisy = no mask; no noisy step = the ODE chain, without log-probs
    same = sample_chain(_vel, sampler, x1, {}, times, gens(3, 10), stochastic=torch.ones(4, dtype=torch.bool),
                        ode_sampler=ode)
    close(same["states"], full["states"])
    none = sample_chain(_vel, sampler, x1, {}, times, gens(3, 10), stochastic=torch.zeros(4, dtype=torch.bool),
                        ode_sampler=ode)
    close(none["states"], sample_chain(_vel, ode, x1, {}, times)["states"])
    assert none["log_probs"] is None
    with pytest.raises(ValueError, match="ode_sampler"):
        sample_chain(_vel, sampler, x1, {}, times, gens(3, 10), stochastic=mask)


# ----------------------------------------------------------------------------- closed loop
B, E, KC = 2, 3, 3


def _make_gens(e):
    return gens(B, 100 * (e + 1))


def _replay_returns(finals, done_fn=None):
    """Independent oracle: replay ToyReachEnv from the recorded actions (final states)."""
    state = torch.zeros(B, 2)
    goal = torch.tensor([1.0, 0.0])
    ret = torch.zeros(B)
    alive = torch.ones(B, dtype=torch.bool)
    for e in range(E):
        state = state + 0.1 * finals[:, e]
        ret = ret + (-(state - goal).norm(dim=1)) * alive
        if done_fn is not None:
            alive = alive & ~done_fn(e)
    return ret


def _closed_loop(env):
    head = ToyHead(ToyHeadConfig(pretrain_steps=0))
    sampler = FlowSDESampler.flow_grpo(0.7)
    chain = DenoisingChain(ChainConfig(num_steps=KC))
    loop = ClosedLoop(head, sampler, chain, num_env_steps=E)
    return head, sampler, chain, loop.rollout(env, [0, 1], [0, 1], _make_gens)


def test_closed_loop_rows_indices_returns_log_probs():
    head, sampler, chain, res = _closed_loop(ToyReachEnv(ToyReachConfig(num_env_steps=E)))
    assert res.states.shape == (B * E, KC + 1, 2)
    assert res.times.shape == (B * E, KC + 1)
    close(res.times, chain.times.expand(B * E, -1))
    assert res.episode.tolist() == [0, 0, 0, 1, 1, 1]
    assert res.env_step.tolist() == [0, 1, 2, 0, 1, 2]
    assert res.alive.all()
    assert res.cond["item"].shape == (B * E,)
    # returns = summed env rewards, replayed from each row's action (its chain's final state)
    finals = res.states[:, -1].view(B, E, 2)
    close(res.returns, _replay_returns(finals), atol=1e-6)
    # each row's log-probs are present and equal re-scoring that row's transitions
    assert res.log_probs is not None and res.log_probs.shape == (B * E, KC)
    assert torch.isfinite(res.log_probs).all()
    for k in range(KC):
        x, xn = res.states[:, k], res.states[:, k + 1]
        t, tn = res.times[:, k], res.times[:, k + 1]
        with torch.no_grad():
            out = sampler.step(head.velocity(x, t, res.cond), x, t, tn, x_next=xn)
        close(res.log_probs[:, k], out.log_prob, atol=1e-5)
    # row (episode b, env step e) used generators seeded 100 (e + 1) + b: its initial noise
    for row in range(B * E):
        b, e = int(res.episode[row]), int(res.env_step[row])
        noise = torch.randn(2, generator=torch.Generator().manual_seed(100 * (e + 1) + b))
        close(res.states[row, 0], noise)


class _EndsEpisodeZero(ToyReachEnv):
    """Episode 0 ends after its first step; episode 1 runs to the end."""

    def step(self, state, action):
        state, reward, _ = super().step(state, action)
        return state, reward, torch.tensor([True, False])


def test_closed_loop_done_masks_returns_and_alive():
    _, _, _, res = _closed_loop(_EndsEpisodeZero(ToyReachConfig(num_env_steps=E)))
    # rows planned after episode 0 ended are not alive
    assert res.alive.tolist() == [True, False, False, True, True, True]
    finals = res.states[:, -1].view(B, E, 2)
    close(res.returns, _replay_returns(finals, done_fn=lambda e: torch.tensor([True, False])), atol=1e-6)
    # episode 0's return is its first reward only: -|0.1 a_0 - goal|
    r0 = -(0.1 * finals[0, 0] - torch.tensor([1.0, 0.0])).norm()
    close(res.returns[0], r0, atol=1e-6)


def test_episode_metric_weights_combine_exactly_across_processes():
    from flowrl.trainer.closed_loop import metric_sum

    # rank 0: 2 episodes with 5 agents, 1 collided; rank 1: 1 episode with 1 agent that collided
    r0, r1 = metric_sum((0.2, 5.0), 2.0), metric_sum((1.0, 1.0), 1.0)
    total = [r0[0] + r1[0], r0[1] + r1[1]]
    assert total[0] / total[1] == pytest.approx(2 / 6)  # per agent, not per-episode mean of means
    assert metric_sum(0.5, 3.0) == [1.5, 3.0]  # a float counts once per episode
    assert metric_sum((float("nan"), 0.0), 1.0) == [0.0, 0.0]  # empty subset: no weight, no NaN
