"""Tiny diffusers pipelines (one per family), built once per test session."""
import pytest

from flowrl.heads.t2i.tiny import BUILDERS

FAMILIES = ["sd3", "flux", "sd"]


@pytest.fixture(scope="session")
def tiny_pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_pipelines")
    return {fam: BUILDERS[fam](str(root / fam)) for fam in FAMILIES}


def head_config(family, path, **kw):
    from flowrl.heads.t2i import T2IHeadConfig

    base = dict(family=family, path=path, resolution=32, max_sequence_length=16, lora_rank=4, lora_alpha=8)
    base.update(kw)
    return T2IHeadConfig(**base)


def assert_rescoring_gives_ratio_one(head, sampler, prompts, steps: int = 4):
    """Sample a seeded chain, then score each recorded transition again: same log-prob."""
    import torch

    from flowrl.mdp import sample_chain

    n = len(prompts)
    gens = lambda base: [torch.Generator().manual_seed(base + i) for i in range(n)]  # noqa: E731
    cond = head.encode(prompts)
    times = head.time_grid(steps)
    res = sample_chain(head.velocity, sampler, head.init_noise(cond, gens(0)), cond, times, gens(10))
    for k in range(steps):
        x, x_next = res["states"][:, k], res["states"][:, k + 1]
        t, t_next = times[k].expand(n), times[k + 1].expand(n)
        out = sampler.step(head.velocity(x, t, cond), x, t, t_next, x_next=x_next)
        d = x[0].numel()
        assert torch.allclose(out.log_prob / d, res["log_probs"][:, k] / d, atol=1e-5, rtol=0)
