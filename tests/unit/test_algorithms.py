import torch; torch.set_num_threads(1)  # noqa: E702,I001
# Analytic-oracle tests for the GRPO, FDFO and flow-matching losses (CPU, tiny models).
# Expected numbers are derived by hand in the comments next to them.

import math

import pytest
from torch import nn

from flowrl.algorithms.base import Policy
from flowrl.algorithms.fdfo import (
    FDFO,
    FDFOConfig,
    endpoint_offsets,
    fdfo_surrogate,
    pair_reward_difference,
)
from flowrl.algorithms.flow_matching import FlowMatching, FlowMatchingConfig, weighted_regression
from flowrl.algorithms.grpo import GRPO, GRPOConfig, k3_kl, ppo_clip_loss, step_weights
from flowrl.mdp import sample_chain, time_grid
from flowrl.samplers import ChurnSampler, EulerSampler, FlowSDESampler
from flowrl.testing import assert_close
from flowrl.types import Trajectory

torch.manual_seed(0)


def close(a, b, atol=1e-5):
    assert_close(a, b, atol)


class LinearVelocity(nn.Module):
    """v(x, t) = x W^T + t b: a tiny differentiable velocity field on R^2."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.tensor([[0.5, -0.2], [0.1, 0.3]]))
        self.b = nn.Parameter(torch.tensor([0.2, -0.1]))

    def forward(self, x, t, cond=None):
        return x @ self.W.T + t[:, None].to(x.dtype) * self.b


def gens(n, base=0):
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


# ============================================================================ GRPO pieces
def test_k3_kl_hand_numbers():
    # r = log_ref - log_p; k3 = e^r - r - 1
    # (0, ln 2): r = ln 2 -> 2 - 0.693147 - 1 = 0.306853
    # (ln 2, 0): r = -ln 2 -> 0.5 + 0.693147 - 1 = 0.193147
    # (0.3, 0.3): r = 0 -> 0
    log_p = torch.tensor([0.0, math.log(2), 0.3])
    log_ref = torch.tensor([math.log(2), 0.0, 0.3])
    close(k3_kl(log_p, log_ref), [0.306853, 0.193147, 0.0])


def test_ppo_clip_loss_hand_numbers_asymmetric():
    # clip_low .2, clip_high .3 -> ratio clamped to [0.8, 1.3]; loss = max(-A r, -A clamp(r))
    #  A=+1 r=1.5 : max(-1.5, -1.3) = -1.3  clipped
    #  A=+1 r=0.5 : max(-0.5, -0.8) = -0.5  not clipped
    #  A=-1 r=1.5 : max( 1.5,  1.3) =  1.5  not clipped
    #  A=-1 r=0.5 : max( 0.5,  0.8) =  0.8  clipped
    #  A=+2 r=1.25: inside [0.8, 1.3] -> -2.5 not clipped (a symmetric .2 clip would give -2.4)
    #  A=-2 r=0.75: max(1.5, 1.6) = 1.6 clipped
    #  A=+1 r=1   : -1 not clipped
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.25, 0.75, 1.0])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0, -2.0, 1.0])
    loss, clipped = ppo_clip_loss(ratio.log(), adv, 0.2, 0.3)
    close(loss, [-1.3, -0.5, 1.5, 0.8, -2.5, 1.6, -1.0])
    assert clipped.tolist() == [True, False, False, True, False, True, False]
    # symmetric .2: the A=+2, r=1.25 case is now clipped to -2 * 1.2 = -2.4
    loss_sym, clipped_sym = ppo_clip_loss(ratio.log(), adv, 0.2, 0.2)
    assert float(loss_sym[4]) == pytest.approx(-2.4, abs=1e-6) and bool(clipped_sym[4])


def test_step_weights_values():
    # gamma^(K-1-k), K = 4, gamma = .5: k = 0..3 -> .125, .25, .5, 1
    close(step_weights(torch.arange(4), 4, 0.5), [0.125, 0.25, 0.5, 1.0])
    close(step_weights(torch.tensor([2, 0]), 3, 0.9), [1.0, 0.81])
    close(step_weights(torch.arange(3), 3, 1.0), [1.0, 1.0, 1.0])


# ============================================================================ GRPO loss
K = 3
ADV = torch.tensor([1.0, -0.5, 0.25, 2.0])


def _grpo_setup(step_gamma=0.9, **cfg):
    model = LinearVelocity()
    sampler = FlowSDESampler.flow_grpo(0.7)
    x_init = torch.randn(4, 2, generator=torch.Generator().manual_seed(11))
    res = sample_chain(model, sampler, x_init, {}, time_grid(K), gens(4))
    traj = Trajectory(states=res["states"], times=res["times"], cond={}, group_ids=torch.tensor([0, 0, 1, 1]),
                      sample_ids=torch.arange(4), log_probs=res["log_probs"],
                      advantages=ADV.clone(), weights=torch.tensor([1.0, 1.0, 1.0, 0.0]))
    algo = GRPO(GRPOConfig(group_size=2, step_gamma=step_gamma, **cfg))
    units = algo.make_units(traj, torch.arange(K))
    policy = Policy(velocity=model, reference_velocity=lambda x, t, c: model(x, t).detach(), sampler=sampler)
    return algo, model, policy, units


def test_grpo_loss_at_old_policy():
    algo, model, policy, units = _grpo_setup(kl_beta=0.0)
    # sample 3 has weight 0 -> dropped: 3 samples x 3 steps
    assert units["sample_idx"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    loss, m = algo.loss(units, {}, policy)
    close(m["policy/ratio"], torch.ones(9), atol=1e-6)
    close(m["policy/approx_kl"], torch.zeros(9), atol=1e-10)
    close(m["policy/clipfrac"], torch.zeros(9))
    # loss = -A * 0.9^(2-k): A = 1 -> -.81 -.9 -1; A = -.5 -> .405 .45 .5; A = .25 -> -.2025 -.225 -.25
    close(loss, [-0.81, -0.9, -1.0, 0.405, 0.45, 0.5, -0.2025, -0.225, -0.25], atol=1e-5)


def test_grpo_kl_zero_when_reference_is_policy():
    for kl_type in ("gaussian_mean", "k3"):
        algo, model, policy, units = _grpo_setup(kl_beta=0.5, kl_type=kl_type)
        loss, m = algo.loss(units, {}, policy)
        close(m["policy/kl_ref"], torch.zeros(9), atol=1e-7)
        close(loss, [-0.81, -0.9, -1.0, 0.405, 0.45, 0.5, -0.2025, -0.225, -0.25], atol=1e-5)


# Hand transition for the KL tests: constant policy velocity v = (.2, -.4), x = (.3, -.7),
# t = .5 -> t_next = .25, flow_grpo eta = .7:
#   sigma = .7 sqrt(.5/.5) = .7, coef = sigma^2 / (2t) = .49, dt = -.25, std = .7 sqrt(.25) = .35
#   eps_hat = x + .5 v = (.4, -.9); drift = v + .49 eps_hat = (.396, -.841)
#   mu = x + dt drift = (.201, -.48975)
# The reference velocity is v + c, c = (.1, .2): mu - mu_ref = -dt (1 + coef (1 - t)) c = -.31125 c
#   mean_elements (mu - mu_ref)^2 = .31125^2 (.01 + .04) / 2 = .0024219140625
#   KL = .0024219140625 / (2 * .35^2) = .0024219140625 / .245 = .0098853635
KL_HAND = 0.0024219140625 / 0.245
C_SHIFT = torch.tensor([0.1, 0.2])


def _kl_units_policy(kl_type, kl_beta=0.5):
    p = nn.Parameter(torch.tensor([0.2, -0.4]))
    sampler = FlowSDESampler.flow_grpo(0.7)
    velocity = lambda x, t, c: p.expand_as(x)  # noqa: E731
    reference = lambda x, t, c: (p + C_SHIFT).expand_as(x).detach()  # noqa: E731
    x = torch.tensor([[0.3, -0.7]])
    x_next = torch.tensor([[0.201, -0.48975]])  # = mu, the policy's mean
    t, t_next = torch.tensor([0.5]), torch.tensor([0.25])
    with torch.no_grad():
        old = sampler.step(p.expand_as(x), x, t, t_next, x_next=x_next)
    close(old.mean, [[0.201, -0.48975]], atol=1e-6)
    close(old.std, [0.35], atol=1e-6)
    units = {"sample_idx": torch.tensor([0]), "x": x, "x_next": x_next, "t": t, "t_next": t_next,
             "old_log_prob": old.log_prob, "adv": torch.tensor([0.3]), "valid": torch.tensor([1.0]),
             "step_weight": torch.tensor([1.0])}
    algo = GRPO(GRPOConfig(group_size=2, kl_beta=kl_beta, kl_type=kl_type))
    return algo, units, Policy(velocity=velocity, reference_velocity=reference, sampler=sampler)


def test_grpo_gaussian_mean_kl_hand_shift():
    algo, units, policy = _kl_units_policy("gaussian_mean")
    loss, m = algo.loss(units, {}, policy)
    close(m["policy/kl_ref"], [KL_HAND], atol=1e-7)
    # at the old policy: loss = -A + beta KL = -.3 + .5 * .0098853635
    close(loss, [-0.3 + 0.5 * KL_HAND], atol=1e-6)


def test_grpo_k3_kl_hand_shift():
    # x_next = mu: log p_ref - log p = -||mu - mu_ref||^2 / (2 std^2) summed over 2 elements
    #   = -2 * .0024219140625 / .245 = -.019770727; per-dim ratio (default) halves it:
    #   r = -.0098853635 -> k3 = e^r - r - 1
    algo, units, policy = _kl_units_policy("k3")
    loss, m = algo.loss(units, {}, policy)
    r = -KL_HAND  # k3 = 4.8700e-5 (~ r^2 / 2); without the per-dim ratio it would be 1.93e-4
    # atol: exp(r) - r - 1 is evaluated in float32, whose cancellation error is ~1e-7
    close(m["policy/kl_ref"], [math.exp(r) - r - 1], atol=3e-7)


def test_grpo_gradient_at_old_policy_is_policy_gradient():
    algo, model, policy, units = _grpo_setup(kl_beta=0.0)
    loss, _ = algo.loss(units, {}, policy)
    g_loss = torch.autograd.grad(loss.sum(), [model.W, model.b])
    # oracle: d/dtheta exp(lp - old) = d lp/dtheta at ratio 1, so
    # grad = -sum_u A_u w_u d(log_prob_u / event_size)/dtheta   (event size 2)
    v = model(units["x"], units["t"])
    lp = policy.sampler.step(v, units["x"], units["t"], units["t_next"], x_next=units["x_next"]).log_prob
    target = -(units["adv"] * units["step_weight"] * lp / 2).sum()
    g_ref = torch.autograd.grad(target, [model.W, model.b])
    for a, b in zip(g_loss, g_ref):
        assert float(b.abs().max()) > 1e-3  # the check is not vacuous
        close(a, b, atol=1e-5)


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_grpo_gradient_step_sign(adv):
    # one SGD step on the loss raises the log-prob of a positive-advantage action and
    # lowers that of a negative-advantage one
    algo, model, policy, units = _grpo_setup(kl_beta=0.0)
    one = {k: v[:1] for k, v in units.items()}
    one["adv"] = torch.tensor([adv])

    def logp():
        with torch.no_grad():
            v = model(one["x"], one["t"])
            return float(policy.sampler.step(v, one["x"], one["t"], one["t_next"], x_next=one["x_next"]).log_prob)

    before = logp()
    loss, _ = algo.loss(one, {}, policy)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    opt.zero_grad()
    loss.sum().backward()
    opt.step()
    after = logp()
    assert (after - before) * adv > 1e-6


def test_grpo_per_agent_loss_masks_invalid_agents():
    # x [1, A=2, 2] with event_ndim = 1 -> per-agent log-probs [1, 2]; agent 1 is invalid.
    # At the old policy the per-agent PPO term is -A: (-1, -2) * valid (1, 0) = (-1, 0);
    # one loss per unit = mean over agents = -.5 (an unmasked loss would be -1.5)
    p = torch.tensor([0.2, -0.4])
    sampler = FlowSDESampler.flow_grpo(0.7)
    velocity = lambda x, t, c: p.expand_as(x)  # noqa: E731
    x = torch.tensor([[[0.3, -0.7], [1.0, 0.5]]])
    x_next = torch.tensor([[[0.2, -0.5], [0.8, 0.6]]])
    t, t_next = torch.tensor([0.5]), torch.tensor([0.25])
    old = sampler.step(velocity(x, t, {}), x, t, t_next, x_next=x_next, event_ndim=1)
    assert old.log_prob.shape == (1, 2)
    units = {"sample_idx": torch.tensor([0]), "x": x, "x_next": x_next, "t": t, "t_next": t_next,
             "old_log_prob": old.log_prob, "adv": torch.tensor([[1.0, 2.0]]),
             "valid": torch.tensor([[1.0, 0.0]]), "step_weight": torch.tensor([0.5])}
    algo = GRPO(GRPOConfig(group_size=2, kl_beta=0.0))
    loss, m = algo.loss(units, {}, Policy(velocity=velocity, reference_velocity=velocity, sampler=sampler,
                                          event_ndim=1))
    # times the step weight .5 -> -.25
    close(loss, [-0.25])
    close(m["policy/ratio"], [1.0])


def test_grpo_compute_advantages_and_units_mask():
    # rewards: group 0 {1, 3} -> -1, 1, clipped to +-.5 by adv_clip_max; group 1 {2, 2 (invalid)}: one
    # valid member -> 0, 0
    states = torch.zeros(4, K + 1, 2)
    traj = Trajectory(states=states, times=time_grid(K).expand(4, -1), cond={},
                      group_ids=torch.tensor([0, 0, 1, 1]), sample_ids=torch.arange(4),
                      log_probs=torch.zeros(4, K), rewards=torch.tensor([1.0, 3.0, 2.0, 2.0]),
                      valid=torch.tensor([True, True, True, False]))
    algo = GRPO(GRPOConfig(group_size=2, adv_clip_max=0.5))
    out, m = algo.compute_advantages(traj, {}, {}, {})
    close(out.advantages, [-0.5, 0.5, 0.0, 0.0])
    close(out.weights, [1, 1, 1, 0])
    assert m["adv/zero_std_frac"] == pytest.approx(0.5)
    units = algo.make_units(out, torch.tensor([1, 2]))
    # sample 3 (invalid) is dropped; sample 2 (valid, zero advantage) stays
    assert units["sample_idx"].tolist() == [0, 0, 1, 1, 2, 2]
    assert units["step"].tolist() == [1, 2, 1, 2, 1, 2]
    close(units["adv"], [-0.5, -0.5, 0.5, 0.5, 0, 0])


# ============================================================================ FDFO
def test_pair_reward_difference_hand():
    # pairs (1, 3): d = -1 -> (-1, 1); (5, 2): d = 1.5 -> (1.5, -1.5)
    close(pair_reward_difference(torch.tensor([1.0, 3.0, 5.0, 2.0])), [-1, 1, 1.5, -1.5])


FINAL = torch.tensor([[1.0, 3.0], [3.0, -1.0], [0.0, 0.0], [2.0, 0.0]])
# pair 0: delta = ((1,3) - (3,-1)) / 2 = (-1, 2), mean(delta^2) = (1 + 4) / 2 = 2.5 -> (-.4, .8);
#         the other branch (.4, -.8)
# pair 1: delta = ((0,0) - (2,0)) / 2 = (-1, 0), mean(delta^2) = .5 -> (-2, 0); other (2, 0)
DELTA_HAT = torch.tensor([[-0.4, 0.8], [0.4, -0.8], [-2.0, 0.0], [2.0, 0.0]])
# l_ref = -mean(delta_hat^2): (.16 + .64) / 2 = .4 ; (4 + 0) / 2 = 2
L_REF = torch.tensor([-0.4, -0.4, -2.0, -2.0])


def test_endpoint_offsets_hand():
    close(endpoint_offsets(FINAL), DELTA_HAT)
    # identical branches: delta = 0 is floored, no NaN
    same = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    close(endpoint_offsets(same), torch.zeros(2, 2))


def _fdfo_traj(valid=(True, True, True, True)):
    # 4 samples, K = 2, states: noise -> middle -> FINAL; velocities arbitrary hand values
    states = torch.stack([torch.full((4, 2), 0.5), torch.arange(8.0).view(4, 2) / 10, FINAL], dim=1)
    vel = torch.arange(16.0).view(4, 2, 2) / 4 - 1
    return Trajectory(states=states, times=torch.tensor([1.0, 0.5, 0.0]).expand(4, 3), cond={},
                      group_ids=torch.tensor([0, 0, 1, 1]), sample_ids=torch.arange(4), velocities=vel,
                      rewards=torch.tensor([1.0, 3.0, 5.0, 2.0]), valid=torch.tensor(valid))


def test_fdfo_make_units_targets():
    algo = FDFO(FDFOConfig())
    traj, m = algo.compute_advantages(_fdfo_traj(), {}, {}, {})
    close(traj.advantages, [-1, 1, 1.5, -1.5])
    assert m["adv/abs_mean"] == pytest.approx(1.25)
    units = algo.make_units(traj, torch.arange(2))
    idx = units["sample_idx"]
    assert idx.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    step = torch.tensor([0, 1] * 4)
    # v* = v_old - delta_hat at every recorded state
    close(units["v_target"], traj.velocities[idx, step] - DELTA_HAT[idx])
    close(units["l_ref"], L_REF[idx])
    close(units["d_r"], torch.tensor([-1, 1, 1.5, -1.5])[idx])
    close(units["x"], traj.states[idx, step])
    close(units["t"], torch.tensor([1.0, 0.5] * 4))


def test_fdfo_skips_tied_pairs_unless_anchored():
    traj = _fdfo_traj()
    traj = traj.replace(rewards=torch.tensor([1.0, 3.0, 2.0, 2.0]))  # pair 1 ties: dR = 0
    algo = FDFO(FDFOConfig())
    traj, m = algo.compute_advantages(traj, {}, {}, {})
    assert m["adv/zero_std_frac"] == 0.5
    assert algo.make_units(traj, torch.arange(2))["sample_idx"].tolist() == [0, 0, 1, 1]
    # off, or with the base anchor (whose term is not zero for a tie), every valid pair stays
    for cfg in (FDFOConfig(skip_ties=False), FDFOConfig(base_weight=0.1)):
        assert FDFO(cfg).make_units(traj, torch.arange(2))["sample_idx"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_fdfo_surrogate_hand_numbers():
    v_t = torch.tensor([[0.0, 0.0], [1.0, -1.0]])
    # unit 0: v - v* = (1, 0): l = -.5 = l_ref -> rho = 1, loss = -dR = -2
    # unit 1: v - v* = (1, 1): l = -1, l_ref = -.5 -> rho = e^-.5 = .6065307
    #   loss = -2 * .6065307 + 2 / (2 * .5) * (.6065307 - 1)^2 = -1.2130613 + 2 * .1548181 = -.9034251
    v = v_t + torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    loss, rho = fdfo_surrogate(v, v_t, torch.tensor([-0.5, -0.5]), torch.tensor([2.0, 2.0]), eps=0.5)
    close(rho, [1.0, 0.6065307])
    close(loss, [-2.0, -0.9034251])


def test_fdfo_trust_region_zero_at_rho_one():
    v_t = torch.zeros(3, 2)
    v = torch.tensor([[1.0, 1.0], [0.0, 2.0], [3.0, 1.0]])
    l_ref = -(v**2).mean(dim=1)  # = l -> rho = 1
    d_r = torch.tensor([0.7, -1.2, 0.0])
    for eps in (1e-3, 0.03, 100.0):
        loss, rho = fdfo_surrogate(v, v_t, l_ref, d_r, eps)
        close(rho, torch.ones(3))
        close(loss, -d_r)


def test_fdfo_loss_at_old_policy_with_real_chain():
    # branches from a churned chain of a linear field; policy == rollout policy -> rho = 1
    model = LinearVelocity()
    sampler = ChurnSampler(gamma=0.1)
    x_init = torch.randn(2, 2, generator=torch.Generator().manual_seed(3)).repeat_interleave(2, dim=0)
    res = sample_chain(model, sampler, x_init, {}, time_grid(4), gens(4, 100), record_velocity=True)
    traj = Trajectory(states=res["states"], times=res["times"], cond={}, group_ids=torch.tensor([0, 0, 1, 1]),
                      sample_ids=torch.arange(4), velocities=res["velocities"],
                      rewards=torch.tensor([0.2, 0.9, 0.4, 0.1]), valid=torch.ones(4, dtype=torch.bool))
    algo = FDFO(FDFOConfig(eps=0.03))
    traj, _ = algo.compute_advantages(traj, {}, {}, {})
    units = algo.make_units(traj, torch.arange(4))
    policy = Policy(velocity=model, reference_velocity=model, sampler=sampler)
    loss, m = algo.loss(units, {}, policy)
    close(m["policy/rho"], torch.ones(16), atol=1e-5)
    # dR: (.2 - .9)/2 = -.35 -> (-.35, .35); (.4 - .1)/2 = .15 -> (.15, -.15); loss = -dR
    d_r = torch.tensor([-0.35, 0.35, 0.15, -0.15]).repeat_interleave(4)
    close(loss, -d_r, atol=1e-5)


def test_fdfo_gradient_moves_endpoint_towards_better_branch():
    algo = FDFO(FDFOConfig(eps=0.03))
    traj, _ = algo.compute_advantages(_fdfo_traj(), {}, {}, {})
    units = algo.make_units(traj, torch.arange(2))
    idx = units["sample_idx"]
    v_old = traj.velocities[idx, torch.tensor([0, 1] * 4)]
    V = nn.Parameter(v_old.clone())  # one free velocity per unit, starting at the old policy
    policy = Policy(velocity=lambda x, t, c: V, reference_velocity=lambda x, t, c: v_old, sampler=EulerSampler())
    loss, m = algo.loss(units, {}, policy)
    close(m["policy/rho"], torch.ones(8))
    loss.sum().backward()
    # at rho = 1: dloss/dv = -dR * drho/dv = -dR * (-2 (v - v*) / n) = dR * delta_hat (n = 2)
    #   sample 0: -1 * (-.4, .8) = (.4, -.8); sample 1: 1 * (.4, -.8); sample 2: 1.5 * (-2, 0) = (-3, 0);
    #   sample 3: -1.5 * (2, 0) = (-3, 0)
    g = torch.tensor([[0.4, -0.8], [0.4, -0.8], [-3.0, 0.0], [-3.0, 0.0]])
    close(V.grad, g[idx])
    x0_hat_old = units["x"] - units["t"][:, None] * V.detach()
    with torch.no_grad():
        V -= 0.01 * V.grad
    x0_hat_new = units["x"] - units["t"][:, None] * V.detach()
    # better branch: pair 0 -> sample 1 (R = 3 > 1), pair 1 -> sample 2 (R = 5 > 2)
    better = FINAL[torch.tensor([1, 1, 2, 2])][idx]
    worse = FINAL[torch.tensor([0, 0, 3, 3])][idx]
    move = ((x0_hat_new - x0_hat_old) * (better - worse)).sum(dim=1)
    assert bool((move > 0).all()), move


@pytest.mark.parametrize("valid,kept", [((True, True, True, False), [0, 0, 1, 1]),
                                        ((False, True, True, True), [2, 2, 3, 3])])
def test_fdfo_invalid_pairs_removed(valid, kept):
    algo = FDFO(FDFOConfig())
    traj, m = algo.compute_advantages(_fdfo_traj(valid), {}, {}, {})
    pair_ok = [valid[0] and valid[1], valid[2] and valid[3]]
    close(traj.weights, [float(pair_ok[i // 2]) for i in range(4)])
    close(traj.advantages, [(-1.0, 1.0, 1.5, -1.5)[i] * pair_ok[i // 2] for i in range(4)])
    # the invalid pair's dR is zeroed: counts as a zero-signal pair (1 of 2)
    assert m["adv/zero_std_frac"] == pytest.approx(0.5)
    units = algo.make_units(traj, torch.arange(2))
    assert units["sample_idx"].tolist() == kept


def test_fdfo_needs_pairs_and_velocities():
    algo = FDFO(FDFOConfig())
    t3 = _fdfo_traj()
    odd = t3.replace(states=t3.states[:3], rewards=t3.rewards[:3], valid=t3.valid[:3])
    with pytest.raises(ValueError):
        algo.compute_advantages(odd, {}, {}, {})
    traj, _ = algo.compute_advantages(t3, {}, {}, {})
    with pytest.raises(RuntimeError):
        algo.make_units(traj.replace(velocities=None), torch.arange(2))


def test_fdfo_base_weight_term():
    # reference (starting) policy = v + (.2, -.4): reg = mean(.04, .16) = .1; lambda = .5 -> +.05
    traj, _ = FDFO(FDFOConfig()).compute_advantages(_fdfo_traj(), {}, {}, {})
    units = FDFO(FDFOConfig()).make_units(traj, torch.arange(2))
    v_old = units["v_target"] + DELTA_HAT[units["sample_idx"]]
    shift = torch.tensor([0.2, -0.4])
    policy = Policy(velocity=lambda x, t, c: v_old, reference_velocity=lambda x, t, c: v_old + shift,
                    sampler=EulerSampler())
    base, _ = FDFO(FDFOConfig(base_weight=0.0)).loss(units, {}, policy)
    reg, m = FDFO(FDFOConfig(base_weight=0.5)).loss(units, {}, policy)
    close(m["policy/base_dist"], torch.full((8,), 0.1))
    close(reg - base, torch.full((8,), 0.05))
    close(base, -units["d_r"])


# ============================================================================ flow matching
def test_weighted_regression_hand():
    # (1*1 + 0*2 + 1*3 + 2*4) / (1 + 0 + 1 + 2) = 12 / 4 = 3
    assert float(weighted_regression(torch.tensor([1.0, 2, 3, 4]), torch.tensor([1.0, 0, 1, 2]))) == pytest.approx(3.0)
    # equal weights -> plain mean 2.5
    assert float(weighted_regression(torch.tensor([1.0, 2, 3, 4]), torch.full((4,), 2.0))) == pytest.approx(2.5)


X0 = torch.tensor([1.0, -2.0])


def _point_mass_policy(offset):
    # for a single data point x0, x_t = (1-t) x0 + t eps, so eps - x0 = (x_t - x0) / t exactly
    def v(x, t, cond):
        return (x - X0) / t[:, None] + offset

    return Policy(velocity=v, reference_velocity=v, sampler=EulerSampler())


def test_flow_matching_point_mass_exact_velocity():
    algo = FlowMatching(FlowMatchingConfig(weight_key="quality"))
    x0 = X0.expand(3, 2).clone()
    units = algo.make_offline_units(x0, {"quality": torch.tensor([1.0, 3.0, 0.5])})
    close(algo.unit_norm(units), [1.0, 3.0, 0.5])
    loss, m = algo.loss(units, {}, _point_mass_policy(torch.zeros(2)), generator=gens(3, 40))
    close(m["loss/regression"], torch.zeros(3), atol=1e-8)
    close(loss, torch.zeros(3), atol=1e-8)
    # off by c = (.3, -.4): per-sample loss mean(c^2) = (.09 + .16) / 2 = .125, times the weight
    loss, m = algo.loss(units, {}, _point_mass_policy(torch.tensor([0.3, -0.4])), generator=gens(3, 40))
    close(m["loss/regression"], torch.full((3,), 0.125))
    close(loss, [0.125, 0.375, 0.0625])
    # self-normalised: sum(w l) / sum(w) = .125
    assert float(loss.sum() / algo.unit_norm(units).sum()) == pytest.approx(0.125, abs=1e-6)


def test_flow_matching_uniform_weights_without_key():
    algo = FlowMatching(FlowMatchingConfig())
    units = algo.make_offline_units(X0.expand(2, 2).clone(), {})
    close(units["weight"], [1.0, 1.0])


def test_flow_matching_missing_weight_key_raises():
    algo = FlowMatching(FlowMatchingConfig(weight_key="quality"))
    with pytest.raises(ValueError, match="quality"):
        algo.make_offline_units(torch.zeros(2, 2), {"score": torch.ones(2)})
