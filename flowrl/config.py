"""TrainConfig: one run = head + sampler + chain + algorithm + rewards + data + trainer.

The dataclasses here are the truth; a YAML file is a serialised instance and
``key=value`` overrides on the command line use dotted paths (``optim.lr=1e-4``).
Invalid combinations fail in ``__post_init__`` with a message that says the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from flowrl._fields import hfield
from flowrl.algorithms import AlgorithmConfig
from flowrl.configlib import ConfigError, apply_overrides, from_dict, load_yaml, to_dict
from flowrl.mdp import ChainConfig
from flowrl.registry import ALGORITHMS, DATASETS, ENVIRONMENTS, HEADS
from flowrl.samplers import SamplerConfig
from rewards import REWARDS, RewardConfig

STOCHASTIC = ("flow_sde", "dance_sde", "cps", "ddim")
ODE_LIKE = ("churn", "euler")


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    lr: float = hfield(3e-4, "peak learning rate (Flow-GRPO LoRA: 3e-4)")
    weight_decay: float = hfield(1e-4, "AdamW weight decay")
    betas: List[float] = hfield(default_factory=lambda: [0.9, 0.999], help="AdamW betas")
    adam_eps: float = hfield(1e-8, "AdamW epsilon")
    grad_clip: float = hfield(1.0, "max global grad norm (0 = no clipping)")
    schedule: str = hfield("constant", "learning-rate schedule: constant, linear or cosine (after warmup)")
    warmup_steps: int = hfield(0, "linear warmup optimizer steps")

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError("optim.lr must be > 0")
        if self.schedule not in ("constant", "linear", "cosine"):
            raise ValueError("optim.schedule must be constant, linear or cosine")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError("optim.betas must be two numbers in [0, 1)")
        if self.grad_clip < 0 or self.warmup_steps < 0:
            raise ValueError("optim.grad_clip and optim.warmup_steps must be >= 0")


@dataclass
class TrainerConfig:
    """Batching, precision, EMA, checkpoints and logging."""

    prompts_per_step: int = hfield(8, "online: prompts (groups) per iteration, global over processes")
    batch_size: int = hfield(256, "offline: samples per optimizer step, global over processes")
    micro_batch_size: int = hfield(0, "units per forward/backward on one process (0 = whole share); gradient accumulation")
    rollout_batch_size: int = hfield(0, "samples per rollout forward on one process (0 = whole share)")
    mixed_precision: str = hfield("fp32", "autocast precision: fp32 (off), bf16 or fp16")
    ema_decay: float = hfield(0.0, "EMA of trainable weights (0 = off); evaluation and final/ use the EMA")
    checkpoint_every: int = hfield(0, "iterations between checkpoints (0 = only at the end)")
    keep_checkpoints: int = hfield(2, "newest checkpoints kept (older ones are deleted)")
    eval_every: int = hfield(0, "iterations between evaluations during training (0 = before and after only)")
    progress: bool = hfield(True, "show a progress bar with reward and ETA")
    curves: bool = hfield(True, "write curves.png (training reward and evaluation metrics vs iteration) at the end")
    tensorboard: bool = hfield(True, "also log to tensorboard (output_dir/tb)")
    cpu: bool = hfield(False, "force CPU even when a GPU is present")

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1 or self.batch_size < 1:
            raise ValueError("train.prompts_per_step and train.batch_size must be >= 1")
        if self.mixed_precision not in ("fp32", "bf16", "fp16"):
            raise ValueError("train.mixed_precision must be fp32, bf16 or fp16")
        if not 0 <= self.ema_decay < 1:
            raise ValueError("train.ema_decay must be in [0, 1)")
        for k in ("micro_batch_size", "rollout_batch_size", "checkpoint_every", "eval_every"):
            if getattr(self, k) < 0:
                raise ValueError(f"train.{k} must be >= 0")
        if self.keep_checkpoints < 1:
            raise ValueError("train.keep_checkpoints must be >= 1")


@dataclass
class EvalConfig:
    """Fixed evaluation: the same items and seeds before, during and after training."""

    num_items: int = hfield(16, "evaluation items (prompts / scenes) taken from the data source's eval split")
    samples_per_item: int = hfield(4, "samples per evaluation item")
    seed: int = hfield(1234, "evaluation seed (never used in training)")
    deterministic: bool = hfield(True, "evaluate with the sampler's deterministic (ODE) version")
    num_steps: int = hfield(0, "denoising steps at evaluation (0 = chain.num_steps)")
    best_of: int = hfield(1, "closed loop only: plan G chunks per state, score each with the environment's "
                             "score_candidates and execute the best (an oracle that looks into the simulator: it "
                             "measures the headroom in the policy's own samples, it is not a planner); 1 = the policy alone")
    metrics: List[RewardConfig] = hfield(
        default_factory=list, help="extra rewards reported as metrics (the training rewards are always reported)",
        registry=REWARDS, many=True)

    def __post_init__(self) -> None:
        if self.num_items < 1 or self.samples_per_item < 1:
            raise ValueError("eval.num_items and eval.samples_per_item must be >= 1")
        if self.num_steps < 0:
            raise ValueError("eval.num_steps must be >= 0")
        if self.best_of < 1:
            raise ValueError("eval.best_of must be >= 1 (1 = the policy alone)")


@dataclass
class TrainConfig:
    """A whole run. Required top-level keys: seed, output_dir, max_steps, resume."""

    seed: int = hfield(0, "run seed: all training randomness derives from it")
    output_dir: str = hfield("outputs/run", "where config.yaml, metrics.jsonl, checkpoints/, final/ and report.json go")
    max_steps: int = hfield(100, "training iterations (online: rollout + update; offline: optimizer steps)")
    resume: bool = hfield(False, "continue from the newest checkpoint in output_dir")
    overwrite: bool = hfield(False, "allow starting a fresh run in a non-empty output_dir (its old files are replaced)")
    head: Any = hfield(None, "the model to train ({name: ..., ...}; see `flowrl validate --list heads`)", registry=HEADS)
    sampler: SamplerConfig = hfield(default_factory=SamplerConfig, help="rollout sampler")
    chain: ChainConfig = hfield(default_factory=ChainConfig, help="time grid and trainable steps")
    algorithm: Any = hfield(None, "the post-training method ({name: fdfo|flow_grpo|dance_grpo|vg_grpo|flow_matching, ...})",
                            registry=ALGORITHMS)
    rewards: List[RewardConfig] = hfield(default_factory=list, help="rewards with weights (online methods)",
                                         registry=REWARDS, many=True)
    data: Any = hfield(None, "prompt / scene / dataset source ({name: ..., ...})", registry=DATASETS)
    env: Any = hfield(None, "closed-loop environment (two-layer MDP); null for single-chain rollouts",
                      registry=ENVIRONMENTS, optional=True)
    eval: EvalConfig = hfield(default_factory=EvalConfig, help="evaluation before/after training")
    optim: OptimConfig = hfield(default_factory=OptimConfig, help="optimizer and schedule")
    train: TrainerConfig = hfield(default_factory=TrainerConfig, help="trainer settings")

    def __post_init__(self) -> None:
        if self.max_steps < 0:
            raise ConfigError("max_steps: must be >= 0")
        if not self.output_dir:
            raise ConfigError("output_dir: must be a directory path")
        for key in ("head", "algorithm", "data"):
            if getattr(self, key) is None:
                raise ConfigError(f"{key}: missing section; add {key}: {{name: ...}} to the config")
        algo_cls = type(ALGORITHMS.get(self.algorithm.name).builder(self.algorithm))
        if algo_cls.offline:
            return
        if not self.rewards and self.env is None:
            raise ConfigError(f"rewards: {self.algorithm.name} is an online method and needs at least one reward")
        name = self.sampler.name
        if algo_cls.stochastic_sampler is True and (name not in STOCHASTIC or self.sampler.eta == 0):
            raise ConfigError(f"sampler.name: {self.algorithm.name} needs a stochastic sampler with eta > 0; "
                              f"use one of {', '.join(STOCHASTIC)}")
        if algo_cls.stochastic_sampler is False and name not in ODE_LIKE:
            raise ConfigError(f"sampler.name: {self.algorithm.name} needs an ODE-like sampler; use churn or euler")
        if self.rewards and not any(r.weight != 0 for r in self.rewards):
            raise ConfigError("rewards: every reward has weight 0; give at least one a non-zero weight")


def load_config(path: Optional[str], overrides: List[str] = ()) -> TrainConfig:
    """YAML file + dotted overrides -> validated TrainConfig (raises ConfigError)."""
    data: Dict[str, Any] = load_yaml(path) if path else {}
    data = apply_overrides(data, list(overrides))
    missing = [k for k in ("seed", "output_dir", "max_steps", "resume") if k not in data]
    if missing:
        raise ConfigError(f"{missing[0]}: required top-level key missing; every config sets seed, output_dir, max_steps and resume")
    return from_dict(TrainConfig, data)


def config_to_dict(cfg: TrainConfig) -> Dict[str, Any]:
    return to_dict(cfg)


def algorithm_config_cls(name: str) -> type:
    return ALGORITHMS.get(name).config_cls


__all__ = ["TrainConfig", "OptimConfig", "TrainerConfig", "EvalConfig", "load_config", "config_to_dict",
           "AlgorithmConfig"]
