"""flowrl rewards: the Reward protocol, a registry and the reward models."""
from rewards.base import REWARDS, CompositeOutput, CompositeReward, Reward, RewardConfig, build_reward

__all__ = ["REWARDS", "CompositeOutput", "CompositeReward", "Reward", "RewardConfig", "build_reward"]
