"""VLM yes/no judge: score = 100 * sigmoid(logit("Yes") - logit("No")) of the next token.

For each (image, prompt) the judge builds a one-turn chat with the processor's chat template
(user turn = the image, then ``question`` with ``{prompt}`` filled in), runs ONE forward pass
of a transformers image-text-to-text model (no generation) on a left-padded batch, and reads
the next-token logits at the last position. The default question is FDFO's.

Works with any ``AutoModelForImageTextToText`` checkpoint whose processor has a chat template
(Qwen2.5-VL, LLaVA, ...), e.g. ``path: Qwen/Qwen2.5-VL-7B-Instruct`` or a local folder holding
``config.json``, the safetensors weights and the processor files. No ``trust_remote_code``.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from PIL import Image

from flowrl._fields import hfield
from flowrl.registry import ConfigError
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.images import finite_rows, prompts_of, to_pil
from rewards.loading import from_pretrained

Tensor = torch.Tensor

DEFAULT_QUESTION = 'Does this image match the caption "{prompt}"? Answer Yes or No.'
EXAMPLE_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"


@dataclass
class VLMYesNoConfig(RewardConfig):
    """A yes/no judge through a transformers image-text-to-text model."""

    name: str = hfield("vlm_yes_no", "reward name")
    path: str = hfield("", f"local model folder or hub id of an image-text-to-text model with a chat template, e.g. {EXAMPLE_MODEL}")
    question: str = hfield(DEFAULT_QUESTION, "question asked about each image; {prompt} is replaced by the item's prompt")
    yes_token: str = hfield("Yes", "the answer whose logit counts for the image (must be ONE token of the model's tokenizer)")
    no_token: str = hfield("No", "the answer whose logit counts against the image (must be ONE token of the model's tokenizer)")
    batch_size: int = hfield(8, "images per forward pass")
    max_pixels: Optional[int] = hfield(None, "downscale images to at most this many pixels (H*W) before the processor; null = as given")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1:
            raise ConfigError(f"{self.name}.batch_size: must be >= 1, got {self.batch_size}")
        if self.max_pixels is not None and self.max_pixels < 1:
            raise ConfigError(f"{self.name}.max_pixels: must be >= 1 or null, got {self.max_pixels}")
        if not self.yes_token or not self.no_token or self.yes_token == self.no_token:
            raise ConfigError(f"{self.name}.yes_token/no_token: need two different non-empty answers, e.g. 'Yes' and 'No'")


# --------------------------------------------------------------------------- pure helpers
def yes_no_score(logits: Tensor, yes_id: int, no_id: int) -> Tensor:
    """Next-token logits [B, V] -> [B] float32 score 100 * sigmoid(logit_yes - logit_no)."""
    lg = logits.float()
    return 100.0 * torch.sigmoid(lg[:, yes_id] - lg[:, no_id])


def chat_messages(question: str, prompt: str) -> List[Dict[str, Any]]:
    """One user turn (image first, then the question with ``{prompt}`` filled in)."""
    text = question.replace("{prompt}", prompt)
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def limit_pixels(image: Image.Image, max_pixels: Optional[int]) -> Image.Image:
    """Downscale (aspect kept, bicubic) so that width * height <= max_pixels; None = unchanged."""
    w, h = image.size
    if max_pixels is None or w * h <= max_pixels:
        return image
    scale = math.sqrt(max_pixels / (w * h))
    size = (max(1, int(w * scale)), max(1, int(h * scale)))
    return image.resize(size, Image.BICUBIC)


def single_token_id(tokenizer: Any, text: str, key: str) -> int:
    """The id of ``text`` if the tokenizer encodes it as exactly one token, else a ConfigError."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise ConfigError(
            f"{key}: {text!r} is {len(ids)} tokens {pieces} for this model's tokenizer; "
            f"choose an answer that is a single token (e.g. 'Yes'/'No' or ' Yes'/' No')"
        )
    return int(ids[0])


def load_image_text_to_text(path: str, dtype: Any = torch.float32, key: str = "vlm_yes_no.path") -> Tuple[Any, Any]:
    """(model.eval(), processor) from a local folder or a hub id (rewards.loading: offline-safe,
    one-line FileNotFoundError naming the path and where to get the weights). No remote code."""
    from transformers import AutoModelForImageTextToText, AutoProcessor  # heavy: import lazily

    source = (f"download an image-text-to-text model with a chat template, e.g. `huggingface-cli download "
              f"{EXAMPLE_MODEL} --local-dir DIR`, and set {key} to DIR (or to the hub id)")
    processor = from_pretrained(AutoProcessor.from_pretrained, path, key, "the model folder (processor files)", source)
    model = from_pretrained(AutoModelForImageTextToText.from_pretrained, path, key, "the model folder (weights)",
                            source, dtype=dtype)
    return model.eval().requires_grad_(False), processor


def _to(value: Any, device: torch.device, dtype: torch.dtype) -> Any:
    """Move a processor output to the model: float tensors also take the model's dtype."""
    if not isinstance(value, Tensor):
        return value
    return value.to(device, dtype) if value.is_floating_point() else value.to(device)


# --------------------------------------------------------------------------- the reward
class VLMYesNoReward(Reward):
    """score [B] in (0, 100): how strongly the VLM answers ``yes_token`` over ``no_token``."""

    def __init__(self, config: VLMYesNoConfig):
        super().__init__(config)
        model, self.processor = load_image_text_to_text(config.path, self.dtype)
        self.model = self.place(model)  # RewardConfig's device / dtype / offload
        if not getattr(self.processor, "chat_template", None):
            raise ConfigError(f"vlm_yes_no.path: the processor of '{config.path}' has no chat template; use an instruct/chat checkpoint")
        tokenizer = self.processor.tokenizer
        tokenizer.padding_side = "left"  # the last position is then every row's next token
        self.yes_id = single_token_id(tokenizer, config.yes_token, "vlm_yes_no.yes_token")
        self.no_id = single_token_id(tokenizer, config.no_token, "vlm_yes_no.no_token")
        self._keep_last = "logits_to_keep" in inspect.signature(self.model.forward).parameters

    def prepare(self, images: Sequence[Image.Image], prompts: Sequence[str]) -> Dict[str, Tensor]:
        """Processor inputs for one left-padded batch (input_ids [b, L], pixel_values, ...)."""
        texts = [self.processor.apply_chat_template(chat_messages(self.config.question, p), tokenize=False,
                                                    add_generation_prompt=True) for p in prompts]
        images = [limit_pixels(im, self.config.max_pixels) for im in images]
        return self.processor(text=texts, images=images, padding=True, return_tensors="pt")

    def next_token_logits(self, inputs: Dict[str, Tensor]) -> Tensor:
        """One forward pass -> [b, V] logits of the token after the prompt."""
        param = next(self.model.parameters())  # where the model is now (offloading moves it per call)
        moved = {k: _to(v, param.device, param.dtype) for k, v in inputs.items()}
        extra = {"logits_to_keep": 1} if self._keep_last else {}
        return self.model(**moved, **extra).logits[:, -1]

    def score(self, outputs: Tensor, batch: Sequence[Any]) -> RewardOutput:
        """outputs [B, 3, H, W] in [0, 1]; batch: B prompts (or dicts with "prompt") -> score [B].

        A sample with a non-finite pixel is scored as a sanitised image and marked invalid."""
        images, prompts = to_pil(torch.nan_to_num(outputs.float(), nan=0.0)), prompts_of(batch)
        if len(images) != len(prompts):
            raise ValueError(f"{len(images)} images but {len(prompts)} prompts")
        bs = self.config.batch_size
        scores = [yes_no_score(self.next_token_logits(self.prepare(images[i:i + bs], prompts[i:i + bs])), self.yes_id, self.no_id)
                  for i in range(0, len(images), bs)]
        score = torch.cat(scores).cpu() if scores else torch.zeros(0)
        return RewardOutput(score, finite_rows(outputs).cpu())


REWARDS.register("vlm_yes_no", VLMYesNoConfig,
                 help="VLM yes/no judge: 100*sigmoid(logit Yes - logit No) (transformers image-text-to-text)")(VLMYesNoReward)

__all__ = ["VLMYesNoConfig", "VLMYesNoReward", "DEFAULT_QUESTION", "yes_no_score", "chat_messages", "limit_pixels",
           "single_token_id", "load_image_text_to_text"]
