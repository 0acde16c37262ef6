"""Action-chunk head contract and the transition scorer on synthetic episodes; MetaWorld sources."""
import numpy as np
import pytest
import torch

from flowrl.heads.base import check_head_contract
from flowrl.registry import HEADS
from planners.robot.data import RobotDataset
from planners.robot.head import RobotHead, RobotHeadConfig
from planners.robot.scorer import PoolBuilder, PTRScorer, ScorerConfig, diagnostics
from planners.robot.sources import Episode

torch.set_num_threads(1)


def items(n=3):
    g = torch.Generator().manual_seed(0)
    return [{"obs": torch.randn(2, 39, generator=g), "task": i} for i in range(n)]


@pytest.mark.parametrize("prediction", ["velocity", "epsilon"])
def test_head_contract_and_roundtrip(prediction, tmp_path):
    stats = {"obs_mean": torch.randn(39), "obs_std": torch.rand(39) + 0.5,
             "action_mean": torch.randn(4) * 0.1, "action_std": torch.rand(4) + 0.5}
    head = RobotHead(RobotHeadConfig(prediction=prediction, hidden=32, depth=2), stats=stats)
    check_head_contract(head, items(), str(tmp_path))
    back = RobotHead.from_pretrained(str(tmp_path))
    for k, v in stats.items():
        assert torch.allclose(getattr(back, k), v)
    cond = head.encode(items())
    gens = lambda: [torch.Generator().manual_seed(i) for i in range(3)]  # noqa: E731
    a = head.sample(cond, gens(), num_steps=4)
    assert a.shape == (3, 8, 4) and float(a.abs().max()) <= 1.0
    assert torch.allclose(a, back.sample(back.encode(items()), gens(), num_steps=4))
    x0 = torch.randn(3, 8, 4)
    per = head.per_sample_loss(x0, cond, gens())
    assert per.shape == (3,) and bool((per >= 0).all())
    assert "robot" in HEADS


def fake_episodes(n_ep=8, T=20, flip=(6, 7)):
    """Toy dynamics hand += 0.01 * action; episodes in ``flip`` log sign-flipped x."""
    rng = np.random.default_rng(0)
    eps = []
    for e in range(n_ep):
        obs = np.zeros((T + 1, 39), np.float32)
        obs[0, :3] = rng.uniform(-0.1, 0.1, 3)
        act = rng.uniform(-1, 1, (T, 4)).astype(np.float32)
        for t in range(T):
            obs[t + 1] = obs[t]
            obs[t + 1, :3] += 0.01 * act[t, :3]
        logged = act.copy()
        if e in flip:
            logged[:, 0] *= -1
        eps.append(Episode("push-v3", "embodiment" if e in flip else "clean", e, obs, logged, act,
                           np.zeros(T, np.float32), np.zeros(T, bool)))
    return eps


def test_dataset_windows_and_scorer():
    ds = RobotDataset(fake_episodes(), horizon=4, n_obs=2, exec_steps=2)
    assert len(ds) == 8 * 20
    it, x0, cols = ds.get(torch.tensor([0, 25]))
    assert x0.shape == (2, 4, 4) and it[0]["obs"].shape == (2, 39)
    ep0 = ds.episodes[0]
    assert torch.allclose(ds.consequences[0, :3], torch.from_numpy(ep0.obs[2, :3] - ep0.obs[0, :3]))
    pools = PoolBuilder(ds.obs[:, -1], ds.columns["episode"], ds.columns["task"], neighbours=8)
    neg = pools.negatives(torch.arange(len(ds)), 5, torch.Generator().manual_seed(0))
    assert neg.shape == (len(ds), 4)
    assert not bool((ds.columns["episode"][neg] == ds.columns["episode"][:, None]).any()), "same-episode candidate"
    sc = PTRScorer(ScorerConfig(k=5, neighbours=8, steps=150, batch=64, hidden=32, emb=8, eval_draws=1))
    fit = sc.fit(ds)
    s = sc.score(ds)
    assert s["r"].shape == (len(ds),) and bool(torch.isfinite(s["r"]).all())
    d = diagnostics(s["r"], ds.columns["source"], s)
    assert 0 <= d["ptr/auroc_clean_vs_corrupted"] <= 1 and 0 < d["ptr/ess"] <= 1
    assert abs(d["ptr/mass/clean"] + d["ptr/mass/embodiment"] - 1) < 1e-5
    assert fit["scorer/final_loss"] == fit["scorer/final_loss"]


def test_metaworld_source_episode_is_seeded():
    from planners.robot.sources import run_episode

    a = run_episode("reach-v3", "exec_noise", seed=3, max_steps=15)
    b = run_episode("reach-v3", "exec_noise", seed=3, max_steps=15)
    assert np.array_equal(a.obs, b.obs) and np.array_equal(a.actions, b.actions)
    assert a.obs.shape == (16, 39) and a.actions.shape == (15, 4)
    assert not np.array_equal(a.actions, a.executed)   # the noise is executed, not logged
