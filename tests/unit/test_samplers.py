"""Analytic-oracle tests for flowrl.samplers (CPU, fast)."""
from __future__ import annotations

import math

import pytest
import torch

from flowrl.samplers import (
    ChurnSampler,
    DDIMSampler,
    EulerSampler,
    FlowCPSSampler,
    FlowSDESampler,
    SamplerConfig,
    build_sampler,
    cfg_combine,
    guided_velocity,
    heun_step,
)

torch.set_num_threads(1)

N_TRAIN = 1000


def _ddim_scheduler():
    from diffusers import DDIMScheduler

    return DDIMScheduler(
        num_train_timesteps=N_TRAIN,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=True,
        steps_offset=1,
    )


def _ddim(eta: float = 1.0) -> DDIMSampler:
    return DDIMSampler.from_scheduler_config(dict(_ddim_scheduler().config), eta=eta)


STOCHASTIC = {
    "flow_grpo": lambda: FlowSDESampler.flow_grpo(0.7),
    "dance_grpo": lambda: FlowSDESampler.dance_grpo(0.3),
    "ddim": lambda: _ddim(1.0),
    "churn": lambda: ChurnSampler(gamma=0.3),
    "cps": lambda: FlowCPSSampler(eta=0.5),
}


def _inputs(shape=(3, 4, 5, 2), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


# per-sample times on DDIM's grid (multiples of 1/N_TRAIN), t > t_next > 0 so std > 0
T = torch.tensor([0.6, 0.7, 0.8])
T_NEXT = torch.tensor([0.5, 0.65, 0.6])


# --------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_log_prob_matches_normal_and_scoring(name):
    sampler = STOCHASTIC[name]()
    v, x = _inputs()
    out = sampler.step(v, x, T, T_NEXT, generator=torch.Generator().manual_seed(1))
    assert out.log_prob is not None and out.log_prob.shape == (3,)
    assert bool((out.std > 0).all()) and out.std.shape == (3,)
    std_b = out.std.reshape(3, 1, 1, 1)
    ref = torch.distributions.Normal(out.mean, std_b.expand_as(x)).log_prob(out.x_next).sum(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob, ref, rtol=1e-5, atol=1e-3)

    scored = sampler.step(v, x, T, T_NEXT, x_next=out.x_next)
    assert torch.equal(scored.x_next, out.x_next)
    torch.testing.assert_close(scored.log_prob, out.log_prob)
    torch.testing.assert_close(scored.mean, out.mean)

    per_agent = sampler.step(v, x, T, T_NEXT, x_next=out.x_next, event_ndim=2)
    assert per_agent.log_prob.shape == (3, 4)
    torch.testing.assert_close(per_agent.log_prob.sum(-1), out.log_prob, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("name", sorted(STOCHASTIC))
def test_per_sample_generators_are_batch_independent(name):
    sampler = STOCHASTIC[name]()
    v, x = _inputs()
    gens = [torch.Generator().manual_seed(100 + i) for i in range(3)]
    batched = sampler.step(v, x, T, T_NEXT, generator=gens).x_next
    for i in range(3):
        alone = sampler.step(
            v[i : i + 1], x[i : i + 1], T[i : i + 1], T_NEXT[i : i + 1],
            generator=torch.Generator().manual_seed(100 + i),
        ).x_next
        torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=0)


def test_churn_init_per_sample_generators():
    sampler = ChurnSampler(gamma=0.3)
    _, x = _inputs()
    batched = sampler.init(x, [torch.Generator().manual_seed(7 + i) for i in range(3)])
    for i in range(3):
        alone = sampler.init(x[i : i + 1], torch.Generator().manual_seed(7 + i))
        torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=0)


# --------------------------------------------------------------------------- reductions to Euler
@pytest.mark.parametrize("schedule", ["flow_grpo", "constant"])
def test_sde_eta_zero_is_euler(schedule):
    v, x = _inputs()
    euler = EulerSampler().step(v, x, 0.7, 0.6)
    assert euler.log_prob is None
    exact = FlowSDESampler(eta=0.0, noise_schedule=schedule).step(v, x, 0.7, 0.6)
    assert exact.log_prob is None
    assert torch.equal(exact.x_next, euler.x_next)
    tiny = FlowSDESampler(eta=1e-6, noise_schedule=schedule).step(v, x, 0.7, 0.6, generator=torch.Generator().manual_seed(0))
    assert tiny.log_prob is not None
    torch.testing.assert_close(tiny.x_next, euler.x_next, rtol=0, atol=1e-5)


def test_churn_gamma_zero_is_euler_and_last_step_deterministic():
    v, x = _inputs()
    euler = EulerSampler().step(v, x, 0.7, 0.6)
    churn0 = ChurnSampler(gamma=0.0)
    assert torch.equal(churn0.init(x), x)
    assert torch.equal(churn0.step(v, x, 0.7, 0.6).x_next, euler.x_next)
    last = ChurnSampler(gamma=0.3).step(v, x, 0.1, 0.0)
    assert last.log_prob is None
    torch.testing.assert_close(last.x_next, x - 0.1 * v)


def test_sde_finite_at_t_one():
    v, x = _inputs()
    out = FlowSDESampler.flow_grpo(0.7).step(v, x, 1.0, 0.9, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(out.x_next).all() and torch.isfinite(out.log_prob).all()
    last = FlowSDESampler.flow_grpo(0.7).step(v, x, 0.1, 0.0, generator=torch.Generator().manual_seed(0))
    assert bool((last.std > 0).all()) and torch.isfinite(last.log_prob).all()


# --------------------------------------------------------------------------- ODE integrators
@pytest.mark.parametrize("steps", [1, 3, 10, 37])
def test_euler_constant_field_exact(steps):
    g = torch.Generator().manual_seed(0)
    x1, c = torch.randn(4, 3, generator=g), torch.randn(4, 3, generator=g)
    ts = torch.linspace(1, 0, steps + 1)
    x = x1
    for k in range(steps):
        x = EulerSampler().step(c, x, ts[k], ts[k + 1]).x_next
    torch.testing.assert_close(x, x1 - c, rtol=0, atol=1e-5)


def test_heun_linear_field():
    a, steps = 1.3, 200
    x1 = torch.randn(5, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    target = x1 * math.exp(-a)  # dx/dt = a x from t = 1 down to 0
    fn = lambda x, t, cond: a * x  # noqa: E731
    ts = torch.linspace(1, 0, steps + 1, dtype=torch.float64)
    xh, xe = x1, x1
    for k in range(steps):
        xh = heun_step(fn, xh, ts[k], ts[k + 1], {})
        xe = xe + (ts[k + 1] - ts[k]) * fn(xe, ts[k], {})
    err_heun, err_euler = (xh - target).abs().max().item(), (xe - target).abs().max().item()
    assert err_heun < 1e-4
    assert err_euler > 10 * err_heun


def test_heun_last_step_is_euler():
    calls = []
    fn = lambda x, t, cond: (calls.append(1), 2.0 * x)[1]  # noqa: E731
    x = torch.ones(2, 3)
    out = heun_step(fn, x, 0.1, 0.0, {})
    assert len(calls) == 1
    torch.testing.assert_close(out, x - 0.1 * 2.0 * x)


# --------------------------------------------------------------------------- marginal preservation
M, S, N_SAMPLES = 1.5, 0.5, 20_000


def _gaussian_velocity(x, t):
    """Exact E[eps - x0 | x_t] for x0 ~ N(M, S^2): x_t ~ N((1-t)M, V), V = (1-t)^2 S^2 + t^2,
    E[x0 | x_t] = M + (1-t) S^2 / V (x_t - (1-t)M), E[eps | x_t] = t / V (x_t - (1-t)M)."""
    t = t.reshape(-1, *([1] * (x.ndim - 1))).to(x.dtype)
    var = (1 - t) ** 2 * S**2 + t**2
    c = x - (1 - t) * M
    return t / var * c - (M + (1 - t) * S**2 / var * c)


def _assert_gaussian(x, mean, std, slack=0.0):
    """Sample mean / std of n draws have standard errors std/sqrt(n) and ~std/sqrt(2n): allow 5 SE
    (plus ``slack`` for a known discretisation bias)."""
    n = x.numel()
    assert abs(x.mean().item() - mean) < 5 * std / math.sqrt(n) + slack, (x.mean().item(), mean)
    assert abs(x.std().item() - std) < 5 * std / math.sqrt(2 * n) + slack, (x.std().item(), std)


def _marginal(t):
    return (1 - t) * M, math.sqrt((1 - t) ** 2 * S**2 + t**2)


@pytest.mark.parametrize("gamma", [0.0025, 0.5])
def test_churn_marginals_exact_for_straight_paths(gamma):
    """Per-sample data x0_i ~ N(M, S^2) with its exact (point-mass) field v = (x - x0_i) / t: Euler is
    exact on straight paths, so churn must give x_t ~ (1-t) x0 + t eps at every step; the
    population marginal is N((1-t)M, (1-t)^2 S^2 + t^2) (asserted at t = 0.5 and t = 0)."""
    g = torch.Generator().manual_seed(0)
    x0 = M + S * torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    sampler = ChurnSampler(gamma=gamma)
    x = sampler.init(torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64), g)
    _assert_gaussian(x, *_marginal(1.0))
    ts = torch.linspace(1, 0, 11, dtype=torch.float64)
    for k in range(10):
        x = sampler.step((x - x0) / ts[k], x, ts[k], ts[k + 1], generator=g).x_next
        if k == 4:
            _assert_gaussian(x, *_marginal(0.5))
            # and conditionally on x0 the noise part is exactly N(0, t^2)
            _assert_gaussian((x - 0.5 * x0) / 0.5, 0.0, 1.0)
    _assert_gaussian(x, M, S)


@pytest.mark.parametrize("init_gamma", [0.0, 0.5, 3.0])
def test_churn_init_gamma_keeps_the_marginal_and_sets_the_pair_distance(init_gamma):
    """init_gamma churns the starting noise alone: x_1 stays N(0, 1) for any strength, two
    branches of one base noise differ with variance 2 (c / (1 + g))^2, and the steps are
    gamma's (the same draws as without it)."""
    g = torch.Generator().manual_seed(2)
    base = torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    sampler = ChurnSampler(gamma=0.05, init_gamma=init_gamma)
    a, b = sampler.init(base, g), sampler.init(base, g)
    _assert_gaussian(a, 0.0, 1.0)
    share = ((1 + init_gamma) ** 2 - 1) / (1 + init_gamma) ** 2  # variance of the fresh noise in x_1
    if share == 0:  # no churn of the start: both branches begin at the base noise
        assert torch.equal(a, base) and torch.equal(b, base)
    else:
        _assert_gaussian((a - b) / math.sqrt(2 * share), 0.0, 1.0)
    x, v = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    plain = ChurnSampler(gamma=0.05)
    torch.testing.assert_close(sampler.step(v, x, 0.6, 0.5, generator=torch.Generator().manual_seed(3)).x_next,
                               plain.step(v, x, 0.6, 0.5, generator=torch.Generator().manual_seed(3)).x_next)
    same = ChurnSampler(gamma=0.05, init_gamma=None)  # None: gamma's init, draw for draw
    torch.testing.assert_close(same.init(base, torch.Generator().manual_seed(4)),
                               plain.init(base, torch.Generator().manual_seed(4)))


def test_churn_marginals_gaussian_field():
    """Exact Gaussian field E[eps - x0 | x_t]; 200 steps so the Euler bias (~0.004 in std, 0 in mean)
    is below the 5-SE sampling tolerance; the slack covers it explicitly."""
    g = torch.Generator().manual_seed(1)
    sampler = ChurnSampler()
    x = sampler.init(torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64), g)
    ts = torch.linspace(1, 0, 201, dtype=torch.float64)
    for k in range(200):
        x = sampler.step(_gaussian_velocity(x, ts[k].expand(N_SAMPLES)), x, ts[k], ts[k + 1], generator=g).x_next
        if k == 99:
            _assert_gaussian(x, *_marginal(0.5), slack=0.005)
    _assert_gaussian(x, M, S, slack=0.005)


@pytest.mark.parametrize("eta", [0.3, 1.0])
def test_cps_marginals_exact_for_straight_paths_at_few_steps(eta):
    """CPS keeps x_t ~ (1-t) x0 + t eps at every step of a coarse 5-step grid (point-mass field,
    as for churn above), and conditionally on x0 the noise part is exactly N(0, t^2)."""
    g = torch.Generator().manual_seed(3)
    x0 = M + S * torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    sampler = FlowCPSSampler(eta=eta)
    x = torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    ts = torch.linspace(1, 0, 6, dtype=torch.float64)
    for k in range(5):
        out = sampler.step((x - x0) / ts[k], x, ts[k], ts[k + 1], generator=g)
        x = out.x_next
        s = float(ts[k + 1])
        if s > 0:
            _assert_gaussian(x, *_marginal(s))
            _assert_gaussian((x - (1 - s) * x0) / s, 0.0, 1.0)
        else:
            assert out.log_prob is None and bool((out.std == 0).all())
    torch.testing.assert_close(x, x0)


def test_flow_grpo_sde_adds_excess_noise_at_few_steps_and_cps_does_not():
    """Why CPS: the Flow-GRPO SDE on a 5-step grid (eta 0.3, t capped at 0.99 at t = 1) leaves
    x_0.8 with a noise part of std ~1.35 where the path has 0.8; CPS at the same step's noise
    level keeps 0.8 (point-mass field, so the noise part is x - 0.2 x0)."""
    g = torch.Generator().manual_seed(4)
    x0 = M + S * torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    x1 = torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    sde = FlowSDESampler.flow_grpo(0.3).step(x1 - x0, x1, 1.0, 0.8, generator=g)
    assert abs((sde.x_next - 0.2 * x0).std().item() - 1.35) < 0.03
    cps = FlowCPSSampler(eta=0.3).step(x1 - x0, x1, 1.0, 0.8, generator=g)
    _assert_gaussian(cps.x_next - 0.2 * x0, 0.0, 0.8)


def test_cps_eta_zero_is_euler_and_eta_one_redraws_the_noise():
    v, x = _inputs()
    euler = EulerSampler().step(v, x, 0.7, 0.6)
    exact = FlowCPSSampler(eta=0.0).step(v, x, 0.7, 0.6)
    assert exact.log_prob is None
    torch.testing.assert_close(exact.x_next, euler.x_next)
    full = FlowCPSSampler(eta=1.0).step(v, x, 0.7, 0.6)  # mean = the endpoint's share only
    torch.testing.assert_close(full.mean, 0.4 * (x - 0.7 * v))
    torch.testing.assert_close(full.std, torch.full((3,), 0.6))
    with pytest.raises(ValueError, match="eta"):
        FlowCPSSampler(eta=1.5)


def test_flow_grpo_sde_marginal_gaussian_field():
    """Flow-GRPO SDE (eta 0.7, 100 steps) with the exact field ends at N(M, S^2) (bias ~4e-4 << SE)."""
    g = torch.Generator().manual_seed(2)
    sampler = FlowSDESampler.flow_grpo(0.7)
    x = torch.randn(N_SAMPLES, 1, generator=g, dtype=torch.float64)
    ts = torch.linspace(1, 0, 101, dtype=torch.float64)
    for k in range(100):
        x = sampler.step(_gaussian_velocity(x, ts[k].expand(N_SAMPLES)), x, ts[k], ts[k + 1], generator=g).x_next
    _assert_gaussian(x, M, S)


# --------------------------------------------------------------------------- DDIM parity
@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_ddim_matches_diffusers(eta):
    scheduler = _ddim_scheduler()
    scheduler.set_timesteps(50)
    sampler = DDIMSampler(scheduler.alphas_cumprod, eta=eta)
    stride = N_TRAIN // 50
    g = torch.Generator().manual_seed(0)
    for k, tau in enumerate(scheduler.timesteps.tolist()):
        x, eps = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 4, 8, 8, generator=g)
        noise = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(k))
        ref = scheduler.step(eps, tau, x, eta=eta, variance_noise=noise).prev_sample
        t = (tau + 1) / N_TRAIN
        t_prev = (tau - stride + 1) / N_TRAIN if tau - stride >= 0 else 0.0
        assert sampler.timestep(t).item() == tau
        out = sampler.step(eps, x, t, t_prev, generator=torch.Generator().manual_seed(k))
        torch.testing.assert_close(out.x_next, ref, rtol=1e-5, atol=1e-5)
        if eta == 0.0 or t_prev == 0.0:
            assert out.log_prob is None
        else:
            assert out.log_prob is not None


def test_ddim_rejects_off_grid_time():
    v, x = _inputs()
    with pytest.raises(ValueError):
        _ddim().step(v, x, 0.60005 + 0.0003, 0.5)


# --------------------------------------------------------------------------- CFG
class _Toy:
    """v = t * x + 2 * y (linear in cond['y']); records each call's batch size."""

    def __init__(self):
        self.batches = []

    def __call__(self, x, t, cond):
        self.batches.append(x.shape[0])
        t = torch.as_tensor(t, dtype=x.dtype)
        t = t.reshape(-1, 1) if t.ndim else t
        return t * x + 2 * cond["y"]


@pytest.mark.parametrize("t", [0.3, torch.tensor([0.1, 0.5, 0.9])])
def test_cfg(t):
    g = torch.Generator().manual_seed(0)
    x, yc, yu = (torch.randn(3, 4, generator=g) for _ in range(3))
    tt = torch.as_tensor(t).reshape(-1, 1) if isinstance(t, torch.Tensor) else t
    fn = _Toy()
    one = guided_velocity(fn, x, t, {"y": yc}, {"y": yu}, 1.0)
    torch.testing.assert_close(one, tt * x + 2 * yc)
    assert fn.batches == [3]
    fn = _Toy()
    out = guided_velocity(fn, x, t, {"y": yc}, {"y": yu}, 4.5)
    torch.testing.assert_close(out, tt * x + 2 * (yu + 4.5 * (yc - yu)))
    assert fn.batches == [6]
    torch.testing.assert_close(cfg_combine(yc, yu, 0.0), yu)


# --------------------------------------------------------------------------- correlated step noise
@pytest.mark.parametrize("rho", [0.3, 0.9])
def test_correlated_sde_log_prob_is_the_multivariate_normal(rho):
    """noise_corr: exact log-density of an equicorrelated Gaussian along the chunk's time axis."""
    sampler = FlowSDESampler(eta=0.7, noise_corr=rho, corr_dim=-2)
    v, x = _inputs()  # [B=3, A=4, H=5, D=2]
    out = sampler.step(v, x, T, T_NEXT, generator=torch.Generator().manual_seed(1), event_ndim=2)
    assert out.log_prob.shape == (3, 4)
    h = x.shape[2]
    corr = (1 - rho) * torch.eye(h, dtype=torch.float64) + rho
    ref = torch.zeros(3, 4, dtype=torch.float64)
    for b in range(3):
        cov = out.std[b].double() ** 2 * corr
        for a in range(4):
            for d in range(2):
                mvn = torch.distributions.MultivariateNormal(out.mean[b, a, :, d].double(), covariance_matrix=cov)
                ref[b, a] += mvn.log_prob(out.x_next[b, a, :, d].double())
    torch.testing.assert_close(out.log_prob.double(), ref, rtol=1e-5, atol=1e-3)
    whole = sampler.step(v, x, T, T_NEXT, x_next=out.x_next)
    torch.testing.assert_close(whole.log_prob, out.log_prob.sum(-1), rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match="event dims"):
        sampler.step(v, x, T, T_NEXT, x_next=out.x_next, event_ndim=1)


def test_correlated_noise_covariance_and_rho_zero_is_the_plain_sde():
    rho = 0.6
    sampler = FlowSDESampler(eta=1.0, noise_schedule="constant", noise_corr=rho, corr_dim=-2)
    n = 4000
    x = torch.zeros(n, 6, 2)
    t, t_next = torch.full((n,), 0.5), torch.full((n,), 0.25)
    out = sampler.step(torch.zeros_like(x), x, t, t_next, generator=torch.Generator().manual_seed(0))
    eps = ((out.x_next - out.mean) / out.std.reshape(-1, 1, 1)).reshape(n, -1)
    cov = torch.cov(eps.T)  # entries ordered (h, d): same d, different h -> rho; different d -> 0
    assert abs(float(cov.diagonal().mean()) - 1) < 0.05
    assert abs(float(cov[0, 2]) - rho) < 0.05 and abs(float(cov[0, 10]) - rho) < 0.05
    assert abs(float(cov[0, 1])) < 0.05
    # rho = 0 is the papers' sampler draw for draw
    v, x = _inputs()
    plain = FlowSDESampler(eta=0.7).step(v, x, T, T_NEXT, generator=torch.Generator().manual_seed(3))
    zero = FlowSDESampler(eta=0.7, noise_corr=0.0).step(v, x, T, T_NEXT, generator=torch.Generator().manual_seed(3))
    assert torch.equal(plain.x_next, zero.x_next) and torch.equal(plain.log_prob, zero.log_prob)
    with pytest.raises(ValueError, match="noise_corr"):
        FlowSDESampler(eta=0.7, noise_corr=1.0)


def test_correlated_noise_is_batch_independent():
    sampler = FlowSDESampler(eta=0.7, noise_corr=0.5)
    v, x = _inputs()
    batched = sampler.step(v, x, T, T_NEXT, generator=[torch.Generator().manual_seed(100 + i) for i in range(3)])
    for i in range(3):
        alone = sampler.step(v[i : i + 1], x[i : i + 1], T[i : i + 1], T_NEXT[i : i + 1],
                             generator=torch.Generator().manual_seed(100 + i))
        torch.testing.assert_close(batched.x_next[i : i + 1], alone.x_next, rtol=0, atol=0)


# --------------------------------------------------------------------------- config
def test_sampler_config_validation_and_build():
    with pytest.raises(ValueError, match=r"sampler\.name"):
        SamplerConfig(name="nope")
    with pytest.raises(ValueError, match=r"sampler\.eta"):
        SamplerConfig(eta=-1.0)
    with pytest.raises(ValueError, match=r"sampler\.gamma"):
        SamplerConfig(name="churn", gamma=-0.1)
    assert isinstance(build_sampler(SamplerConfig(name="euler")), EulerSampler)
    sde = build_sampler(SamplerConfig(name="flow_sde", eta=0.5))
    assert isinstance(sde, FlowSDESampler) and sde.noise_schedule == "flow_grpo" and sde.eta == 0.5
    assert build_sampler(SamplerConfig(name="dance_sde")).noise_schedule == "constant"
    assert isinstance(build_sampler(SamplerConfig(name="churn")), ChurnSampler)
    assert build_sampler(SamplerConfig(name="churn")).init_gamma is None
    assert build_sampler(SamplerConfig(name="churn", init_gamma=0.5)).init_gamma == 0.5
    with pytest.raises(ValueError, match=r"sampler\.init_gamma"):
        SamplerConfig(name="churn", init_gamma=-0.5)
    with pytest.raises(ValueError, match=r"sampler\.init_gamma"):
        SamplerConfig(name="flow_sde", init_gamma=0.5)
    corr = build_sampler(SamplerConfig(name="dance_sde", noise_corr=0.5, noise_corr_dim=-3))
    assert corr.noise_corr == 0.5 and corr.corr_dim == -3 and corr.noise_schedule == "constant"
    with pytest.raises(ValueError, match=r"sampler\.noise_corr"):
        SamplerConfig(noise_corr=1.0)
    with pytest.raises(ValueError, match=r"sampler\.noise_corr"):
        SamplerConfig(name="churn", noise_corr=0.5)
    with pytest.raises(ValueError, match=r"sampler\.noise_corr_dim"):
        SamplerConfig(noise_corr=0.5, noise_corr_dim=1)
    assert isinstance(build_sampler(SamplerConfig(name="cps", eta=0.4)), FlowCPSSampler)
    with pytest.raises(ValueError, match=r"sampler\.eta.*cps"):
        SamplerConfig(name="cps", eta=1.2)
    with pytest.raises(ValueError, match="alphas_cumprod"):
        build_sampler(SamplerConfig(name="ddim"))
    ddim = build_sampler(SamplerConfig(name="ddim", eta=1.0), alphas_cumprod=_ddim_scheduler().alphas_cumprod)
    assert isinstance(ddim, DDIMSampler) and ddim.prediction == "epsilon"
