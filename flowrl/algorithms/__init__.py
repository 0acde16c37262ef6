"""Algorithms: one file each (Config dataclass + pure functions); importing registers them."""
from flowrl.algorithms import fdfo, flow_matching, grpo, ptr, vggrpo  # noqa: F401  (registration)
from flowrl.algorithms.base import Algorithm, AlgorithmConfig, Policy

__all__ = ["Algorithm", "AlgorithmConfig", "Policy"]
