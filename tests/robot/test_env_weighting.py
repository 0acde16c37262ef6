"""MetaWorld closed-loop environment, the weighting registry, PTR calibration and the
epsilon-matching timestep fix (hand-made tensors and tiny episodes)."""
import numpy as np
import pytest
import torch

from flowrl.algorithms.base import Policy
from flowrl.algorithms.flow_matching import FlowMatching, FlowMatchingConfig, snap_to_train_timesteps
from flowrl.algorithms.ptr import effective_sample_size
from flowrl.registry import ENVIRONMENTS
from flowrl.samplers.ddim import DDIMSampler
from planners.robot.data import RobotDataset
from planners.robot.envs import MetaWorldBatchEnv, MetaWorldEnvConfig, task_id
from planners.robot.head import cosine_alphas_cumprod
from planners.robot.scorer import calibrate, episode_mean
from planners.robot.weighting import (WEIGHTINGS, WeightingConfig, apply_weighting, discounted_return,
                                      weight_diagnostics)
from tests.robot.test_head_scorer import fake_episodes

torch.set_num_threads(1)


# ------------------------------------------------------------------ environment
def test_metaworld_env_protocol_and_metrics():
    assert "metaworld" in ENVIRONMENTS
    cfg = MetaWorldEnvConfig(max_steps=12, exec_steps=4)
    assert cfg.num_env_steps == 3
    env = MetaWorldBatchEnv(cfg)
    items = [{"task": "reach-v3", "seed": 100_000}, {"task": "reach-v3", "seed": 100_001}]
    state = env.reset(items, seeds=[5, 6])               # the items' own seeds win
    obs = env.observe(state)
    assert obs[0]["obs"].shape == (2, 39) and obs[0]["task"] == task_id("reach-v3")
    assert torch.equal(obs[0]["obs"][0], obs[0]["obs"][1])   # short history padded with the first frame
    again = env.observe(env.reset(items, seeds=[7, 8]))
    assert torch.equal(again[1]["obs"], obs[1]["obs"])       # same layout seed -> same start
    chunk = torch.zeros(2, 8, 4)
    total = torch.zeros(2)
    for _ in range(cfg.num_env_steps):
        state, reward, done = env.step(state, chunk)
        assert reward.shape == (2,) and done.dtype == torch.bool
        total += reward
    assert bool(done.all()) and state.steps.tolist() == [12, 12]
    state, reward, _ = env.step(state, chunk)             # finished episodes are left alone
    assert float(reward.abs().sum()) == 0.0
    m = env.episode_metrics(state)
    assert set(m) >= {"success", "return"} and m["success"] == 0.0
    assert m["return"] == pytest.approx(float(total.mean()), rel=1e-5)
    with pytest.raises(ValueError):
        MetaWorldEnvConfig(exec_steps=0)


# ------------------------------------------------------------------ weightings
def test_weighting_registry_columns_and_diagnostics():
    ds = RobotDataset(fake_episodes(), horizon=4, n_obs=2, exec_steps=2)
    assert set(WEIGHTINGS) == {"uniform", "oracle", "filtered", "awr", "ptr"}
    d = apply_weighting(ds, WeightingConfig(method="oracle"), {})
    clean = ds.columns["source"] == 0
    assert torch.equal(ds.columns["weight"], clean.float())
    assert d["weights/auroc_clean_vs_corrupted"] == 1.0 and d["weights/mass/clean"] == pytest.approx(1.0)
    assert d["weights/ess"] == pytest.approx(float(clean.float().mean()), rel=1e-4)
    apply_weighting(ds, WeightingConfig(method="uniform"), {})
    assert torch.equal(ds.columns["weight"], torch.ones(len(ds)))
    apply_weighting(ds, WeightingConfig(method="filtered"), {})
    assert torch.equal(ds.columns["weight"], ds.columns["ep_success"])
    d = apply_weighting(ds, WeightingConfig(method="awr", awr_w_max=5.0, knn=4), {})
    w = ds.columns["weight"]
    assert bool((w > 0).all()) and float(w.max()) <= 5.0 and np.isfinite(d["weights/ess"])
    with pytest.raises(ValueError):
        WeightingConfig(method="nope")


def test_weight_diagnostics_by_hand():
    w = torch.tensor([2.0, 2.0, 1.0, 1.0, 0.0, 0.0])
    source = torch.tensor([0, 0, 1, 1, 2, 2])            # clean, clean, exec_noise x2, embodiment x2
    episode = torch.tensor([0, 0, 1, 1, 2, 2])
    d = weight_diagnostics(w, source, episode)
    assert d["weights/mass/clean"] == pytest.approx(4 / 6) and d["weights/mass/embodiment"] == 0.0
    assert d["weights/auroc_clean_vs_corrupted"] == 1.0 and d["weights/auroc_episodes"] == 1.0
    assert d["weights/ess"] == pytest.approx(36 / (10 * 6))


def test_discounted_return_success_absorbing():
    eps = fake_episodes(n_ep=2, T=3)
    eps[0].rewards[:] = [1.0, 2.0, 4.0]
    eps[0].success[-1] = True
    eps[1].rewards[:] = [1.0, 1.0, 1.0]
    ds = RobotDataset(eps, horizon=2, n_obs=1, exec_steps=1)
    q = discounted_return(ds, 0.5)
    # success: the last reward repeats forever (4 / (1 - 0.5) = 8 after the end)
    assert q[:3].tolist() == pytest.approx([1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 8, 2 + 0.5 * 4 + 0.25 * 8, 4 + 0.5 * 8])
    assert q[3:].tolist() == pytest.approx([1.75, 1.5, 1.0])


# ------------------------------------------------------------------ calibration
def test_calibrations():
    s = torch.linspace(-3, 3, 101)
    r = calibrate(s, "quantile", ratio=16.0, q_lo=0.1, q_hi=0.9)
    assert float(r.min()) == pytest.approx(0.25) and float(r.max()) == pytest.approx(4.0)   # ratio^(-1/2), ratio^(1/2)
    assert bool((r[1:] >= r[:-1]).all())
    rr = calibrate(s ** 3, "rank", ratio=16.0)                  # ranks only: a monotone map changes nothing
    assert torch.allclose(rr, calibrate(s, "rank", ratio=16.0))
    assert float(rr.max() / rr.min()) < 16.0
    re = calibrate(s, "ess", ratio=1.0, ess_target=0.4)
    assert effective_sample_size(re) == pytest.approx(0.4, abs=1e-3)
    assert bool((re[1:] >= re[:-1] - 1e-7).all())
    ep = torch.tensor([0, 0, 1, 1, 1])
    assert episode_mean(torch.tensor([1.0, 3.0, 0.0, 0.0, 3.0]), ep).tolist() == [2.0, 2.0, 1.0, 1.0, 1.0]


# ------------------------------------------------------------------ epsilon matching on a DDIM grid
def test_snap_to_train_timesteps():
    t = torch.tensor([1e-4, 0.005, 0.0101, 0.5, 0.9999])
    got = snap_to_train_timesteps(t, 100)
    assert torch.allclose(got, torch.tensor([0.01, 0.01, 0.02, 0.51, 1.0]))
    u = torch.rand(20000, generator=torch.Generator().manual_seed(0))
    tau = (snap_to_train_timesteps(u, 10) * 10).round().long() - 1
    assert tau.min() == 0 and tau.max() == 9
    assert torch.bincount(tau).float().div(len(u)).sub(0.1).abs().max() < 0.02   # uniform over the grid


def test_epsilon_flow_matching_loss_runs_on_ddim_grid():
    sampler = DDIMSampler(cosine_alphas_cumprod(100), eta=0.0)
    seen = []

    def eps_model(x, t, cond):
        seen.append(t.clone())
        return torch.zeros_like(x)

    policy = Policy(velocity=eps_model, reference_velocity=eps_model, sampler=sampler, event_ndim=None,
                    prediction="epsilon")
    alg = FlowMatching(FlowMatchingConfig())
    units = alg.make_offline_units(torch.zeros(8, 4, 2), {})
    gens = [torch.Generator().manual_seed(i) for i in range(8)]
    per, _ = alg.loss(units, {}, policy, gens)            # continuous t used to raise in alpha_bar
    assert per.shape == (8,)
    tn = seen[0].double() * 100
    assert torch.allclose(tn, tn.round(), atol=1e-4) and bool((tn.round() >= 1).all())
    assert bool(torch.isfinite(per).all()) and bool((per > 0).all())   # x0 = 0, zero prediction: mean(eps^2)
