"""CLIP score, and the two CLIP encoders (transformers, open_clip) other rewards reuse.

CLIP score (Hessel et al. 2021, "CLIPScore"): ``scale * max(cos(E_image, E_text), 0)``.
The paper uses ``scale = 2.5`` to stretch the typical cosine range; text-to-image work
(torchmetrics' ``CLIPScore``, most diffusion RL papers) reports ``scale = 100``, which is
flowrl's default (``scale`` is a config field).

Two loaders, chosen by ``backend``:

* ``transformers``: ``CLIPModel`` + its processor (``AutoProcessor``) from ``path``, a
  local folder or hub id (default ``openai/clip-vit-large-patch14``).
* ``open_clip``: architecture ``model_name`` (optionally registered from a JSON file
  ``model_config``) with weights ``pretrained``: a checkpoint file, ``ORG/REPO/FILE`` on
  the hub, or an open_clip pretrained tag (default ``ViT-H-14`` / ``laion2b_s32b_b79k``).

Images are preprocessed as tensors with each model's own processor settings (resize of the
shortest edge, centre crop, mean/std normalisation; see ``rewards.images.preprocess``).
Heavy libraries are imported inside the loaders, so ``import rewards`` stays cheap.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from flowrl._fields import hfield
from flowrl.registry import ConfigError
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.images import ImageSpec, check_images, finite_rows, preprocess, prompts_of
from rewards.loading import from_pretrained, offline, resolve_file

Tensor = torch.Tensor

OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
_RESAMPLE = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL resampling codes


# --------------------------------------------------------------------------- helpers
def _pooled(out: Any) -> Tensor:
    """A CLIP ``get_*_features`` result as a tensor (transformers >= 5 returns an output
    object whose ``pooler_output`` holds the projected embedding)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def _interpolation(resample: Any) -> str:
    """A processor's ``resample`` (PIL code, enum or torchvision mode) -> interpolate mode."""
    value = getattr(resample, "value", resample)
    if isinstance(value, str):
        return value.lower() if value.lower() in ("nearest", "bilinear", "bicubic") else "bicubic"
    return _RESAMPLE.get(int(value) if value is not None else 3, "bicubic")


def spec_from_hf_processor(ip: Any) -> ImageSpec:
    """ImageSpec from a transformers CLIP image processor's own settings."""
    size = None
    if getattr(ip, "do_resize", True):
        s = ip.size
        size = _get(s, "shortest_edge") or (int(_get(s, "height")), int(_get(s, "width")))
    crop = None
    if getattr(ip, "do_center_crop", False) and ip.crop_size is not None:
        crop = (int(_get(ip.crop_size, "height")), int(_get(ip.crop_size, "width")))
    mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if getattr(ip, "do_normalize", True):
        mean, std = tuple(float(m) for m in ip.image_mean), tuple(float(s) for s in ip.image_std)
    return ImageSpec(size=int(size) if isinstance(size, int) else size, crop=crop, mean=mean, std=std,
                     interpolation=_interpolation(getattr(ip, "resample", 3)))


def spec_from_open_clip(cfg: Dict[str, Any], key: str) -> ImageSpec:
    """ImageSpec from an open_clip model's preprocess config (size, mean, std, ...)."""
    size = cfg.get("size", 224)
    mode = cfg.get("resize_mode", "shortest")
    mean, std = tuple(cfg.get("mean", OPENAI_MEAN)), tuple(cfg.get("std", OPENAI_STD))
    hw = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    if mode == "shortest":
        target: Any = hw[0] if hw[0] == hw[1] else hw
        return ImageSpec(size=target, crop=hw, mean=mean, std=std, interpolation=cfg.get("interpolation", "bicubic"))
    if mode == "squash":
        return ImageSpec(size=hw, crop=None, mean=mean, std=std, interpolation=cfg.get("interpolation", "bicubic"))
    raise ConfigError(f"{key}: open_clip resize_mode '{mode}' is not supported (use a model with 'shortest' or 'squash')")


def unique_index(items: Sequence[str]) -> Tuple[List[str], Tensor]:
    """(unique items in first-seen order, [B] index of each item into them)."""
    order: Dict[str, int] = {}
    idx = [order.setdefault(s, len(order)) for s in items]
    return list(order), torch.tensor(idx, dtype=torch.long)


def cosine(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise cosine similarity of [B, D] and [B, D] -> [B] (float32)."""
    return (F.normalize(a.float(), dim=-1) * F.normalize(b.float(), dim=-1)).sum(-1)


def _device_dtype(module: torch.nn.Module) -> Tuple[torch.device, torch.dtype]:
    p = next(module.parameters())
    return p.device, p.dtype


# --------------------------------------------------------------------------- encoders
class _ClipEncoder(torch.nn.Module):
    """Shared part of the two encoders: the model, its tokenizer, its image settings."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, spec: ImageSpec):
        super().__init__()
        self.model, self.tokenizer, self.spec = model, tokenizer, spec

    @property
    def logit_scale(self) -> Tensor:
        return self.model.logit_scale

    def pixels(self, images: Tensor) -> Tensor:
        """[B, 3, H, W] in [0, 1] -> the model's normalised input, on its device and dtype."""
        device, dtype = _device_dtype(self.model)
        return preprocess(images.to(device=device, dtype=torch.float32), self.spec).to(dtype)


class HFClip(_ClipEncoder):
    """transformers CLIPModel with its tokenizer and image settings.

    image_features: [B, 3, H, W] in [0, 1] -> [B, D]; text_features: B prompts -> [B, D]
    (projected, not normalised).
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, spec: ImageSpec, max_length: int = 77):
        super().__init__(model, tokenizer, spec)
        self.max_length = max_length

    def image_features(self, images: Tensor) -> Tensor:
        return _pooled(self.model.get_image_features(pixel_values=self.pixels(images)))

    def text_features(self, prompts: Sequence[str]) -> Tensor:
        device, _ = _device_dtype(self.model)
        tok = self.tokenizer(list(prompts), padding="max_length", max_length=self.max_length,
                             truncation=True, return_tensors="pt")
        return _pooled(self.model.get_text_features(input_ids=tok["input_ids"].to(device),
                                                    attention_mask=tok["attention_mask"].to(device)))


class OpenClip(_ClipEncoder):
    """open_clip CLIP model with its tokenizer and image settings (same interface as HFClip)."""

    def image_features(self, images: Tensor) -> Tensor:
        return self.model.encode_image(self.pixels(images))

    def text_features(self, prompts: Sequence[str]) -> Tensor:
        device, _ = _device_dtype(self.model)
        return self.model.encode_text(self.tokenizer(list(prompts)).to(device))


def load_hf_clip(path: str, processor_path: str, key: str, source: str) -> HFClip:
    """CLIPModel from ``path`` and its processor from ``processor_path`` (default: path).

    key: config key prefix for errors (``pickscore``); source: where users get the weights.
    """
    from transformers import AutoProcessor, CLIPModel

    model = from_pretrained(CLIPModel.from_pretrained, path, f"{key}.path", "CLIP model (config.json + weights)", source)
    proc_ref = processor_path or path
    pkey = f"{key}.processor_path" if processor_path else f"{key}.path"
    processor = from_pretrained(AutoProcessor.from_pretrained, proc_ref, pkey,
                                "CLIP processor (tokenizer + preprocessor_config.json)", source)
    tokenizer = getattr(processor, "tokenizer", None)
    image_processor = getattr(processor, "image_processor", None)
    if tokenizer is None or image_processor is None:
        raise ConfigError(f"{pkey}: {proc_ref} holds no CLIP processor (tokenizer + image processor)")
    max_len = int(getattr(model.config.text_config, "max_position_embeddings", 77))
    return HFClip(model, tokenizer, spec_from_hf_processor(image_processor), max_length=min(max_len, 77))


def _open_clip_tag(open_clip: Any, model_name: str, tag: str) -> Dict[str, Any]:
    try:
        return open_clip.get_pretrained_cfg(model_name, tag) or {}
    except Exception:
        return {}


def load_open_clip(model_name: str, pretrained: Optional[str], model_config: str, key: str, source: str) -> OpenClip:
    """open_clip model ``model_name`` with weights ``pretrained`` (file, ORG/REPO/FILE or tag).

    model_config: optional architecture JSON registered first (its file stem is its name).
    pretrained None: random weights (the caller loads its own checkpoint, e.g. HPSv2).
    """
    import open_clip

    if model_config:
        if not os.path.isfile(model_config):
            raise FileNotFoundError(f"{key}.model_config: open_clip architecture JSON not found at {model_config}")
        open_clip.add_model_config(model_config)
    if model_name not in open_clip.list_models():
        raise ConfigError(f"{key}.model_name: unknown open_clip architecture '{model_name}'; "
                          f"use a name from open_clip.list_models() or register one with model_config")
    kwargs: Dict[str, Any] = {}
    path = None
    if pretrained:
        tag = _open_clip_tag(open_clip, model_name, pretrained)
        if tag and not os.path.isfile(pretrained):
            path = _download_open_clip_tag(open_clip, tag, model_name, pretrained, key, source)
            pre = {k: tag[k] for k in ("mean", "std", "interpolation", "resize_mode") if k in tag}
            kwargs = {"force_preprocess_cfg": pre, "force_quick_gelu": bool(tag.get("quick_gelu", False))}
        else:
            path = resolve_file(pretrained, f"{key}.pretrained", "open_clip checkpoint", source)
    try:
        model = open_clip.create_model(model_name, pretrained=path, device="cpu", **kwargs)
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{key}.pretrained: {path} does not load into open_clip '{model_name}' ({first})") from None
    tokenizer = open_clip.get_tokenizer(model_name)
    spec = spec_from_open_clip(open_clip.get_model_preprocess_cfg(model), key)
    return OpenClip(model, tokenizer, spec)


def _download_open_clip_tag(open_clip: Any, tag: Dict[str, Any], model_name: str, name: str, key: str,
                            source: str) -> str:
    """Local file of an open_clip pretrained tag, fetched with ``hf_hub_download``
    (``local_files_only`` when offline); URL-only tags are refused offline."""
    hub = str(tag.get("hf_hub", ""))
    if not hub:
        if offline():
            raise FileNotFoundError(f"{key}.pretrained: open_clip tag '{name}' of {model_name} downloads from a URL "
                                    f"and HF_HUB_OFFLINE=1; {source}")
        return open_clip.download_pretrained(tag)
    from huggingface_hub import hf_hub_download

    repo, filename = os.path.split(hub)
    candidates = [filename] if filename else ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    error = ""
    for fname in candidates:
        try:
            return hf_hub_download(repo, fname, local_files_only=offline())
        except Exception as e:  # not cached / not on the hub: try the next name
            lines = str(e).strip().splitlines()
            error = lines[0] if lines else type(e).__name__
    how = "it is not in the local Hugging Face cache and HF_HUB_OFFLINE=1" if offline() else error
    raise FileNotFoundError(f"{key}.pretrained: weights of open_clip tag '{name}' ({model_name}, hub repo {repo}) "
                            f"not found: {how}; {source}")


# --------------------------------------------------------------------------- reward
@dataclass
class ClipScoreConfig(RewardConfig):
    name: str = hfield("clip", "reward name")
    backend: str = hfield("transformers", "CLIP loader: transformers (CLIPModel + processor) or open_clip")
    path: str = hfield("openai/clip-vit-large-patch14",
                       "transformers backend: CLIPModel folder or hub id (its processor is loaded from the same place)")
    processor_path: str = hfield("", "transformers backend: processor folder or hub id when it differs from path")
    model_name: str = hfield("ViT-H-14", "open_clip backend: architecture name (open_clip.list_models())")
    pretrained: str = hfield("laion2b_s32b_b79k",
                             "open_clip backend: checkpoint file, ORG/REPO/FILE on the hub, or an open_clip pretrained tag")
    model_config: str = hfield("", "open_clip backend: optional architecture JSON to register (file stem = model_name)")
    scale: float = hfield(100.0, "score = scale * max(cos, 0); 100 as in torchmetrics/T2I papers (CLIPScore paper: 2.5)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend not in ("transformers", "open_clip"):
            raise ConfigError(f"{self.name}.backend: '{self.backend}' is not one of transformers, open_clip")


CLIP_SOURCE = ("pass a local folder/file or a hub id (e.g. openai/clip-vit-large-patch14; "
               "open_clip weights: laion/CLIP-ViT-H-14-laion2B-s32B-b79K on the Hugging Face hub)")


def load_clip_encoder(c: ClipScoreConfig) -> torch.nn.Module:
    """The encoder ``c.backend`` selects (HFClip or OpenClip)."""
    if c.backend == "transformers":
        return load_hf_clip(c.path, c.processor_path, c.name, CLIP_SOURCE)
    return load_open_clip(c.model_name, c.pretrained, c.model_config, c.name, CLIP_SOURCE)


def paired_cosine(encoder: torch.nn.Module, images: Tensor, prompts: Sequence[str]) -> Tensor:
    """[B] cosine of each image with its own prompt (each distinct prompt encoded once)."""
    uniq, idx = unique_index(prompts)
    img = encoder.image_features(images)
    txt = encoder.text_features(uniq)
    return cosine(img, txt[idx.to(txt.device)]).cpu()


class ClipScore(Reward):
    """CLIP score: scale * max(cos(image, prompt), 0) -> [B]."""

    def __init__(self, config: ClipScoreConfig):
        super().__init__(config)
        self.encoder = self.place(load_clip_encoder(config))

    def score(self, outputs: Tensor, batch: Sequence[Any]) -> RewardOutput:
        images, prompts = check_images(outputs), prompts_of(batch)
        cos = paired_cosine(self.encoder, images, prompts)
        return RewardOutput(self.config.scale * cos.clamp(min=0), finite_rows(outputs).cpu())


REWARDS.register("clip", ClipScoreConfig, help="CLIP score: scale * max(cos(image, prompt), 0) (transformers or open_clip)")(ClipScore)
