"""Conventions shared by image rewards.

Images reach rewards as a float tensor [B, 3, H, W] with values in [0, 1] (what the
text-to-image head's ``decode`` returns). Batch items are prompt strings or dicts with a
``"prompt"`` key and any per-prompt metadata (from a JSONL prompt file).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

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
    """[B, 3, H, W] in [0, 1] -> list of RGB PIL images (rounded to uint8; NaN -> 0)."""
    x = torch.nan_to_num(check_images(images), nan=0.0)  # non-finite pixels -> black, never garbage
    arr = (x.permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype(np.uint8)
    return [Image.fromarray(a) for a in arr]


def from_pil(images: Sequence[Image.Image]) -> torch.Tensor:
    """List of PIL images (same size) -> [B, 3, H, W] float in [0, 1]."""
    arr = np.stack([np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0 for im in images])
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()


def finite_rows(x: torch.Tensor) -> torch.Tensor:
    """[B, ...] -> [B] bool: True where every value of the sample is finite."""
    return torch.isfinite(x.reshape(x.shape[0], -1)).all(dim=1)


@dataclass(frozen=True)
class ImageSpec:
    """How a vision model wants its pixels (read from its own processor / transform).

    size:          resize target; an int resizes the shortest edge to it (aspect kept),
                   a (h, w) pair resizes to exactly that; None skips resizing.
    crop:          (h, w) centre crop after resizing; None skips cropping.
    mean, std:     per-channel normalisation applied to [0, 1] pixels.
    interpolation: "bicubic", "bilinear" or "nearest".
    """

    size: Optional[Union[int, Tuple[int, int]]]
    crop: Optional[Tuple[int, int]]
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]
    interpolation: str = "bicubic"


def _resize_shape(h: int, w: int, size: Union[int, Tuple[int, int]]) -> Tuple[int, int]:
    """Output (h, w) of a resize: shortest edge -> ``size`` (int), or exactly ``size``."""
    if not isinstance(size, int):
        return int(size[0]), int(size[1])
    short, long = (h, w) if h <= w else (w, h)
    new_long = int(size * long / short)
    return (size, new_long) if h <= w else (new_long, size)


def center_crop(images: torch.Tensor, crop: Tuple[int, int]) -> torch.Tensor:
    """[B, C, H, W] -> [B, C, ch, cw] centre crop (zero-padded when the image is smaller)."""
    ch, cw = crop
    h, w = images.shape[-2:]
    if h < ch or w < cw:
        ph, pw = max(ch - h, 0), max(cw - w, 0)
        images = torch.nn.functional.pad(images, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        h, w = images.shape[-2:]
    top, left = int(round((h - ch) / 2.0)), int(round((w - cw) / 2.0))
    return images[..., top:top + ch, left:left + cw]


def preprocess(images: torch.Tensor, spec: ImageSpec) -> torch.Tensor:
    """[B, 3, H, W] in [0, 1] -> [B, 3, h, w] model input: resize, centre crop, normalise.

    The tensor version of a CLIP processor: antialiased resize (close to PIL's), pixel
    values clamped back to [0, 1] after resizing (PIL clips too), then (x - mean) / std.
    Runs on the images' device and keeps their dtype.
    """
    x = images
    if spec.size is not None:
        hw = _resize_shape(int(x.shape[-2]), int(x.shape[-1]), spec.size)
        if hw != tuple(x.shape[-2:]):
            mode = spec.interpolation
            aa = mode in ("bilinear", "bicubic")
            x = torch.nn.functional.interpolate(x, size=hw, mode=mode, antialias=aa,
                                                **({} if mode == "nearest" else {"align_corners": False}))
            x = x.clamp(0, 1)
    if spec.crop is not None:
        x = center_crop(x, spec.crop)
    mean = torch.tensor(spec.mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(spec.std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - mean) / std
