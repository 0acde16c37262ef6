"""Reward base class: config checks, failure isolation, timeout, consecutive failures,
placement (dtype, offload), and the composite reward's sum and metrics."""
import threading
import time
from dataclasses import dataclass

import pytest
import torch

import flowrl.builtins  # noqa: F401
from flowrl._fields import hfield
from flowrl.registry import ConfigError
from flowrl.types import RewardOutput
from rewards import REWARDS, CompositeReward, Reward, RewardConfig, RewardFailure


@dataclass
class ProbeConfig(RewardConfig):
    name: str = hfield("probe", "reward name")


class Probe(Reward):
    """Scores = first feature; ``mode`` switches between working, raising, NaN and hanging."""

    def __init__(self, config, mode="ok", delay=0.0):
        super().__init__(config)
        self.mode, self.delay, self.calls = mode, delay, 0
        self.linear = self.place(torch.nn.Linear(2, 1))

    def score(self, outputs, batch):
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.mode == "raise":
            raise RuntimeError("model exploded\nsecond line")
        s = outputs[:, 0].clone()
        if self.mode == "nan":
            s[:] = float("nan")
        if self.mode == "nan_first":
            s[0] = float("nan")
        return RewardOutput(s, torch.ones_like(s, dtype=torch.bool))


def _probe(mode="ok", **cfg):
    return Probe(ProbeConfig(**cfg), mode)


X = torch.arange(8.0).reshape(4, 2)


@pytest.mark.parametrize("kw, key", [({"dtype": "fp8"}, "dtype"), ({"timeout_s": -1.0}, "timeout_s"),
                                     ({"max_consecutive_failures": -2}, "max_consecutive_failures")])
def test_config_rejects_bad_values_with_the_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        ProbeConfig(**kw)


def test_every_registered_reward_config_field_has_help():
    for name in REWARDS.names():
        cls = REWARDS.get(name).config_cls
        for f in cls.__dataclass_fields__.values():
            assert f.metadata.get("help"), f"{name}.{f.name} has no help line"
        c = cls()
        assert c.device == "cpu" and c.dtype == "float32" and c.offload is False and c.max_consecutive_failures == 3


def test_exception_marks_whole_batch_invalid_with_one_line_error():
    out = _probe("raise")(X, list(range(4)))
    assert out.valid.tolist() == [False] * 4 and out.score.tolist() == [0.0] * 4
    assert out.info["error"] == "RuntimeError: model exploded" and out.info["num_invalid"] == 4


def test_nan_marks_only_that_sample_invalid():
    out = _probe("nan_first")(X, list(range(4)))
    assert out.valid.tolist() == [False, True, True, True]
    assert out.score.tolist() == [0.0, 2.0, 4.0, 6.0] and out.info["num_invalid"] == 1


def test_wrong_score_shape_is_a_failure_not_a_crash():
    r = _probe()
    r.score = lambda o, b: RewardOutput(torch.zeros(3), torch.ones(3, dtype=torch.bool))
    out = r(X, list(range(4)))
    assert not bool(out.valid.any()) and "batch size 4" in out.info["error"]


def test_no_grad_unless_differentiable():
    x = X.clone().requires_grad_(True)
    r = _probe()
    assert not r(x, list(range(4))).score.requires_grad

    class Diff(Probe):
        differentiable = True

    d = Diff(ProbeConfig())
    out = d(x, list(range(4)))
    out.score.sum().backward()
    assert x.grad is not None and x.grad[:, 0].tolist() == [1.0] * 4


def test_timeout_marks_invalid_and_never_overlaps_calls():
    r = Probe(ProbeConfig(timeout_s=0.05), "ok", delay=0.4)
    t0 = time.monotonic()
    out = r(X, list(range(4)))
    assert time.monotonic() - t0 < 0.3  # returned at the timeout, not after the call
    assert not bool(out.valid.any()) and "TimeoutError" in out.info["error"]
    # the worker cannot be killed: the next call waits up to timeout_s for it, then fails as busy
    out2 = r(X, list(range(4)))
    assert "still busy" in out2.info["error"] and r.calls == 1
    r._busy.join()
    r.delay = 0.0
    assert bool(r(X, list(range(4))).valid.all()) and r.consecutive_failures == 0


def test_timeout_runs_without_grad_in_the_worker_thread():
    seen = {}

    class GradProbe(Probe):
        def score(self, outputs, batch):
            seen["grad"] = torch.is_grad_enabled()
            seen["thread"] = threading.current_thread().name
            return super().score(outputs, batch)

    GradProbe(ProbeConfig(timeout_s=5.0))(X, list(range(4)))
    assert seen == {"grad": False, "thread": "reward-probe"}


def test_consecutive_whole_batch_failures_raise_reward_failure():
    r = _probe("raise", max_consecutive_failures=3)
    for _ in range(2):
        r(X, list(range(4)))
    r.mode = "ok"
    r(X, list(range(4)))  # a success resets the count
    assert r.consecutive_failures == 0 and r.failed_calls == 2
    r.mode = "nan"  # every sample NaN is a whole-batch failure too
    r(X, list(range(4)))
    r.mode = "raise"
    r(X, list(range(4)))
    with pytest.raises(RewardFailure) as err:
        r(X, list(range(4)))
    msg = str(err.value)
    assert "\n" not in msg and "'probe'" in msg and "3 calls in a row" in msg and "model exploded" in msg


def test_partial_failures_and_empty_batches_do_not_count():
    r = _probe("nan_first", max_consecutive_failures=1)
    for _ in range(3):
        r(X, list(range(4)))
    r.mode = "raise"
    r(X[:0], [])
    assert r.consecutive_failures == 0


def test_zero_disables_the_stop():
    r = _probe("raise", max_consecutive_failures=0)
    for _ in range(5):
        r(X, list(range(4)))
    assert r.failed_calls == 5


def test_place_casts_to_dtype_and_scores_stay_float32():
    r = _probe(dtype="bfloat16")
    assert r.linear.weight.dtype == torch.bfloat16 and not r.linear.training
    assert not r.linear.weight.requires_grad
    assert r(X, list(range(4))).score.dtype == torch.float32


def test_offload_keeps_models_on_cpu_between_calls():
    r = _probe(offload=True)
    assert r.models() == [r.linear] and r.linear.weight.device.type == "cpu"
    with r.on_device():
        assert r.linear.weight.device == r.device
    assert bool(r(X, list(range(4))).valid.all()) and r.linear.weight.device.type == "cpu"


def _cfg(name, **kw):
    return REWARDS.get(name).config_cls(**kw)


def test_composite_weighted_sum_metrics_and_failure_count():
    comp = CompositeReward([_cfg("toy_mode", weight=2.0), _cfg("toy_mode_fraction", weight=0.0)])
    x = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [float("nan"), 0.0]])
    out = comp(x, [0, 1, 2])
    a, b = out.per_reward["toy_mode"], out.per_reward["toy_mode_fraction"]
    assert torch.allclose(out.total, 2.0 * a + 0.0 * b)
    assert out.valid.tolist() == [True, True, False]  # weight-0 rewards do not gate validity
    assert out.metrics["reward/toy_mode_invalid_frac"] == pytest.approx(1 / 3)
    assert out.metrics["reward/toy_mode"] == pytest.approx(float(a[:2].mean()))
    assert out.metrics["reward/toy_mode_failures"] == 0.0
    bad = torch.full((3, 2), float("nan"))
    assert comp(bad, [0, 1, 2]).metrics["reward/toy_mode_failures"] == 1.0


def test_reward_failure_propagates_through_the_composite():
    comp = CompositeReward([_cfg("toy_mode", max_consecutive_failures=2)])
    bad = torch.full((3, 2), float("nan"))
    comp(bad, [0, 1, 2])
    with pytest.raises(RewardFailure, match="toy_mode"):
        comp(bad, [0, 1, 2])


def test_labels_let_one_config_use_a_reward_twice():
    from flowrl.testing import BrightnessConfig
    from rewards import CompositeReward

    comp = CompositeReward([BrightnessConfig(target=1.0), BrightnessConfig(target=0.0, label="darkness", weight=0.5)])
    out = comp(torch.full((2, 3, 4, 4), 0.25), ["a", "b"])
    assert comp.names == ["brightness", "darkness"]
    assert torch.allclose(out.total, torch.tensor([-0.75 + 0.5 * -0.25] * 2))
    assert "reward/darkness" in out.metrics
