"""Reward protocol, registry and the composite reward the trainer calls.

A reward maps decoded outputs and their batch to ``RewardOutput(score, valid, info)``.
``score`` is [B] (or [B, A] for multi-agent planners); ``valid`` marks scores that could
be computed. There are no sentinel values: a failed score is ``valid=False``.

Every reward shares the fields of ``RewardConfig``: where it runs (``device``, ``dtype``,
``offload``) and how it fails (``timeout_s``, ``max_consecutive_failures``).
``Reward.__call__`` isolates failures: an exception, a NaN or a timeout marks the
affected samples invalid (counted in ``info`` and in the composite's metrics) instead of
crashing the run, and a reward that fails for a whole batch ``max_consecutive_failures``
calls in a row raises ``RewardFailure`` so a dead reward cannot silently train on nothing.

Aggregation: ``CompositeReward`` computes the weighted sum. Per-reward group
normalisation before summing (multi-reward balancing, so a hard reward with a small spread
is not drowned by an easy one) needs the globally gathered groups and therefore lives in
``flowrl.algorithms.advantages.per_reward_normalize`` (``algorithm.per_reward_norm=true``
on the GRPO-family configs).
"""
from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

from flowrl._fields import hfield
from flowrl.registry import ConfigError, Registry
from flowrl.types import RewardOutput

REWARDS = Registry("reward")

DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class RewardFailure(RuntimeError):
    """A reward failed for a whole batch ``max_consecutive_failures`` calls in a row.

    The trainer does not catch it: the run stops with this one-line message.
    """


@dataclass
class RewardConfig:
    """Fields every reward config has; a reward's own config subclasses this."""

    name: str = hfield("", "registered reward name (see `flowrl validate --list rewards`)")
    weight: float = hfield(1.0, "weight of this reward in the aggregate (0 = log only)")
    label: Optional[str] = hfield(None, "name in metrics and reports (default: name); lets one config use a reward twice")
    device: str = hfield("cpu", "device the reward model runs on: cpu, cuda, cuda:1, mps, ...")
    dtype: str = hfield("float32", "reward model dtype: float32, bfloat16 or float16 (scores are returned as float32)")
    offload: bool = hfield(False, "keep the reward model on the CPU between calls and move it to `device` only to score")
    timeout_s: float = hfield(
        0.0, "seconds one call may take before its samples are marked invalid (0 = no limit); "
        "the timed-out worker thread cannot be killed and finishes in the background")
    max_consecutive_failures: int = hfield(
        3, "stop the run (RewardFailure) after this many calls in a row in which no sample could be scored (0 = never)")

    def __post_init__(self) -> None:
        key = self.name or "reward"
        if self.dtype not in DTYPES:
            raise ConfigError(f"{key}.dtype: '{self.dtype}' is not one of {', '.join(DTYPES)}")
        if not (self.timeout_s >= 0):
            raise ConfigError(f"{key}.timeout_s: must be >= 0 (0 = no limit), got {self.timeout_s}")
        if self.max_consecutive_failures < 0:
            raise ConfigError(f"{key}.max_consecutive_failures: must be >= 0 (0 = never stop), "
                              f"got {self.max_consecutive_failures}")


def _one_line(err: BaseException) -> str:
    """``"TypeName: first line of the message"``."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _invalid(n: int, error: str) -> RewardOutput:
    """[n] zero scores, all invalid, with the error recorded in ``info``."""
    return RewardOutput(torch.zeros(n), torch.zeros(n, dtype=torch.bool), {"error": error})


class Reward:
    """Base class: subclasses implement ``score(outputs, batch) -> RewardOutput``.

    Subclasses that hold ``torch.nn.Module`` attributes get device/dtype placement and
    offloading for free: call ``self.place(module)`` after loading, and ``models()``
    lists them (every module attribute). ``score`` runs under ``torch.no_grad`` unless
    the class sets ``differentiable = True``.
    """

    differentiable: bool = False

    def __init__(self, config: RewardConfig):
        self.config = config
        self.consecutive_failures = 0  # calls in a row in which no sample was scored
        self.failed_calls = 0  # total calls in which no sample was scored
        self._busy: Optional[threading.Thread] = None  # a timed-out call still running

    # ------------------------------------------------------------------ placement
    @property
    def name(self) -> str:
        """The reward's label in metrics (``config.label``, else its registered name)."""
        return self.config.label or self.config.name

    @property
    def device(self) -> torch.device:
        return torch.device(getattr(self.config, "device", "cpu"))

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[getattr(self.config, "dtype", "float32")]

    @property
    def offload(self) -> bool:
        return bool(getattr(self.config, "offload", False))

    def models(self) -> List[torch.nn.Module]:
        """The torch modules this reward owns (every ``nn.Module`` attribute)."""
        return [v for v in vars(self).values() if isinstance(v, torch.nn.Module)]

    def place(self, module: torch.nn.Module) -> torch.nn.Module:
        """Put a freshly loaded module in eval mode, cast it to ``dtype`` and move it to
        ``device`` (or keep it on the CPU when offloading)."""
        module.eval().requires_grad_(self.differentiable)
        return module.to(device="cpu" if self.offload else self.device, dtype=self.dtype)

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        """Move offloaded models to ``device`` for the duration of a call."""
        if not self.offload or self.device.type == "cpu":
            yield
            return
        for m in self.models():
            m.to(self.device)
        try:
            yield
        finally:
            for m in self.models():
                m.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    # ------------------------------------------------------------------ scoring
    def score(self, outputs: Any, batch: Sequence[Any]) -> RewardOutput:
        raise NotImplementedError

    def _score_guarded(self, outputs: Any, batch: Sequence[Any]) -> RewardOutput:
        # grad mode is thread-local, so it is set here (inside the worker thread if any)
        grad = contextlib.nullcontext() if self.differentiable else torch.no_grad()
        with grad, self.on_device():
            return self.score(outputs, batch)

    def _score_with_timeout(self, outputs: Any, batch: Sequence[Any], timeout: float) -> RewardOutput:
        """Run ``score`` in a worker thread and wait ``timeout`` seconds for it.

        A Python thread cannot be killed: a timed-out call keeps running in the background
        (holding the model). The next call first waits up to ``timeout`` for it, and
        fails as timed out when it is still busy, so calls never overlap on one model.
        """
        if self._busy is not None:
            self._busy.join(timeout)
            if self._busy.is_alive():
                raise TimeoutError(f"still busy with a call that timed out (timeout_s={timeout})")
            self._busy = None
        box: Dict[str, Any] = {}

        def work() -> None:
            try:
                box["out"] = self._score_guarded(outputs, batch)
            except BaseException as e:  # handed to the caller's thread
                box["err"] = e

        worker = threading.Thread(target=work, name=f"reward-{self.name}", daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            self._busy = worker
            raise TimeoutError(f"no result after {timeout} s (timeout_s)")
        if "err" in box:
            raise box["err"]
        return box["out"]

    def __call__(self, outputs: Any, batch: Sequence[Any]) -> RewardOutput:
        """Score with failure isolation: an exception, NaN or timeout marks samples invalid.

        Returns float32 scores with invalid entries zeroed; ``info["error"]`` holds the
        error of a failed call and ``info["num_invalid"]`` the invalid count. Raises
        ``RewardFailure`` after ``max_consecutive_failures`` whole-batch failures in a row.
        """
        n = len(batch)
        timeout = float(getattr(self.config, "timeout_s", 0.0) or 0.0)
        try:
            if timeout > 0:
                out = self._score_with_timeout(outputs, batch, timeout)
            else:
                out = self._score_guarded(outputs, batch)
            if out.score.shape[:1] != (n,):
                raise ValueError(f"score shape {tuple(out.score.shape)} does not start with the batch size {n}")
            score = out.score.detach().float().cpu() if not self.differentiable else out.score.float()
            valid = out.valid.to(score.device) & torch.isfinite(score)
            out = RewardOutput(torch.where(valid, score, torch.zeros_like(score)), valid, dict(out.info))
        except Exception as e:  # a broken reward must not kill the run; it is counted
            out = _invalid(n, _one_line(e))
        out.info["num_invalid"] = int((~out.valid).sum())
        self._count_failure(out, n)
        return out

    def _count_failure(self, out: RewardOutput, n: int) -> None:
        """Track whole-batch failures and stop the run after too many in a row."""
        if n == 0:
            return
        if bool(out.valid.any()):
            self.consecutive_failures = 0
            return
        self.consecutive_failures += 1
        self.failed_calls += 1
        limit = int(getattr(self.config, "max_consecutive_failures", 0) or 0)
        if limit and self.consecutive_failures >= limit:
            last = out.info.get("error", "every sample scored NaN or invalid")
            raise RewardFailure(
                f"reward '{self.name}' failed for a whole batch {self.consecutive_failures} calls in a row "
                f"(max_consecutive_failures={limit}); last error: {last}")


def build_reward(config: RewardConfig) -> Reward:
    return REWARDS.get(config.name).builder(config)


@dataclass
class CompositeOutput:
    """Aggregate of several rewards. total/valid: [B] or [B, A]; per_reward: name -> [B];
    groups: name -> B labels for the rewards that return ``info["groups"]`` (a label per
    sample, e.g. a prompt's category) so evaluation can break scores down."""

    total: torch.Tensor
    valid: torch.Tensor
    per_reward: Dict[str, torch.Tensor]
    per_valid: Dict[str, torch.Tensor]
    metrics: Dict[str, float]
    groups: Dict[str, List[str]] = field(default_factory=dict)


class CompositeReward:
    """Calls every configured reward and combines them with their weights.

    The weighted sum is computed here; per-reward group normalisation before summing
    (multi-reward balancing) lives in ``flowrl.algorithms.advantages`` because it needs
    the globally gathered groups.

    Metrics (this process's batch): ``reward/<name>`` (mean of valid scores),
    ``reward/<name>_invalid_frac`` and ``reward/<name>_failures`` (calls so far in which
    the reward could score no sample).
    """

    def __init__(self, configs: List[RewardConfig]):
        if not configs:
            raise ConfigError("rewards: empty; name at least one reward, e.g. rewards=[{name: ...}]")
        names = [c.label or c.name for c in configs]
        if len(set(names)) != len(names):
            raise ConfigError(f"rewards: duplicate reward names {names}; give each reward once or set distinct labels")
        self.rewards = [build_reward(c) for c in configs]
        self.weights = {c.label or c.name: float(c.weight) for c in configs}

    @property
    def names(self) -> List[str]:
        return [r.name for r in self.rewards]

    def __call__(self, outputs: Any, batch: Sequence[Any]) -> CompositeOutput:
        per, per_valid, metrics, groups = {}, {}, {}, {}
        total, valid = None, None
        for r in self.rewards:
            out = r(outputs, batch)
            per[r.name], per_valid[r.name] = out.score, out.valid
            if out.info.get("groups") is not None:
                groups[r.name] = [str(g) for g in out.info["groups"]]
            v = out.valid
            metrics[f"reward/{r.name}"] = float(out.score[v].mean()) if bool(v.any()) else math.nan
            metrics[f"reward/{r.name}_invalid_frac"] = float((~v).float().mean()) if v.numel() else 0.0
            metrics[f"reward/{r.name}_failures"] = float(getattr(r, "failed_calls", 0))
            w = self.weights[r.name]
            contrib = w * out.score
            total = contrib if total is None else total + contrib
            if w != 0:
                valid = v if valid is None else valid & v
        if valid is None:
            valid = torch.ones_like(total, dtype=torch.bool)
        return CompositeOutput(total, valid, per, per_valid, metrics, groups)
