"""flowrl rewards: the Reward protocol, a registry and the reward models.

Importing the package registers every reward model; heavy libraries (transformers,
open_clip) are imported only when a model is built, so ``import rewards`` stays cheap.
"""
from rewards.base import (REWARDS, CompositeOutput, CompositeReward, Reward, RewardConfig, RewardFailure,
                          build_reward)
# every reward model registers its names in REWARDS on import (heavy libraries load lazily)
from rewards import aesthetic, clip, hps, jpeg, pickscore, remote, shapes, vlm  # noqa: E402,F401

__all__ = ["REWARDS", "CompositeOutput", "CompositeReward", "Reward", "RewardConfig", "RewardFailure",
           "build_reward"]
