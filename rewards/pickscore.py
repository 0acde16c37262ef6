"""PickScore (Kirstain et al. 2023, "Pick-a-Pic"): a CLIP-H fine-tuned on human preferences.

score = logit_scale.exp() * cos(E_image, E_text), the paper's scoring (about 18-23 for
typical text-to-image samples). The model is a transformers ``CLIPModel`` (ViT-H/14
architecture) published as ``yuvalkirstain/PickScore_v1``; its processor is the one of the
CLIP it was fine-tuned from, ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from flowrl._fields import hfield
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.clip import load_hf_clip, paired_cosine
from rewards.images import check_images, finite_rows, prompts_of

SOURCE = ("get the model from yuvalkirstain/PickScore_v1 and the processor from "
          "laion/CLIP-ViT-H-14-laion2B-s32B-b79K on the Hugging Face hub, or pass local folders")


@dataclass
class PickScoreConfig(RewardConfig):
    name: str = hfield("pickscore", "reward name")
    path: str = hfield("yuvalkirstain/PickScore_v1", "PickScore CLIPModel: local folder or hub id")
    processor_path: str = hfield("laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
                                 "processor (tokenizer + image settings): local folder or hub id")


class PickScore(Reward):
    """PickScore: logit_scale.exp() * cos(image, prompt) -> [B]."""

    def __init__(self, config: PickScoreConfig):
        super().__init__(config)
        self.encoder = self.place(load_hf_clip(config.path, config.processor_path, config.name, SOURCE))

    def score(self, outputs: torch.Tensor, batch: Sequence[Any]) -> RewardOutput:
        images, prompts = check_images(outputs), prompts_of(batch)
        cos = paired_cosine(self.encoder, images, prompts)
        scale = self.encoder.logit_scale.detach().float().exp().cpu()
        return RewardOutput(scale * cos, finite_rows(outputs).cpu())


REWARDS.register("pickscore", PickScoreConfig, help="PickScore: logit_scale.exp() * cos(image, prompt) (CLIP-H)")(PickScore)
