"""Shared contract suite: every registered head and sampler passes the same checks.

Rewards have their own suite: tests/contracts/test_reward_contract.py."""
import torch

torch.set_num_threads(1)

import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.heads.base import check_head_contract  # noqa: E402
from flowrl.registry import HEADS  # noqa: E402
from flowrl.samplers import SAMPLERS, SamplerConfig, build_sampler  # noqa: E402

def _toy(tmp_path):
    entry = HEADS.get("toy")
    return entry.builder(entry.config_cls(pretrain_steps=20)), [0, 1, 2]


def _t2i(tmp_path):
    from flowrl.heads.t2i import T2IHeadConfig, build_t2i_head
    from flowrl.heads.t2i.tiny import build_tiny_sd3

    path = build_tiny_sd3(str(tmp_path / "pipe"))
    head = build_t2i_head(T2IHeadConfig(path=path, resolution=32, max_sequence_length=16, lora_rank=4))
    return head, ["a red circle", "a blue square", "a green star"]


def _driving_planner(tmp_path):
    from planners.driving.head import DrivingHead
    from planners.driving.scenes import make_scenes

    return DrivingHead.from_pretrained("planners/driving/pretrained"), make_scenes([1, 2, 3])


def _robot(tmp_path):
    from planners.robot.head import RobotHead

    g = torch.Generator().manual_seed(0)
    items = [{"obs": torch.randn(2, 39, generator=g), "task": i} for i in range(3)]
    return RobotHead.from_pretrained("planners/robot/pretrained/velocity"), items


# the smallest buildable instance of each registered head (the t2i families are all
# checked in tests/t2i; sd3 stands in here)
HEAD_FACTORIES = {"toy": _toy, "t2i": _t2i, "driving_planner": _driving_planner, "robot": _robot}


@pytest.mark.parametrize("name", HEADS.names())
def test_head_contract(name, tmp_path):
    assert name in HEAD_FACTORIES, f"add a factory for head '{name}' to HEAD_FACTORIES"
    head, items = HEAD_FACTORIES[name](tmp_path)
    check_head_contract(head, items, str(tmp_path / "saved"))


def _sampler(name):
    if name == "flow_sde_correlated":  # the SDE with noise correlated along each action's last axis
        return build_sampler(SamplerConfig(name="flow_sde", eta=0.7, noise_corr=0.6, noise_corr_dim=-1))
    alphas = (1 - torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)).cumprod(0) if name == "ddim" else None
    return build_sampler(SamplerConfig(name=name, eta=0.7), alphas)


@pytest.mark.parametrize("name", sorted(SAMPLERS) + ["flow_sde_correlated"])
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
