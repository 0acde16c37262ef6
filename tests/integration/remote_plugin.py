"""Test-only image rewards for the remote-reward tests, loaded by `rewards serve --import`.

``test_brightness``: score [B] = 100 * mean pixel + number of words of the prompt (so the
batch items travel too). ``test_slow``: the same after sleeping ``delay_s`` seconds.
"""
import time
from dataclasses import dataclass

import torch

from flowrl._fields import hfield
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.images import check_images, prompts_of


@dataclass
class BrightnessConfig(RewardConfig):
    name: str = hfield("test_brightness", "reward name")
    delay_s: float = hfield(0.0, "seconds to sleep before scoring")


class Brightness(Reward):
    def score(self, outputs, batch):
        time.sleep(self.config.delay_s)
        words = torch.tensor([len(p.split()) for p in prompts_of(batch)], dtype=torch.float32)
        s = 100.0 * check_images(outputs).mean(dim=(1, 2, 3)) + words
        return RewardOutput(s, torch.ones_like(s, dtype=torch.bool), {"mean_words": float(words.mean())})


@dataclass
class SlowConfig(BrightnessConfig):
    name: str = hfield("test_slow", "reward name")
    delay_s: float = hfield(2.0, "seconds to sleep before scoring")


for _name, _cfg in (("test_brightness", BrightnessConfig), ("test_slow", SlowConfig)):
    if _name not in REWARDS:
        REWARDS.register(_name, _cfg, help="test-only image reward (tests/integration/remote_plugin.py)")(Brightness)
