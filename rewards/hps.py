"""HPS v2 (Wu et al. 2023, "Human Preference Score v2").

An open_clip ``ViT-H-14`` fine-tuned on human preferences; the published checkpoint
(``HPS_v2_compressed.pt``, or ``HPS_v2.1_compressed.pt`` for v2.1 - same format) is a
``{"state_dict": ...}`` file for that architecture. score = cos(E_image, E_text), the raw
cosine HPS v2 reports (about 0.2-0.35 for typical samples).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from flowrl._fields import hfield
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.clip import load_open_clip, paired_cosine
from rewards.images import check_images, finite_rows, prompts_of
from rewards.loading import load_into, load_state_dict, resolve_file

SOURCE = "download it from the HPSv2 release (xswu/HPSv2 on the Hugging Face hub) and pass its path"


@dataclass
class HPSv2Config(RewardConfig):
    name: str = hfield("hpsv2", "reward name")
    checkpoint: str = hfield("xswu/HPSv2/HPS_v2_compressed.pt",
                             "HPS checkpoint: local file or ORG/REPO/FILE on the hub (v2.1: HPS_v2.1_compressed.pt)")
    model_name: str = hfield("ViT-H-14", "open_clip architecture the checkpoint belongs to")
    model_config: str = hfield("", "optional open_clip architecture JSON to register (file stem = model_name)")


def load_hps(c: HPSv2Config) -> torch.nn.Module:
    """open_clip ``c.model_name`` with the HPS checkpoint's weights (strict)."""
    name = c.checkpoint.replace("\\", "/").rsplit("/", 1)[-1] or "HPS_v2_compressed.pt"
    path = resolve_file(c.checkpoint, f"{c.name}.checkpoint", name, SOURCE)
    encoder = load_open_clip(c.model_name, None, c.model_config, c.name, SOURCE)
    load_into(encoder.model, load_state_dict(path, f"{c.name}.checkpoint"), f"{c.name}.checkpoint", path)
    return encoder


class HPSv2(Reward):
    """HPS v2: cos(image, prompt) of the preference-tuned open_clip ViT-H-14 -> [B]."""

    def __init__(self, config: HPSv2Config):
        super().__init__(config)
        self.encoder = self.place(load_hps(config))

    def score(self, outputs: torch.Tensor, batch: Sequence[Any]) -> RewardOutput:
        images, prompts = check_images(outputs), prompts_of(batch)
        return RewardOutput(paired_cosine(self.encoder, images, prompts), finite_rows(outputs).cpu())


REWARDS.register("hpsv2", HPSv2Config, help="HPS v2 human preference score: cos(image, prompt) (open_clip ViT-H-14)")(HPSv2)
