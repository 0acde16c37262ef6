"""LAION aesthetic predictor v2 ("improved aesthetic predictor", Schuhmann 2022).

The L2-normalised CLIP ViT-L/14 image embedding (768-d) goes through an MLP head
1024 -> 128 -> 64 -> 16 -> 1 (dropout 0.2, 0.2, 0.1 after the first three layers, no
activations) trained to predict mean human aesthetic ratings on a 1-10 scale. The
published head ``sac+logos+ava1-l14-linearMSE.pth`` is a state dict with keys
``layers.{0,2,4,6,7}.{weight,bias}``. The prompt is not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from flowrl._fields import hfield
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.clip import load_hf_clip
from rewards.images import check_images, finite_rows
from rewards.loading import load_into, load_state_dict, resolve_file

HEAD_SOURCE = ("download sac+logos+ava1-l14-linearMSE.pth from github.com/christophschuhmann/"
               "improved-aesthetic-predictor and pass its path")
CLIP_SOURCE = "pass a local folder or the hub id openai/clip-vit-large-patch14"


class AestheticHead(nn.Module):
    """The published MLP head: [B, D] normalised CLIP embedding -> [B] rating."""

    def __init__(self, in_dim: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_dim, 1024), nn.Dropout(0.2),
            nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.layers(emb).squeeze(-1)


@dataclass
class AestheticConfig(RewardConfig):
    name: str = hfield("aesthetic", "reward name")
    clip_path: str = hfield("openai/clip-vit-large-patch14", "CLIP ViT-L/14 (transformers CLIPModel): local folder or hub id")
    head_path: str = hfield("sac+logos+ava1-l14-linearMSE.pth",
                            "aesthetic MLP head state dict: local file or ORG/REPO/FILE on the hub")


class Aesthetic(Reward):
    """LAION aesthetic score (about 1-10) of each image -> [B]."""

    def __init__(self, config: AestheticConfig):
        super().__init__(config)
        c = config
        fname = c.head_path.replace("\\", "/").rsplit("/", 1)[-1] or "sac+logos+ava1-l14-linearMSE.pth"
        head_file = resolve_file(c.head_path, f"{c.name}.head_path", fname, HEAD_SOURCE)
        encoder = load_hf_clip(c.clip_path, "", c.name, CLIP_SOURCE)
        head = AestheticHead(int(encoder.model.config.projection_dim))
        load_into(head, load_state_dict(head_file, f"{c.name}.head_path"), f"{c.name}.head_path", head_file)
        self.encoder, self.head = self.place(encoder), self.place(head)

    def score(self, outputs: torch.Tensor, batch: Sequence[Any]) -> RewardOutput:
        emb = F.normalize(self.encoder.image_features(check_images(outputs)).float(), dim=-1)
        p = next(self.head.parameters())
        return RewardOutput(self.head(emb.to(p.dtype)).float().cpu(), finite_rows(outputs).cpu())


REWARDS.register("aesthetic", AestheticConfig, help="LAION aesthetic predictor v2 (CLIP ViT-L/14 + MLP head)")(Aesthetic)
