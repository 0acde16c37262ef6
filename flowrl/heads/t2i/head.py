"""The text-to-image head: one diffusers pipeline behind flowrl's Head contract.

Shared here: loading with the pipeline's own ``from_pretrained`` (offline-aware), frozen
VAE and text encoders in eval mode (or, ``train_text_encoder``, a trained one whose prompts
are embedded on every call), LoRA through peft (or full fine-tuning), the
reference policy as the same weights with the adapter disabled, prompt-embedding cache,
classifier-free guidance identical at rollout and training time, VAE decoding, saving
LoRA weights with the family's ``save_lora_weights`` and image grids.

Each model family (``sd3.py``, ``flux.py``, ``sd.py``) implements a few hooks: how to
encode prompts, the latent shape, one denoiser call in flowrl's time convention, the
time grid of its scheduler, and decoding. Families are picked by ``head.family``.

State x: the family's latents as float32 ([B, C, h, w], or packed [B, N, D] for FLUX).
Outputs of ``decode``: float32 images [B, 3, H, W] in [0, 1] on the CPU.
"""
from __future__ import annotations

import json
import logging
import os
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
from torch import nn

from flowrl._fields import hfield
from flowrl.heads.base import Head
from flowrl.registry import ConfigError
from flowrl.samplers.guidance import guided_velocity
from rewards.images import prompts_of

Tensor = torch.Tensor
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class T2IHeadConfig:
    """A diffusers text-to-image pipeline as a flowrl head (defaults: FDFO/Flow-GRPO LoRA recipe)."""

    name: str = hfield("t2i", "head name")
    family: str = hfield("sd3", "model family: sd3 (SD3/SD3.5), flux (FLUX.1) or sd (SD1.5-style UNet)")
    path: str = hfield("", "hub id or local folder of the diffusers pipeline")
    dtype: str = hfield("float32", "weights dtype: float32, bfloat16 or float16")
    resolution: int = hfield(512, "image height and width in pixels")
    guidance_scale: float = hfield(4.5, "CFG scale used at rollout AND training (sd3/sd; 1 = no CFG); FLUX: guidance embedding value")
    negative_prompt: str = hfield("", "negative prompt for CFG")
    max_sequence_length: int = hfield(256, "T5 tokens per prompt (sd3, flux)")
    lora_rank: int = hfield(32, "LoRA rank r (0 = full fine-tuning of the denoiser)")
    lora_alpha: float = hfield(64.0, "LoRA alpha (FDFO / Flow-GRPO: 64 with r = 32)")
    lora_targets: List[str] = hfield(default_factory=list, help="LoRA target module names (empty = the family's attention projections)")
    train_text_encoder: bool = hfield(False, "also train the text encoder (sd family): a LoRA of the same rank on its "
                                      "attention projections, or all its weights when lora_rank = 0")
    freeze_modules: List[str] = hfield(default_factory=list, help="denoiser submodules kept frozen under full fine-tuning "
                                       "(lora_rank = 0), by dotted name, e.g. [conv_in, time_embedding, down_blocks, "
                                       "mid_block]: no gradients for their weights, and no backward pass through them "
                                       "when nothing before them trains (that list, on the shapes demo: updates in "
                                       "0.77x the time, iterations 0.87x)")
    export_lora_rank: int = hfield(0, "full fine-tuning (lora_rank = 0): also save the denoiser's change as a rank-r "
                                   "LoRA in final/lora, which the family's load_lora_weights reads (truncated SVD of "
                                   "each Linear and Conv2d weight's change; bias and norm changes are left out); 0 = off; "
                                   "a LoRA run (lora_rank > 0) saves its own LoRA in final/ and ignores it")
    gradient_checkpointing: bool = hfield(False, "recompute activations in the backward pass (less memory, ~30% slower)")
    channels_last: bool = hfield(False, "keep the denoiser's weights in channels-last (NHWC) memory: faster convolutions "
                                        "for UNets (sd family; 0.82x per iteration of the shapes demo on a 2-core CPU); "
                                        "results equal up to float rounding; saved weights keep the usual layout")
    decode_batch_size: int = hfield(8, "images decoded by the VAE at once")
    prompt_cache_size: int = hfield(4096, "prompt embeddings kept in memory (oldest evicted)")

    def __post_init__(self) -> None:
        from flowrl.heads.t2i import FAMILIES, family_class

        if self.family not in FAMILIES:
            raise ValueError(f"head.family must be one of {sorted(FAMILIES)}")
        if not self.path:
            raise ValueError("head.path: set the pipeline's hub id or local folder")
        if self.dtype not in DTYPES:
            raise ValueError(f"head.dtype must be one of {sorted(DTYPES)}")
        if self.resolution < 8 or self.resolution % 8:
            raise ValueError("head.resolution must be a positive multiple of 8")
        if self.lora_rank < 0 or self.lora_alpha <= 0:
            raise ValueError("head.lora_rank must be >= 0 and head.lora_alpha > 0")
        if self.train_text_encoder and not family_class(self.family).text_encoder_targets:
            raise ValueError(f"head.train_text_encoder: the {self.family} family cannot train its text encoder (sd can)")
        if self.freeze_modules and self.lora_rank > 0:
            raise ValueError("head.freeze_modules applies to full fine-tuning (head.lora_rank = 0); "
                             "a LoRA picks its modules with head.lora_targets")
        if self.export_lora_rank < 0:
            raise ValueError("head.export_lora_rank must be >= 0 (0 = no exported LoRA)")
        if self.export_lora_rank and self.lora_rank == 0 and self.train_text_encoder:
            raise ValueError("head.export_lora_rank exports the denoiser's change only, not the fully trained text "
                             "encoder's: set head.export_lora_rank=0 or head.train_text_encoder=false")
        if self.guidance_scale < 0 or self.decode_batch_size < 1 or self.prompt_cache_size < 1:
            raise ValueError("head.guidance_scale must be >= 0; head.decode_batch_size and head.prompt_cache_size >= 1")


def freeze_submodules(model: nn.Module, prefixes: Sequence[str]) -> None:
    """Turn off the gradients of every parameter under one of the submodules named by ``prefixes``."""
    names = {n for n, _ in model.named_modules() if n}
    for prefix in prefixes:
        if prefix not in names:
            top = sorted({n.split(".")[0] for n in names})
            raise ConfigError(f"head.freeze_modules: the denoiser has no submodule {prefix!r} "
                              f"(its top-level ones: {', '.join(top)})")
    for name, p in model.named_parameters():
        if any(name.startswith(f + ".") for f in prefixes):
            p.requires_grad_(False)


def lora_metadata(config) -> Dict[str, Any]:
    """A peft ``LoraConfig`` as the adapter metadata ``save_lora_weights`` stores (target modules sorted)."""
    meta = config.to_dict()
    meta["target_modules"] = sorted(meta["target_modules"])
    return meta


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


class T2IHead(Head):
    """Base class; a family subclass sets the class attributes and implements the hooks."""

    pipeline_class: str = ""          # diffusers class name
    denoiser_name: str = "transformer"  # pipeline attribute of the trained network
    default_targets: Sequence[str] = ("to_q", "to_k", "to_v", "to_out.0")
    uses_cfg: bool = True             # False: guidance goes into the model (FLUX)
    text_encoder_targets: Sequence[str] = ()  # LoRA targets in the text encoder; empty: the family cannot train it

    def __init__(self, config: T2IHeadConfig):
        super().__init__()
        self.config = config
        self.dtype = DTYPES[config.dtype]
        self.pipe = self._load_pipeline()
        quiet_repeated_truncation(type(self.pipe).__module__)
        self.denoiser = getattr(self.pipe, self.denoiser_name)
        trained = {self.denoiser_name, "text_encoder"} if config.train_text_encoder else {self.denoiser_name}
        frozen = {k: v for k, v in self.pipe.components.items() if isinstance(v, nn.Module) and k not in trained}
        self.frozen = nn.ModuleDict(frozen)
        self.frozen.requires_grad_(False)
        self.text_encoder = self.pipe.text_encoder if config.train_text_encoder else None
        self.lora_config = self.text_lora_config = None
        if config.lora_rank > 0:
            from peft import LoraConfig, inject_adapter_in_model

            self.denoiser.requires_grad_(False)
            self.lora_config = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                                          target_modules=list(config.lora_targets or self.default_targets),
                                          init_lora_weights=True)
            try:
                self.denoiser.add_adapter(self.lora_config)
            except ValueError as e:
                raise ConfigError(f"head.lora_targets: {str(e).splitlines()[0]}") from None
            if self.text_encoder is not None:
                self.text_encoder.requires_grad_(False)
                self.text_lora_config = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                                                   target_modules=list(self.text_encoder_targets), init_lora_weights=True)
                inject_adapter_in_model(self.text_lora_config, self.text_encoder)
            for p in self.parameters():  # train adapters in float32 even on bf16 weights
                if p.requires_grad:
                    p.data = p.data.float()
        else:
            self.denoiser.requires_grad_(True)
            freeze_submodules(self.denoiser, config.freeze_modules)
            if self.text_encoder is not None:
                self.text_encoder.requires_grad_(True)
        if config.gradient_checkpointing:
            self.denoiser.enable_gradient_checkpointing()
        if config.channels_last:  # in place: the parameters (and any optimizer holding them) stay the same objects
            self.denoiser.to(memory_format=torch.channels_last)
        self._cache: "OrderedDict[Optional[str], Dict[str, Tensor]]" = OrderedDict()
        self.eval()

    # ------------------------------------------------------------------ loading
    def _load_pipeline(self):
        import diffusers

        c = self.config
        if not os.path.isdir(c.path) and c.path.startswith((".", "/", "~")):
            raise FileNotFoundError(f"head.path: folder {c.path} not found; pass a diffusers pipeline folder or a hub id")
        cls = getattr(diffusers, self.pipeline_class)
        try:
            with warnings.catch_warnings():  # newer diffusers renamed torch_dtype; both load the same
                warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
                pipe = cls.from_pretrained(c.path, torch_dtype=self.dtype, local_files_only=hub_offline(),
                                           **self.load_kwargs())
        except (OSError, ValueError) as e:
            hint = " (HF_HUB_OFFLINE is set: only local folders and already cached hub ids load)" if hub_offline() else ""
            raise ConfigError(f"head.path: cannot load a {self.pipeline_class} from {c.path}{hint}: "
                              f"{str(e).splitlines()[0][:200]}") from None
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def load_kwargs(self) -> Dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ family hooks
    def encode_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        """Embeddings of each prompt: dict of [n, ...] tensors (no CFG doubling)."""
        raise NotImplementedError

    def tokenize_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        """Token ids of each prompt: dict of [n, L] int tensors (families that train the text encoder)."""
        raise NotImplementedError

    def embed_tokens(self, tokens: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """``tokenize_prompts``'s output -> ``encode_prompts``'s, differentiable in the text encoder."""
        raise NotImplementedError

    def latent_shape(self) -> Sequence[int]:
        """Shape of one sample's latents (without the batch dim)."""
        raise NotImplementedError

    def denoise(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        """One denoiser call in flowrl's convention: x [B, ...] model dtype, t [B] in [0, 1]."""
        raise NotImplementedError

    def decode_latents(self, x: Tensor) -> Tensor:
        """Latents [b, ...] -> images [b, 3, H, W] in [-1, 1] (the VAE's output)."""
        raise NotImplementedError

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        """[K+1] times of the pipeline's own scheduler (shift, dynamic shift), from 1 to 0."""
        return None

    # ------------------------------------------------------------------ Head contract
    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    @torch.no_grad()
    def encode(self, batch: Sequence[Any]) -> Dict[str, Tensor]:
        """{key: [B, ...]} positive embeddings, plus ``neg_<key>`` when CFG is on. With a trained
        text encoder the keys hold token ids instead; ``velocity`` embeds them on every call."""
        prompts = prompts_of(batch)
        missing = list(dict.fromkeys(p for p in prompts if p not in self._cache))
        if missing:
            enc = self._encode_or_tokenize(missing)
            for i, p in enumerate(missing):
                self._remember(p, {k: v[i].cpu() for k, v in enc.items()})
        rows = [self._cache[p] for p in prompts]
        cond = {k: torch.stack([r[k] for r in rows]) for k in rows[0]}
        if self.uses_cfg and self.config.guidance_scale > 1:
            if None not in self._cache:
                enc = self._encode_or_tokenize([self.config.negative_prompt])
                self._remember(None, {k: v[0].cpu() for k, v in enc.items()})
            neg = self._cache[None]
            cond.update({f"neg_{k}": v.unsqueeze(0).expand(len(prompts), *v.shape).contiguous() for k, v in neg.items()})
        return cond

    def _encode_or_tokenize(self, prompts: List[str]) -> Dict[str, Tensor]:
        return self.tokenize_prompts(prompts) if self.text_encoder is not None else self.encode_prompts(prompts)

    def _remember(self, key: Optional[str], value: Dict[str, Tensor]) -> None:
        self._cache[key] = value
        while len(self._cache) > self.config.prompt_cache_size:
            oldest = next(k for k in self._cache if k is not None)
            del self._cache[oldest]

    def init_noise(self, cond: Dict[str, Tensor], generators: Sequence[torch.Generator]) -> Tensor:
        shape = tuple(self.latent_shape())
        return torch.stack([torch.randn(shape, generator=g, device=g.device, dtype=torch.float32) for g in generators])

    def velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        if self.text_encoder is not None:
            cond = self._embedded(cond)
        pos = {k: v for k, v in cond.items() if not k.startswith("neg_")}
        xm = x.to(self.dtype)

        def call(xx, tt, cc):
            return self.denoise(xx, tt, {k: v.to(xx.device) for k, v in cc.items()}).float()

        if self.uses_cfg and self.config.guidance_scale > 1:
            neg = {k[4:]: v for k, v in cond.items() if k.startswith("neg_")}
            return guided_velocity(call, xm, t, pos, neg, self.config.guidance_scale)
        return call(xm, t, pos)

    def _embedded(self, cond: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """Token ids (``encode``'s output with a trained text encoder) -> embeddings, with gradients."""
        pos = {k: v.to(self.device) for k, v in cond.items() if not k.startswith("neg_")}
        neg = {k[4:]: v.to(self.device) for k, v in cond.items() if k.startswith("neg_")}
        out = self.embed_tokens(pos)
        if neg:
            out.update({f"neg_{k}": v for k, v in self.embed_tokens(neg).items()})
        return out

    @contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        from peft.tuners.tuners_utils import BaseTunerLayer

        text_layers = [m for m in self.text_encoder.modules() if isinstance(m, BaseTunerLayer)] if self.text_lora_config else []
        self.denoiser.disable_adapters()
        for m in text_layers:
            m.enable_adapters(False)
        try:
            yield
        finally:
            self.denoiser.enable_adapters()
            for m in text_layers:
                m.enable_adapters(True)

    @property
    def has_reference(self) -> bool:
        return self.lora_config is not None  # the reference is the same weights with the adapter off

    @property
    def reference_hint(self) -> str:
        return "full fine-tuning keeps no copy of the starting weights; a LoRA (head.lora_rank > 0) does"

    def reference_velocity(self, x, t, cond):
        if not self.has_reference:
            raise NotImplementedError(self.reference_hint)
        with torch.no_grad(), self.adapters_disabled():
            return self.velocity(x, t, cond)

    @torch.no_grad()
    def decode(self, x: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        out = []
        for chunk in torch.split(x, self.config.decode_batch_size):
            img = self.decode_latents(chunk.to(self.device, self.dtype))
            out.append((img.float() / 2 + 0.5).clamp(0, 1).cpu())
        return torch.cat(out)

    # ------------------------------------------------------------------ saving
    def lora_state_dict(self) -> Dict[str, Tensor]:
        from peft.utils import get_peft_model_state_dict

        # contiguous: LoRA factors of convolutions are channels-last with head.channels_last
        return {k: v.contiguous() for k, v in get_peft_model_state_dict(self.denoiser).items()}

    def text_lora_state_dict(self) -> Dict[str, Tensor]:
        from peft.utils import get_peft_model_state_dict

        return get_peft_model_state_dict(self.text_encoder)

    def save_pretrained(self, directory: str) -> None:
        """LoRA: the family's ``save_lora_weights`` (plain diffusers ``load_lora_weights`` reads it);
        full fine-tuning: the whole pipeline with ``save_pretrained``."""
        os.makedirs(directory, exist_ok=True)
        if self.lora_config is not None:
            layers = {f"{self.denoiser_name}_lora_layers": self.lora_state_dict(),
                      f"{self.denoiser_name}_lora_adapter_metadata": lora_metadata(self.lora_config)}
            if self.text_lora_config is not None:
                layers.update(text_encoder_lora_layers=self.text_lora_state_dict(),
                              text_encoder_lora_adapter_metadata=lora_metadata(self.text_lora_config))
            type(self.pipe).save_lora_weights(directory, **layers)
        else:
            self.pipe.save_pretrained(directory)  # diffusers saves channels-last weights in the usual layout
            if self.config.export_lora_rank:
                self.save_change_as_lora(os.path.join(directory, "lora"))
        with open(os.path.join(directory, "flowrl_head.json"), "w") as fh:
            json.dump(asdict(self.config), fh, indent=2)

    def save_change_as_lora(self, directory: str) -> None:
        """Write the change full fine-tuning made to the denoiser (against the weights in
        ``head.path``) as a rank ``export_lora_rank`` LoRA (``lora_export.py``) with the family's
        ``save_lora_weights``, plus ``lora_export.json`` (rank, modules, share of the change kept)."""
        from flowrl.heads.t2i.lora_export import lora_from_change

        base = type(self.denoiser).from_pretrained(self.config.path, subfolder=self.denoiser_name,
                                                   local_files_only=hub_offline())
        export = lora_from_change(base, self.denoiser, self.config.export_lora_rank)
        type(self.pipe).save_lora_weights(directory, **{
            f"{self.denoiser_name}_lora_layers": export.state_dict,
            f"{self.denoiser_name}_lora_adapter_metadata": lora_metadata(export.config)})
        with open(os.path.join(directory, "lora_export.json"), "w") as fh:
            json.dump({"rank": self.config.export_lora_rank, "modules": export.modules,
                       "change_kept": round(export.kept, 6)}, fh, indent=2)

    def save_samples(self, images: Tensor, items: Sequence[Any], output_dir: str, tag: str) -> str:
        """Write an image grid PNG, each image with its prompt under it, to
        ``output_dir/samples/<tag>.png``; returns its path."""
        path = os.path.join(output_dir, "samples", f"{tag}.png")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        captioned_grid(images, prompts_of(items)).save(path)
        return path


class _FirstTruncationOnly(logging.Filter):
    """Let a pipeline's "part of your input was truncated" warning through once per run:
    it repeats on every prompt batch (a model trained with short T5 sequences hits it always)."""

    seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "was truncated because" not in str(record.msg):
            return True
        if self.seen:
            return False
        self.seen = True
        return True


def quiet_repeated_truncation(logger_name: str) -> None:
    """Install ``_FirstTruncationOnly`` on a diffusers pipeline module's logger (once)."""
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, _FirstTruncationOnly) for f in logger.filters):
        logger.addFilter(_FirstTruncationOnly())


def _wrap(text: str, width: int) -> List[str]:
    """Greedy word wrap to lines of at most ``width`` characters."""
    lines: List[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def captioned_grid(images: Tensor, captions: Sequence[str], tile: int = 128, text_lines: int = 3):
    """images [N, 3, H, W] in [0, 1] -> a PIL grid, each image scaled (nearest) to ``tile``
    pixels wide with its caption (wrapped, at most ``text_lines`` lines) under it."""
    from PIL import Image, ImageDraw, ImageFont

    n = len(images)
    cols = max(1, int(n ** 0.5))
    rows = (n + cols - 1) // cols
    h, w = images.shape[-2:]
    th = max(1, round(tile * h / w))
    font = ImageFont.load_default()
    line_h, chars = 12, max(8, tile // 6)
    cell_h = th + 4 + line_h * text_lines
    grid = Image.new("RGB", (cols * (tile + 4), rows * cell_h), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    for i in range(n):
        x, y = (i % cols) * (tile + 4) + 2, (i // cols) * cell_h + 2
        grid.paste(Image.fromarray(pixels[i]).resize((tile, th), Image.NEAREST), (x, y))
        for k, line in enumerate(_wrap(str(captions[i]), chars)[:text_lines]):
            draw.text((x, y + th + 1 + k * line_h), line, fill=(0, 0, 0), font=font)
    return grid
