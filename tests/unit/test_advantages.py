import torch; torch.set_num_threads(1)  # noqa: E702,I001
# Analytic-oracle tests for flowrl.algorithms.advantages and the VG-GRPO variance gate.
# Every expected number is derived by hand in a comment next to it (population std, ddof = 0).

import math

import pytest

from flowrl.algorithms.advantages import (
    best_of_group,
    group_normalize,
    group_stats,
    per_reward_normalize,
    zero_std_fraction,
)
from flowrl.algorithms.vggrpo import VGGRPO, VGGRPOConfig, variance_gate
from flowrl.types import Trajectory

torch.manual_seed(0)

S = 1.0 / math.sqrt(2.0 / 3.0)  # 1 / pop-std of {-1, 0, 1} = 1.224744871


def t(*v, dtype=torch.float32):
    return torch.tensor(v, dtype=dtype)


def ids(*v):
    return torch.tensor(v, dtype=torch.long)


def close(a, b, atol=1e-5):
    a = torch.as_tensor(a, dtype=torch.float64)
    b = torch.as_tensor(b, dtype=torch.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert torch.allclose(a, b, atol=atol, rtol=0), f"\n got {a}\nwant {b}"


# ----------------------------------------------------------------------------- group_stats
def test_group_stats_hand_example():
    # group 3: {2, 4}: mean 3, std 1, cnt 2
    # group 8: {1, 1, 7}: mean 3, devs -2 -2 4, var (4+4+16)/3 = 8, std 2*sqrt(2), cnt 3
    v, g = t(2, 4, 1, 1, 7), ids(3, 3, 8, 8, 8)
    mean, std, cnt = group_stats(v, g)
    close(mean, [3, 3, 3, 3, 3])
    close(std, [1, 1, 2 * math.sqrt(2), 2 * math.sqrt(2), 2 * math.sqrt(2)])
    close(cnt, [2, 2, 3, 3, 3])


def test_group_stats_excludes_invalid():
    # last member invalid: group 8 = {1, 1}: mean 1, std 0, cnt 2 (also reported for the invalid one)
    v, g = t(2, 4, 1, 1, 7), ids(3, 3, 8, 8, 8)
    valid = torch.tensor([True, True, True, True, False])
    mean, std, cnt = group_stats(v, g, valid)
    close(mean, [3, 3, 1, 1, 1])
    close(std, [1, 1, 0, 0, 0])
    close(cnt, [2, 2, 2, 2, 2])


# ----------------------------------------------------------------------------- group_normalize
def test_group_normalize_hand_values_zero_mean_unit_std():
    # group 0 {1,2,3}: mean 2, std sqrt(2/3) -> (-1, 0, 1) * 1.2247
    # group 1 {10,20,30,40}: mean 25, devs -15 -5 5 15, var 500/4 = 125, std 11.1803
    #   -> -15/11.1803 = -1.3416, -5/11.1803 = -0.4472, ...
    v, g = t(1, 2, 3, 10, 20, 30, 40), ids(0, 0, 0, 1, 1, 1, 1)
    adv = group_normalize(v, g, std_eps=0.0)
    close(adv, [-S, 0, S, -1.3416408, -0.4472136, 0.4472136, 1.3416408])
    for gid in (0, 1):
        a = adv[g == gid].double()
        assert abs(float(a.mean())) < 1e-6
        assert abs(float(a.std(unbiased=False)) - 1.0) < 1e-6
    # with the default eps (1e-4) the std is std / (std + eps): still ~1 for these groups
    adv_eps = group_normalize(v, g)
    assert abs(float(adv_eps[:3].double().std(unbiased=False)) - math.sqrt(2 / 3) / (math.sqrt(2 / 3) + 1e-4)) < 1e-6
    assert adv_eps.dtype == torch.float32


def test_group_normalize_invalid_excluded_and_zeroed():
    # valid {1, 3, 5}: mean 3, std sqrt(8/3) = 1.63299 -> -2/1.633 = -1.2247, 0, +1.2247; the
    # invalid 100 gets 0 (including it would move the mean to 27.25).
    v, g = t(1, 3, 100, 5), ids(0, 0, 0, 0)
    valid = torch.tensor([True, True, False, True])
    adv = group_normalize(v, g, valid, std_eps=0.0)
    close(adv, [-S, 0, 0, S])


def test_group_normalize_groups_with_fewer_than_two_valid_get_zero():
    # group 0 {1, 2} has one valid member -> 0, 0; group 1 {5, 6}: mean 5.5, std .5 -> -1, 1;
    # group 2 is a singleton -> 0.
    v, g = t(1, 2, 5, 6, 9), ids(0, 0, 1, 1, 2)
    valid = torch.tensor([True, False, True, True, True])
    adv = group_normalize(v, g, valid, std_eps=0.0)
    close(adv, [0, 0, -1, 1, 0])


def test_group_normalize_zero_std_group_is_zero_not_nan():
    v, g = t(0.5, 0.5, 0.5), ids(0, 0, 0)
    adv = group_normalize(v, g)
    close(adv, [0, 0, 0])


def test_group_normalize_global_std():
    # group means 1 and 12; global values {0, 2, 10, 14}: mean 6.5, devs -6.5 -4.5 3.5 7.5,
    # squares 42.25 + 20.25 + 12.25 + 56.25 = 131, var 32.75, std 5.722762
    # -> (-1, 1, -2, 2) / 5.722762 = (-0.174741, 0.174741, -0.349482, 0.349482)
    # (the per-group std would give -1, 1, -1, 1)
    v, g = t(0, 2, 10, 14), ids(0, 0, 1, 1)
    adv = group_normalize(v, g, std_eps=0.0, global_std=True)
    close(adv, [-0.174741, 0.174741, -0.349482, 0.349482])
    close(group_normalize(v, g, std_eps=0.0), [-1, 1, -1, 1])


def test_group_normalize_global_std_ignores_invalid():
    # invalid 1000 is excluded from the global std: same as above
    v, g = t(0, 2, 10, 14, 1000), ids(0, 0, 1, 1, 1)
    valid = torch.tensor([True, True, True, True, False])
    adv = group_normalize(v, g, valid, std_eps=0.0, global_std=True)
    close(adv, [-0.174741, 0.174741, -0.349482, 0.349482, 0])


def test_group_normalize_clip():
    # {0,0,0,10}: mean 2.5, var (3*6.25 + 56.25)/4 = 18.75, std 4.330127
    # -> -2.5/4.330127 = -0.577350 (x3), 7.5/4.330127 = 1.732051 -> clipped to 1.5
    v, g = t(0, 0, 0, 10), ids(0, 0, 0, 0)
    close(group_normalize(v, g, std_eps=0.0), [-0.577350] * 3 + [1.732051])
    close(group_normalize(v, g, std_eps=0.0, clip=1.5), [-0.577350] * 3 + [1.5])
    # mirrored: the lone low reward is clipped from below
    v2 = t(10, 10, 10, 0)
    close(group_normalize(v2, g, std_eps=0.0, clip=1.5), [0.577350] * 3 + [-1.5])


def test_group_normalize_per_agent_columns():
    # column 0 {1, 2, 3} -> (-1.2247, 0, 1.2247)
    # column 1 {0, 0, 9}: mean 3, devs -3 -3 6, var 54/3 = 18, std 4.242641
    #   -> -0.707107, -0.707107, 1.414214
    v = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 9.0]])
    g = ids(0, 0, 0)
    adv = group_normalize(v, g, std_eps=0.0)
    close(adv, [[-S, -0.707107], [0, -0.707107], [S, 1.414214]])
    # per-agent validity: column 1 keeps {0, 9}: mean 4.5, std 4.5 -> -1, (0), 1
    valid = torch.tensor([[True, True], [True, False], [True, True]])
    adv = group_normalize(v, g, valid, std_eps=0.0)
    close(adv, [[-S, -1], [0, 0], [S, 1]])


# ----------------------------------------------------------------------------- zero_std_fraction
def test_zero_std_fraction_hand_batch():
    # groups (non-contiguous ids): 5 {1,1,1} zero; 2 {1,2} non-zero; 9 {5,5} zero; 0 {3,4} non-zero
    v = t(1, 1, 1, 1, 2, 5, 5, 3, 4)
    g = ids(5, 5, 5, 2, 2, 9, 9, 0, 0)
    assert zero_std_fraction(v, g) == pytest.approx(0.5)
    # the 2 of group 2 becomes invalid -> group 2's valid rewards {1} coincide -> 3 of 4
    valid = torch.ones(9, dtype=torch.bool)
    valid[4] = False
    assert zero_std_fraction(v, g, valid) == pytest.approx(0.75)


# ----------------------------------------------------------------------------- per_reward_normalize
def test_per_reward_normalize_balances_spreads():
    # a: tiny spread {.01, .02, .03} -> (-1.2247, 0, 1.2247); b: huge spread {300, 200, 100}
    # -> (1.2247, 0, -1.2247). Summed with weight 1 each they cancel exactly: b does not
    # drown a (a plain sum a + b would be ~(300, 200, 100)).
    g = ids(0, 0, 0)
    per = {"a": t(0.01, 0.02, 0.03), "b": t(300, 200, 100)}
    ok = {k: torch.ones(3, dtype=torch.bool) for k in per}
    adv, valid = per_reward_normalize(per, ok, {"a": 1.0, "b": 1.0}, g, std_eps=1e-12)
    close(adv, [0, 0, 0], atol=1e-4)
    assert valid.all()
    # weights scale contributions: 2a + b = (-2.4495 + 1.2247, 0, 2.4495 - 1.2247)
    adv, _ = per_reward_normalize(per, ok, {"a": 2.0, "b": 1.0}, g, std_eps=1e-12)
    close(adv, [-S, 0, S], atol=1e-4)
    # a missing weight defaults to 1; weight 0 drops a reward: 3a alone
    adv, _ = per_reward_normalize(per, ok, {"a": 3.0, "b": 0.0}, g, std_eps=1e-12)
    close(adv, [-3 * S, 0, 3 * S], atol=1e-4)
    adv, _ = per_reward_normalize(per, ok, {"b": 2.0}, g, std_eps=1e-12)
    close(adv, [-S + 2 * S, 0, S - 2 * S], atol=1e-4)


def test_per_reward_normalize_validity():
    # b invalid at index 1: b normalised over {300, 100} -> (1, 0, -1); combined valid only
    # where every weighted reward is valid -> index 1 gets 0.
    # total = 2 a + b = (-2.4495 + 1, 0, 2.4495 - 1) = (-1.4495, 0, 1.4495)
    g = ids(0, 0, 0)
    per = {"a": t(0.01, 0.02, 0.03), "b": t(300, 200, 100), "c": t(1, 2, 3)}
    ok = {"a": torch.ones(3, dtype=torch.bool), "b": torch.tensor([True, False, True]),
          "c": torch.tensor([False, False, False])}
    adv, valid = per_reward_normalize(per, ok, {"a": 2.0, "b": 1.0, "c": 0.0}, g, std_eps=1e-12)
    close(adv, [-2 * S + 1, 0, 2 * S - 1], atol=1e-4)
    # c has weight 0, so its invalidity does not matter
    assert valid.tolist() == [True, False, True]


def test_per_reward_normalize_all_zero_weights_raises():
    with pytest.raises(ValueError):
        per_reward_normalize({"a": t(1, 2)}, {"a": torch.ones(2, dtype=torch.bool)}, {"a": 0.0}, ids(0, 0))


# ----------------------------------------------------------------------------- variance_gate
def test_variance_gate_three_regimes():
    # std1 = .03, std2 = .06
    # group 0 {.5, .5}: std 0 -> dropped
    # group 1 {0, .1}: mean .05, std .05 in (.03, .06] -> centred only: -.05, .05
    # group 2 {0, 0, .3}: mean .1, devs -.1 -.1 .2, var .06/3 = .02, std .141421 > .06
    #   -> scaled: -.707107, -.707107, 1.414214
    v = t(0.5, 0.5, 0.0, 0.1, 0.0, 0.0, 0.3)
    g = ids(0, 0, 1, 1, 2, 2, 2)
    valid = torch.ones(7, dtype=torch.bool)
    adv, kept, std = variance_gate(v, g, valid, 0.03, 0.06)
    close(adv, [0, 0, -0.05, 0.05, -0.707107, -0.707107, 1.414214])
    assert kept.tolist() == [False, False, True, True, True, True, True]
    close(std, [0, 0, 0.05, 0.05, 0.141421, 0.141421, 0.141421])


def test_variance_gate_exact_thresholds():
    # values exact in binary so that std == threshold exactly. std1 = .25, std2 = .5
    # {0, .5}: std .25 == std1 -> dropped
    # {0, .75}: std .375 -> centred: -.375, .375
    # {0, 1}: std .5 == std2 -> centred (not scaled): -.5, .5
    # {0, 1.5}: std .75 > std2 -> scaled: -1, 1
    v = t(0, 0.5, 0, 0.75, 0, 1.0, 0, 1.5)
    g = ids(0, 0, 1, 1, 2, 2, 3, 3)
    valid = torch.ones(8, dtype=torch.bool)
    adv, kept, _ = variance_gate(v, g, valid, 0.25, 0.5)
    close(adv, [0, 0, -0.375, 0.375, -0.5, 0.5, -1, 1])
    assert kept.tolist() == [False, False] + [True] * 6


def test_variance_gate_invalid_members():
    # group {0, 1, 99(invalid)}: stats from {0, 1}: mean .5, std .5 -> scaled (std2 = .1): -1, 1, 0
    # group {2(invalid), 7}: one valid member -> dropped
    v = t(0, 1, 99, 2, 7)
    g = ids(0, 0, 0, 1, 1)
    valid = torch.tensor([True, True, False, False, True])
    adv, kept, _ = variance_gate(v, g, valid, 0.05, 0.1)
    close(adv, [-1, 1, 0, 0, 0])
    assert kept.tolist() == [True, True, False, False, False]


def _traj(rewards, group_ids, valid=None):
    n = len(rewards)
    return Trajectory(
        states=torch.zeros(n, 3, 2), times=torch.tensor([1.0, 0.5, 0.0]).expand(n, 3),
        cond={}, group_ids=ids(*group_ids), sample_ids=torch.arange(n),
        rewards=t(*rewards), valid=torch.ones(n, dtype=torch.bool) if valid is None else valid,
    )


def test_vggrpo_compute_advantages_absolute():
    # same groups as test_variance_gate_three_regimes plus a fourth group with one valid member
    traj = _traj([0.5, 0.5, 0.0, 0.1, 0.0, 0.0, 0.3, 4.0, 0.0], [0, 0, 1, 1, 2, 2, 2, 3, 3],
                 torch.tensor([True] * 7 + [True, False]))
    algo = VGGRPO(VGGRPOConfig(std1=0.03, std2=0.06))
    out, m = algo.compute_advantages(traj, {}, {}, {})
    close(out.advantages, [0, 0, -0.05, 0.05, -0.707107, -0.707107, 1.414214, 0, 0])
    close(out.weights, [0, 0, 1, 1, 1, 1, 1, 0, 0])
    # groups 0 and 3 dropped out of 4
    assert m["adv/dropped_group_frac"] == pytest.approx(0.5)
    # zero-std groups: group 0 and group 3 (one valid reward) -> 2 / 4
    assert m["adv/zero_std_frac"] == pytest.approx(0.5)
    assert m["adv/gate_std1"] == 0.03 and m["adv/gate_std2"] == 0.06
    assert algo.running_std is None  # absolute mode keeps no running statistic


# ----------------------------------------------------------------------------- best_of_group
def test_best_of_group_ties_invalid_and_singletons():
    # group 0: two tied at the best of 4 -> 1/2 - 1/4 each, -1/4 for the rest; group 1: all
    # tied -> 0; group 2: one valid member -> 0 (the invalid one too)
    v = t(1, 3, 2, 3, 5, 5, 0, 9)
    valid = torch.tensor([True] * 7 + [False])
    close(best_of_group(v, ids(0, 0, 0, 0, 1, 1, 2, 2), valid), [-0.25, 0.25, -0.25, 0.25, 0, 0, 0, 0])


def test_best_of_group_per_agent_columns_and_zero_sum():
    v = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    out = best_of_group(v, ids(0, 0, 0))
    close(out, [[-1 / 3, -1 / 3], [2 / 3, -1 / 3], [-1 / 3, 2 / 3]])  # each agent has its own best
    close(out.sum(0), [0, 0])  # zero-sum per group and agent: a random best has no expected push


def test_vggrpo_best_weight_adds_centred_best_bonus_to_dropped_groups():
    # group 0 {0.5, 0.7}: std 0.1 <= std1 -> dropped by the gate, but the best bonus keeps it
    # (+-0.5 x 2 = +-1); group 1 {0, 4}: std 2 > std2 1 -> scaled -1, 1, plus the bonus +-1
    traj = _traj([0.5, 0.7, 0.0, 4.0], [0, 0, 1, 1])
    out, m = VGGRPO(VGGRPOConfig(std1=0.5, std2=1.0, best_weight=2.0)).compute_advantages(traj, {}, {}, {})
    close(out.advantages, [-1, 1, -2, 2])
    close(out.weights, [1, 1, 1, 1])
    assert m["adv/dropped_group_frac"] == pytest.approx(0.5)  # the gate's own statistic is unchanged
    plain, _ = VGGRPO(VGGRPOConfig(std1=0.5, std2=1.0)).compute_advantages(traj, {}, {}, {})
    close(plain.advantages, [0, 0, -1, 1])
    close(plain.weights, [0, 0, 1, 1])
    with pytest.raises(ValueError, match="best_weight"):
        VGGRPOConfig(best_weight=-1.0)


# relative mode, batch 1: group stds 2.5 ({0,5}), .15 ({0,.3}), .05 ({0,.1}), 1.3 ({0,2.6})
# -> batch std = mean = 4.0 / 4 = 1.0 -> running std 1.0 -> thresholds .1, .2
#    {0,5}: scaled -1, 1;  {0,.3}: centred -.15, .15;  {0,.1}: dropped;  {0,2.6}: scaled -1, 1
BATCH1 = ([0, 5, 0, 0.3, 0, 0.1, 0, 2.6], [0, 0, 1, 1, 2, 2, 3, 3])
# batch 2: stds .15, .25, 7.55, .05 -> batch std 8.0 / 4 = 2.0
# EMA: running = .9 * 1.0 + .1 * 2.0 = 1.1 -> thresholds .11, .22
#    {0,.3} (std .15): centred;  {0,.5} (std .25): scaled;  {0,15.1}: scaled;  {0,.1}: dropped
# (without the EMA the thresholds would be .2, .4: {0,.3} dropped and {0,.5} centred)
BATCH2 = ([0, 0.3, 0, 0.5, 0, 15.1, 0, 0.1], [0, 0, 1, 1, 2, 2, 3, 3])


def test_vggrpo_relative_gate_follows_running_std():
    cfg = VGGRPOConfig(gate="relative", std1=0.1, std2=0.2, running_momentum=0.9)
    algo = VGGRPO(cfg)
    out, m = algo.compute_advantages(_traj(*BATCH1), {}, {}, {})
    assert algo.running_std == pytest.approx(1.0, abs=1e-6)
    assert m["adv/gate_std1"] == pytest.approx(0.1, abs=1e-6)
    assert m["adv/gate_std2"] == pytest.approx(0.2, abs=1e-6)
    close(out.advantages, [-1, 1, -0.15, 0.15, 0, 0, -1, 1])
    assert m["adv/dropped_group_frac"] == pytest.approx(0.25)

    state = algo.state_dict()
    out2, m2 = algo.compute_advantages(_traj(*BATCH2), {}, {}, {})
    assert algo.running_std == pytest.approx(1.1, abs=1e-6)
    assert m2["adv/gate_std1"] == pytest.approx(0.11, abs=1e-6)
    assert m2["adv/gate_std2"] == pytest.approx(0.22, abs=1e-6)
    close(out2.advantages, [-0.15, 0.15, -1, 1, -1, 1, 0, 0])
    close(out2.weights, [1, 1, 1, 1, 1, 1, 0, 0])

    # checkpoint round trip: a fresh algorithm restored from batch 1's state reproduces batch 2
    restored = VGGRPO(cfg)
    restored.load_state_dict(state)
    assert restored.running_std == pytest.approx(1.0, abs=1e-6)
    out3, m3 = restored.compute_advantages(_traj(*BATCH2), {}, {}, {})
    close(out3.advantages, out2.advantages)
    assert m3["adv/gate_std1"] == pytest.approx(m2["adv/gate_std1"])
    assert restored.running_std == pytest.approx(1.1, abs=1e-6)

    # a fresh algorithm without the state starts its running std at batch 2's (2.0):
    # thresholds .2, .4 -> {0,.3} dropped, {0,.5} centred, {0,15.1} scaled, {0,.1} dropped
    fresh = VGGRPO(cfg)
    out4, m4 = fresh.compute_advantages(_traj(*BATCH2), {}, {}, {})
    assert m4["adv/gate_std1"] == pytest.approx(0.2, abs=1e-6)
    close(out4.advantages, [0, 0, -0.25, 0.25, -1, 1, 0, 0])


def test_drop_invalid_groups_drops_whole_group():
    from flowrl.algorithms.advantages import group_all
    from flowrl.algorithms.grpo import GRPO, GRPOConfig

    ids = torch.tensor([0, 0, 0, 1, 1, 1])
    valid = torch.tensor([True, False, True, True, True, True])
    assert group_all(valid, ids).tolist() == [False, False, False, True, True, True]
    traj = Trajectory(states=torch.zeros(6, 2, 1), times=torch.zeros(6, 2), cond={}, group_ids=ids,
                      sample_ids=torch.arange(6), rewards=torch.tensor([1.0, 5.0, 3.0, 1.0, 2.0, 3.0]), valid=valid)
    keep_samples, _ = GRPO(GRPOConfig(group_size=3)).compute_advantages(traj, {}, {}, {})
    drop_groups, metrics = GRPO(GRPOConfig(group_size=3, drop_invalid_groups=True)).compute_advantages(traj, {}, {}, {})
    # default: group 0 keeps its two valid members, normalised by their own stats (mean 2, std 1)
    assert keep_samples.weights.tolist() == [1, 0, 1, 1, 1, 1]
    assert torch.allclose(keep_samples.advantages[:3], torch.tensor([-1.0, 0.0, 1.0]), atol=1e-3)
    assert drop_groups.weights.tolist() == [0, 0, 0, 1, 1, 1]
    assert drop_groups.advantages[:3].abs().sum() == 0 and metrics["adv/dropped_frac"] == 0.5
