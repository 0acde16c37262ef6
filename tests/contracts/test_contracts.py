"""Shared contract suite: every registered head, sampler and reward passes the same checks."""
import torch

torch.set_num_threads(1)

import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.heads.base import check_head_contract  # noqa: E402
from flowrl.registry import HEADS  # noqa: E402
from flowrl.samplers import SAMPLERS, SamplerConfig, build_sampler  # noqa: E402
from rewards import REWARDS  # noqa: E402

# the smallest buildable config of each head (heads that need weights add a local fixture)
HEAD_OVERRIDES = {"toy": {"pretrain_steps": 20}}


@pytest.mark.parametrize("name", HEADS.names())
def test_head_contract(name, tmp_path):
    entry = HEADS.get(name)
    head = entry.builder(entry.config_cls(**HEAD_OVERRIDES.get(name, {})))
    check_head_contract(head, [0, 1, 2], str(tmp_path / "saved"))


def _sampler(name):
    alphas = (1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)).cumprod(0) if name == "ddim" else None
    return build_sampler(SamplerConfig(name=name, eta=0.7), alphas)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_sampler_contract(name):
    s = _sampler(name)
    x = torch.randn(4, 3, 2)
    v = torch.randn(4, 3, 2)
    t, t_next = torch.full((4,), 0.6), torch.full((4,), 0.5)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    out = s.step(v, x, t, t_next, generator=gens)
    assert out.x_next.shape == x.shape and out.mean.shape == x.shape and out.std.shape == (4,)
    assert bool(torch.isfinite(out.x_next).all()) and bool(torch.isfinite(out.std).all())
    # stateless: the same call gives the same result
    again = s.step(v, x, t, t_next, generator=[torch.Generator().manual_seed(i) for i in range(4)])
    assert torch.equal(out.x_next, again.x_next)
    # scoring the sampled transition returns it unchanged, with the same log-prob
    scored = s.step(v, x, t, t_next, x_next=out.x_next)
    assert torch.equal(scored.x_next, out.x_next)
    if out.log_prob is None:
        assert bool((out.std == 0).all())
    else:
        assert out.log_prob.shape == (4,)
        assert torch.allclose(scored.log_prob, out.log_prob)
        # per-agent log-probs sum to the whole
        per_agent = s.step(v, x, t, t_next, x_next=out.x_next, event_ndim=1)
        assert per_agent.log_prob.shape == (4, 3)
        assert torch.allclose(per_agent.log_prob.sum(1), out.log_prob, atol=1e-4)


@pytest.mark.parametrize("name", REWARDS.names())
def test_reward_contract(name):
    entry = REWARDS.get(name)
    reward = entry.builder(entry.config_cls())
    outputs = torch.randn(6, 2)
    out = reward(outputs, list(range(6)))
    assert out.score.shape[0] == 6 and out.valid.shape == out.score.shape and out.valid.dtype == torch.bool
    assert bool(torch.isfinite(out.score).all())
    # batch-invariant: scoring a sub-batch gives the same scores
    sub = reward(outputs[2:4], [2, 3])
    assert torch.allclose(sub.score, out.score[2:4])
    # a NaN input is reported invalid, not as a sentinel
    bad = outputs.clone()
    bad[0] = float("nan")
    out_bad = reward(bad, list(range(6)))
    assert not bool(out_bad.valid[0]) or bool(torch.isfinite(out_bad.score[0]))
