"""Driving: procedural closed-loop world, IDM/MOBIL expert, demonstrations and the
multi-agent control-chunk denoiser (SCORP-style). See ``planners/driving/scenes.py``
for the tensor layout shared with public motion datasets.

Importing the package registers with flowrl: head ``driving_planner``, environment
``driving``, data sources ``driving_scenes`` (closed loop) and ``driving_demos`` (offline).
"""
from flowrl.registry import DATASETS, ENVIRONMENTS, HEADS
from planners.driving.head import DrivingHead, DrivingHeadConfig
from planners.driving.sim import DrivingEnv, DrivingEnvConfig
from planners.driving.sources import DrivingDemos, DrivingDemosConfig, DrivingScenes, DrivingScenesConfig

HEADS.register("driving_planner", DrivingHeadConfig, help="multi-agent diffusion planner over control chunks (SCORP)")(
    DrivingHead)
ENVIRONMENTS.register("driving", DrivingEnvConfig, help="batched closed-loop driving simulator (highway, intersection, "
                                                        "roundabout)")(DrivingEnv)
DATASETS.register("driving_scenes", DrivingScenesConfig, help="scene seeds: closed-loop training / held-out evaluation")(
    DrivingScenes)
DATASETS.register("driving_demos", DrivingDemosConfig, help="expert driving demonstrations (offline pretraining)")(
    DrivingDemos)

__all__ = ["DrivingHead", "DrivingHeadConfig", "DrivingEnv", "DrivingEnvConfig", "DrivingScenes", "DrivingDemos"]
