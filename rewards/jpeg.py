"""DDPO's JPEG rewards (Black et al. 2023): the size of the image encoded as JPEG.

jpeg_compressibility = -size_kb, jpeg_incompressibility = +size_kb, where size_kb is the
number of bytes / 1000 of the image saved by PIL as JPEG at quality 95. No model, no
weights; the prompt is not used.
"""
from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, List, Sequence

import torch
from PIL import Image

from flowrl._fields import hfield
from flowrl.registry import ConfigError
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.images import finite_rows, to_pil


def jpeg_size_kb(image: Image.Image, quality: int = 95) -> float:
    """Size in kB (bytes / 1000) of ``image`` encoded as JPEG at ``quality``."""
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.tell() / 1000.0


def jpeg_sizes_kb(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> [B] JPEG sizes in kB."""
    sizes: List[float] = [jpeg_size_kb(im, quality) for im in to_pil(images.detach())]
    return torch.tensor(sizes, dtype=torch.float32)


@dataclass
class JpegCompressibilityConfig(RewardConfig):
    name: str = hfield("jpeg_compressibility", "reward name")
    quality: int = hfield(95, "JPEG quality the size is measured at (DDPO: 95)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"{self.name}.quality: must be in 1..100, got {self.quality}")


@dataclass
class JpegIncompressibilityConfig(JpegCompressibilityConfig):
    name: str = hfield("jpeg_incompressibility", "reward name")


class JpegSize(Reward):
    """sign * JPEG size in kB -> [B]; sign -1 rewards compressible images, +1 incompressible."""

    def __init__(self, config: JpegCompressibilityConfig, sign: float):
        super().__init__(config)
        self.sign = sign

    def score(self, outputs: torch.Tensor, batch: Sequence[Any]) -> RewardOutput:
        return RewardOutput(self.sign * jpeg_sizes_kb(outputs, self.config.quality), finite_rows(outputs).cpu())


REWARDS.register("jpeg_compressibility", JpegCompressibilityConfig,
                 help="DDPO: -(JPEG size in kB) at quality 95")(lambda c: JpegSize(c, -1.0))
REWARDS.register("jpeg_incompressibility", JpegIncompressibilityConfig,
                 help="DDPO: +(JPEG size in kB) at quality 95")(lambda c: JpegSize(c, +1.0))
