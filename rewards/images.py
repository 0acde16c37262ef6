"""Conventions shared by image rewards.

Images reach rewards as a float tensor [B, 3, H, W] with values in [0, 1] (what the
text-to-image head's ``decode`` returns). Batch items are prompt strings or dicts with a
``"prompt"`` key and any per-prompt metadata (from a JSONL prompt file).
"""
from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np
import torch
from PIL import Image


def prompts_of(batch: Sequence[Any]) -> List[str]:
    """The prompt of every item: a string item, or item["prompt"] for dict items."""
    out = []
    for item in batch:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and "prompt" in item:
            out.append(str(item["prompt"]))
        else:
            raise ValueError(f"batch item {item!r} has no prompt; pass strings or dicts with a 'prompt' key")
    return out


def check_images(images: torch.Tensor) -> torch.Tensor:
    """Validate [B, 3, H, W] float images in [0, 1]; returns them as float32 (clamped)."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [B, 3, H, W], got {getattr(images, 'shape', type(images))}")
    return images.float().clamp(0, 1)


def to_pil(images: torch.Tensor) -> List[Image.Image]:
    """[B, 3, H, W] in [0, 1] -> list of RGB PIL images (rounded to uint8)."""
    arr = (check_images(images).permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)
    return [Image.fromarray(a) for a in arr]


def from_pil(images: Sequence[Image.Image]) -> torch.Tensor:
    """List of PIL images (same size) -> [B, 3, H, W] float in [0, 1]."""
    arr = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()
