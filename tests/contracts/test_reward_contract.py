"""Shared reward contract: EVERY registered reward passes the same checks.

Each reward's case (a buildable config with tiny local weights, outputs and batch) comes
from ``make_<name>(tmp_path)`` in tests/contracts/reward_fixtures.py; a registered reward
without one fails ``test_every_reward_has_a_fixture`` (add the function, skip nothing).
Checks: shapes and dtypes, determinism, batch-size invariance, failure isolation
(exception -> all invalid, NaN -> invalid, timeout -> invalid, N whole-batch failures in a
row -> RewardFailure) and offline behaviour (missing weights -> a one-line error).
"""
import time

import torch

torch.set_num_threads(1)

import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
import rewards  # noqa: E402,F401  (registers every reward model)
from flowrl.registry import ConfigError  # noqa: E402
from rewards.base import REWARDS, RewardFailure, build_reward  # noqa: E402
from tests.contracts.reward_fixtures import fixtures  # noqa: E402

NAMES = REWARDS.names()
# registered names, plus variants ``<name>__<variant>`` (another configuration of a reward)
CASES = NAMES + sorted(k for k in fixtures() if "__" in k and k.split("__")[0] in NAMES)
TOL = dict(rtol=1e-5, atol=1e-5)

_BUILT = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """case id -> (RewardCase, Reward), each built once per module."""

    def get(case_id):
        if case_id not in _BUILT:
            make = fixtures().get(case_id)
            if make is None:
                pytest.fail(f"no fixture for reward '{case_id}': add `def make_{case_id}(tmp_path) -> RewardCase` "
                            f"to tests/contracts/reward_fixtures.py")
            case = make(tmp_path_factory.mktemp(case_id))
            _BUILT[case_id] = (case, build_reward(case.config))
        case, reward = _BUILT[case_id]
        reward.consecutive_failures = 0
        return case, reward

    return get


def _rows(x, idx):
    return x[idx] if isinstance(x, torch.Tensor) else type(x)(x[i] for i in idx) if isinstance(x, tuple) else [x[i] for i in idx]


@pytest.mark.parametrize("name", NAMES)
def test_every_reward_has_a_fixture(name):
    assert name in fixtures(), (f"reward '{name}' has no contract fixture: add `def make_{name}(tmp_path) -> RewardCase` "
                                f"to tests/contracts/reward_fixtures.py")


@pytest.mark.parametrize("case_id", CASES)
def test_shapes_and_dtypes(case_id, built):
    case, reward = built(case_id)
    out = reward(case.outputs, case.batch)
    n = len(case.batch)
    assert out.score.shape[0] == n and out.score.dim() in (1, 2), out.score.shape
    assert out.score.dtype == torch.float32
    assert out.valid.shape == out.score.shape and out.valid.dtype == torch.bool
    assert bool(out.valid.all()), f"clean inputs must be scorable: {out.info}"
    assert bool(torch.isfinite(out.score).all())


@pytest.mark.parametrize("case_id", CASES)
def test_deterministic(case_id, built):
    case, reward = built(case_id)
    a = reward(case.outputs, case.batch)
    b = reward(case.outputs, case.batch)
    assert torch.equal(a.score, b.score) and torch.equal(a.valid, b.valid)


@pytest.mark.parametrize("case_id", CASES)
def test_batch_size_invariant(case_id, built):
    case, reward = built(case_id)
    full = reward(case.outputs, case.batch)
    for idx in ([2, 3], [5], [4, 0, 1]):
        sub = reward(_rows(case.outputs, idx), [case.batch[i] for i in idx])
        assert torch.allclose(sub.score, full.score[idx], **TOL), (idx, sub.score, full.score[idx])
        assert torch.equal(sub.valid, full.valid[idx])


def _raise_inside(reward):
    """Make the reward's model raise (every torch submodule), or its scoring when it has none.
    Returns an undo function."""
    def boom(*args, **kwargs):
        raise RuntimeError("injected failure inside the model")

    handles = [m.register_forward_pre_hook(boom) for model in reward.models() for m in model.modules()]
    if handles:
        return lambda: [h.remove() for h in handles]
    reward.score = boom
    return lambda: vars(reward).pop("score")


@pytest.mark.parametrize("case_id", CASES)
def test_exception_inside_model_marks_all_invalid(case_id, built):
    case, reward = built(case_id)
    undo = _raise_inside(reward)
    try:
        out = reward(case.outputs, case.batch)
    finally:
        undo()
    assert out.score.shape[0] == len(case.batch) and not bool(out.valid.any())
    assert "injected failure" in out.info["error"] and bool(torch.isfinite(out.score).all())
    assert bool(reward(case.outputs, case.batch).valid.all())  # recovers once the model works again


@pytest.mark.parametrize("case_id", CASES)
def test_nan_is_invalid_never_a_sentinel(case_id, built):
    case, reward = built(case_id)
    clean = reward(case.outputs, case.batch)
    # a NaN score (e.g. from a model overflow) is reported invalid, the others untouched
    original = reward.score

    def nan_first(outputs, batch):
        out = original(outputs, batch)
        out.score = out.score.clone().float()
        out.score[0] = float("nan")
        return out

    reward.score = nan_first
    try:
        out = reward(case.outputs, case.batch)
    finally:
        vars(reward).pop("score")
    assert not bool(out.valid[0]) and bool(out.valid[1:].all()) and float(out.score[0]) == 0.0
    assert torch.allclose(out.score[1:], clean.score[1:], **TOL)
    # a NaN input sample: never a NaN score, never a crash, the other samples unaffected
    bad = case.outputs.clone()
    bad[0] = float("nan")
    out_bad = reward(bad, case.batch)
    assert bool(torch.isfinite(out_bad.score).all())
    assert not bool(out_bad.valid[0]) or bool(torch.isfinite(out_bad.score[0]))
    assert bool(out_bad.valid[1:].all()) and torch.allclose(out_bad.score[1:], clean.score[1:], **TOL)


@pytest.mark.parametrize("case_id", CASES)
def test_timeout_marks_invalid(case_id, built, monkeypatch):
    case, reward = built(case_id)
    original = reward.score

    def slow(outputs, batch):
        time.sleep(0.3)
        return original(outputs, batch)

    monkeypatch.setattr(reward.config, "timeout_s", 0.05)
    reward.score = slow
    try:
        out = reward(case.outputs, case.batch)
    finally:
        vars(reward).pop("score")
    assert not bool(out.valid.any()) and "TimeoutError" in out.info["error"]
    reward._busy.join()  # the timed-out worker finishes in the background
    monkeypatch.setattr(reward.config, "timeout_s", 0.0)  # recovery is not itself timed (load would flake it)
    assert bool(reward(case.outputs, case.batch).valid.all())


@pytest.mark.parametrize("case_id", CASES)
def test_consecutive_whole_batch_failures_stop_the_run(case_id, built):
    case, reward = built(case_id)
    limit = reward.config.max_consecutive_failures
    assert limit >= 1
    undo = _raise_inside(reward)
    try:
        for _ in range(limit - 1):
            assert not bool(reward(case.outputs, case.batch).valid.any())
        with pytest.raises(RewardFailure) as err:
            reward(case.outputs, case.batch)
    finally:
        undo()
    msg = str(err.value)
    assert "\n" not in msg and f"'{reward.name}'" in msg and "injected failure" in msg


@pytest.mark.parametrize("case_id", CASES)
def test_missing_weights_give_a_one_line_error(case_id, built, monkeypatch):
    case, _ = built(case_id)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if case.missing is None:  # a reward without weights builds offline from its defaults
        assert build_reward(case.config) is not None
        return
    with pytest.raises((FileNotFoundError, ConfigError)) as err:
        build_reward(case.missing)
    msg = str(err.value)
    assert "\n" not in msg and case.missing_name in msg, msg
