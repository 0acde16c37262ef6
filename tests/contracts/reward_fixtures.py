"""Tiny reward models built in code, saved in the real on-disk formats, and one
``make_<reward name>(tmp_path) -> RewardCase`` per registered reward.

The shared reward contract (tests/contracts/test_reward_contract.py) looks up
``make_<name>`` for EVERY registered reward and fails when one is missing: a new reward
adds its function here. The tiny models use each real architecture (transformers
CLIPModel, open_clip CLIP, the LAION aesthetic MLP head) with random weights, and the real
CLIP byte-pair tokenizer built from the vocabulary file open_clip ships.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from rewards.base import REWARDS, RewardConfig

PROMPTS = ["a red cube", "a photo of a dog on the beach", "an astronaut riding a horse", "a red cube",
           "two cats", "a watercolor painting of a lighthouse at dusk"]
IMAGE_SIZE = 32  # tiny vision towers: 32 x 32 input, 8 x 8 patches


@dataclass
class RewardCase:
    """What the contract test needs to exercise one reward.

    config:  a buildable config of the reward (tiny local weights).
    outputs: a batch of outputs the reward scores (images [B, 3, H, W] in [0, 1], ...).
    batch:   the matching batch items (prompts or dicts with a "prompt" key).
    missing: the same config pointing at a weight file that does not exist, and the file
             name the one-line error must mention; None for rewards without weights.
    """

    config: RewardConfig
    outputs: Any
    batch: Sequence[Any]
    missing: Optional[RewardConfig] = None
    missing_name: str = ""


def images(n: int = 6, size: int = 40, seed: int = 0) -> torch.Tensor:
    """[n, 3, size, size] images in [0, 1], quantised to uint8 levels (exact PIL round trip)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, size, size), generator=g).float() / 255.0


def prompt_batch(n: int = 6) -> List[Any]:
    """Prompt items: strings and dicts with a "prompt" key (+ metadata), mixed."""
    return [p if i % 2 == 0 else {"prompt": p, "tag": i} for i, p in enumerate(PROMPTS[:n])]


# --------------------------------------------------------------------------- tokenizer
def write_clip_tokenizer_files(folder: Path) -> None:
    """vocab.json + merges.txt (transformers CLIPTokenizer format) of the real CLIP BPE."""
    from flowrl.heads.t2i.tokenizers import build_clip_tokenizer

    build_clip_tokenizer(str(folder))


# --------------------------------------------------------------------------- transformers CLIP
def tiny_clip_config(projection_dim: int = 16):
    from transformers import CLIPConfig

    text = dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, max_position_embeddings=77, bos_token_id=49406, eos_token_id=49407,
                pad_token_id=1, projection_dim=projection_dim)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=IMAGE_SIZE, patch_size=8, projection_dim=projection_dim)
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=projection_dim)


def save_tiny_hf_clip(folder: Path, seed: int = 0, projection_dim: int = 16, logit_scale: float = 2.6592) -> Path:
    """A random tiny CLIPModel + CLIPProcessor saved with save_pretrained into ``folder``."""
    from transformers import CLIPModel

    torch.manual_seed(seed)
    model = CLIPModel(tiny_clip_config(projection_dim)).eval()
    with torch.no_grad():
        model.logit_scale.fill_(logit_scale)
    model.save_pretrained(folder)
    save_tiny_hf_processor(folder)
    return folder


def save_tiny_hf_processor(folder: Path) -> Path:
    """CLIPProcessor (real CLIP BPE tokenizer + a tiny image processor) into ``folder``."""
    from transformers import CLIPImageProcessor, CLIPProcessor, CLIPTokenizer

    tok_dir = folder / "_tok"
    write_clip_tokenizer_files(tok_dir)
    tokenizer = CLIPTokenizer.from_pretrained(str(tok_dir), local_files_only=True)  # from vocab.json + merges.txt
    image_processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                         crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------- open_clip
TINY_OPEN_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": IMAGE_SIZE, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


def write_open_clip_config(folder: Path, name: str = "tiny-ViT-H-14") -> Path:
    """An open_clip architecture JSON (ViT-H-14's layout, tiny widths) named ``name``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(TINY_OPEN_CLIP), encoding="utf-8")
    return path


def save_tiny_open_clip(folder: Path, name: str = "tiny-ViT-H-14", seed: int = 0,
                        wrap: bool = False) -> tuple:
    """(architecture JSON, checkpoint file) of a random tiny open_clip CLIP.

    wrap=False: a plain state dict (open_clip_pytorch_model.bin, as laion publishes);
    wrap=True: {"state_dict": ..., "epoch": 1} as in the HPSv2 checkpoint.
    """
    import open_clip

    cfg = write_open_clip_config(folder, name)
    open_clip.add_model_config(str(cfg))
    torch.manual_seed(seed)
    model = open_clip.create_model(name, pretrained=None).eval()
    state = model.state_dict()
    ckpt = folder / ("HPS_v2_compressed.pt" if wrap else "open_clip_pytorch_model.bin")
    torch.save({"state_dict": state, "epoch": 1} if wrap else state, ckpt)
    return cfg, ckpt


# --------------------------------------------------------------------------- aesthetic head
def save_tiny_aesthetic_head(path: Path, in_dim: int = 16, seed: int = 0) -> Path:
    """A random LAION aesthetic MLP head state dict (layers.0 ... layers.7) at ``path``."""
    from rewards.aesthetic import AestheticHead

    torch.manual_seed(seed)
    torch.save(AestheticHead(in_dim).state_dict(), path)
    return path


# --------------------------------------------------------------------------- one case per reward
def _cfg(name: str, **fields: Any) -> RewardConfig:
    return REWARDS.get(name).config_cls(**fields)


def make_toy_mode(tmp_path: Path) -> RewardCase:
    return RewardCase(_cfg("toy_mode"), torch.randn(6, 2), list(range(6)))


def make_toy_mode_fraction(tmp_path: Path) -> RewardCase:
    return RewardCase(_cfg("toy_mode_fraction"), torch.randn(6, 2), list(range(6)))


def make_brightness(tmp_path: Path) -> RewardCase:
    return RewardCase(_cfg("brightness"), images(), prompt_batch())


def make_clip(tmp_path: Path) -> RewardCase:
    folder = save_tiny_hf_clip(tmp_path / "clip", seed=5)  # seed 5: positive cosines (no clamping at 0)
    cfg = _cfg("clip", backend="transformers", path=str(folder))
    return RewardCase(cfg, images(), prompt_batch(), replace(cfg, path=str(tmp_path / "absent" / "clip")), "absent")


def make_clip__open_clip(tmp_path: Path) -> RewardCase:
    """Variant ``clip__open_clip``: the open_clip backend of ``clip``."""
    arch, ckpt = save_tiny_open_clip(tmp_path / "oc")
    cfg = _cfg("clip", backend="open_clip", model_name=arch.stem, model_config=str(arch), pretrained=str(ckpt))
    return RewardCase(cfg, images(), prompt_batch(),
                      replace(cfg, pretrained=str(tmp_path / "open_clip_missing.bin")), "open_clip_missing.bin")


def make_pickscore(tmp_path: Path) -> RewardCase:
    model = save_tiny_hf_clip(tmp_path / "pickscore_model", seed=1, logit_scale=4.6052)
    proc = save_tiny_hf_processor(tmp_path / "pickscore_processor")
    cfg = _cfg("pickscore", path=str(model), processor_path=str(proc))
    return RewardCase(cfg, images(), prompt_batch(), replace(cfg, path=str(tmp_path / "PickScore_v1")), "PickScore_v1")


def make_hpsv2(tmp_path: Path) -> RewardCase:
    arch, ckpt = save_tiny_open_clip(tmp_path / "hps", seed=2, wrap=True)
    cfg = _cfg("hpsv2", checkpoint=str(ckpt), model_name=arch.stem, model_config=str(arch))
    return RewardCase(cfg, images(), prompt_batch(),
                      replace(cfg, checkpoint=str(tmp_path / "HPS_v2.1_compressed.pt")), "HPS_v2.1_compressed.pt")


def make_aesthetic(tmp_path: Path) -> RewardCase:
    clip = save_tiny_hf_clip(tmp_path / "clip_l14", seed=3)
    head = save_tiny_aesthetic_head(tmp_path / "sac+logos+ava1-l14-linearMSE.pth")
    cfg = _cfg("aesthetic", clip_path=str(clip), head_path=str(head))
    return RewardCase(cfg, images(), prompt_batch(),
                      replace(cfg, head_path=str(tmp_path / "missing" / "sac+logos+ava1-l14-linearMSE.pth")),
                      "sac+logos+ava1-l14-linearMSE.pth")


def make_jpeg_compressibility(tmp_path: Path) -> RewardCase:
    return RewardCase(_cfg("jpeg_compressibility"), images(), prompt_batch())


def make_jpeg_incompressibility(tmp_path: Path) -> RewardCase:
    return RewardCase(_cfg("jpeg_incompressibility"), images(), prompt_batch())


def fixtures() -> Dict[str, Callable[[Path], RewardCase]]:
    """Case id -> builder: every ``make_<id>`` function of this module.

    An id is a registered reward name, or ``<name>__<variant>`` for another configuration
    of a registered reward (e.g. ``clip__open_clip``). Add a reward's fixture by adding
    its ``make_<name>(tmp_path)`` function anywhere in this file.
    """
    return {k[len("make_"):]: v for k, v in globals().items() if k.startswith("make_") and callable(v)}


# --------------------------------------------------------------------------- VLM yes/no judge (tiny Qwen2.5-VL)
VLM_SPECIAL_TOKENS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen2.5-VL's chat layout (user turn: <|vision_start|><|image_pad|><|vision_end|> then the text), written here
VLM_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_qwen2_tokenizer():
    """A real Qwen2 byte-level BPE tokenizer with a tiny vocabulary: the 256 byte symbols,
    merges that make "Yes" and "No" single tokens, and the special tokens Qwen2.5-VL's
    processor needs; the chat template above."""
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import Qwen2TokenizerFast

    vocab = {sym: i for i, sym in enumerate(sorted(ByteLevel.alphabet()))}
    merges = [("Y", "e"), ("Ye", "s"), ("N", "o")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Qwen2TokenizerFast(vocab=vocab, merges=merges, additional_special_tokens=VLM_SPECIAL_TOKENS)
    tok.chat_template = VLM_CHAT_TEMPLATE
    return tok


def save_tiny_qwen2_5_vl(folder: Path, seed: int = 0) -> Path:
    """A random tiny Qwen2_5_VLForConditionalGeneration (2 text + 2 vision layers, width 32)
    and its Qwen2_5_VLProcessor, saved with save_pretrained into ``folder`` (the layout of
    Qwen/Qwen2.5-VL-7B-Instruct: config.json, model.safetensors, tokenizer and processor files)."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

    tok = tiny_qwen2_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in VLM_SPECIAL_TOKENS}
    # patch 14, merge 2: a 28 x 28 image is 4 patches = 1 image token; at most 56 x 56 (4 tokens)
    image_processor = Qwen2VLImageProcessor(min_pixels=28 * 28, max_pixels=56 * 56)
    video_processor = Qwen2VLVideoProcessor(min_pixels=28 * 28, max_pixels=56 * 56)
    processor = Qwen2_5_VLProcessor(image_processor=image_processor, tokenizer=tok, video_processor=video_processor,
                                    chat_template=VLM_CHAT_TEMPLATE)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.2, bos_token_id=None, eos_token_id=ids["<|im_end|>"],
                         pad_token_id=tok.pad_token_id,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           fullatt_block_indexes=[1], window_size=56, initializer_range=0.2),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).eval().save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def make_vlm_yes_no(tmp_path: Path) -> RewardCase:
    folder = save_tiny_qwen2_5_vl(tmp_path / "qwen2_5_vl")
    cfg = _cfg("vlm_yes_no", path=str(folder), batch_size=4)
    return RewardCase(cfg, images(), prompt_batch(), replace(cfg, path=str(tmp_path / "absent" / "Qwen2.5-VL")),
                      "Qwen2.5-VL")


# --------------------------------------------------------------------------- remote reward (in-process server)
from flowrl.types import RewardOutput  # noqa: E402
from rewards.base import Reward  # noqa: E402

CONTRACT_TOKEN_ENV = "FLOWRL_CONTRACT_REWARD_TOKEN"


class MeanIntensity(Reward):
    """Served by the contract server: score [B] = 100 * mean pixel value (a stand-in model)."""

    def score(self, outputs, batch):
        s = 100.0 * outputs.float().mean(dim=(1, 2, 3))
        return RewardOutput(s, torch.ones_like(s, dtype=torch.bool))


@lru_cache(maxsize=1)
def contract_server():
    """One loopback reward server (daemon thread) per test process, serving ``mean_intensity``.

    The token is put in ``FLOWRL_CONTRACT_REWARD_TOKEN``; the thread ends with the process.
    """
    import secrets

    from rewards.remote import serve_in_thread

    token = os.environ.setdefault(CONTRACT_TOKEN_ENV, secrets.token_hex(16))
    return serve_in_thread({"mean_intensity": MeanIntensity(RewardConfig(name="mean_intensity"))}, token)


def make_remote(tmp_path: Path) -> RewardCase:
    """A RemoteReward against a real loopback server (in-process thread). Its ``missing``
    case is not about weights (a remote reward has none): None."""
    server = contract_server()
    cfg = _cfg("remote", url=server.url, reward="mean_intensity", token_env=CONTRACT_TOKEN_ENV,
               request_timeout_s=10.0, retries=1, backoff_s=0.05)
    return RewardCase(cfg, images(), prompt_batch())



# --------------------------------------------------------------------------- ShapesEval (pixels-only verifier)
def make_shapes_eval(tmp_path: Path) -> RewardCase:
    """Four renders that satisfy their prompts and two that do not."""
    import numpy as np

    from rewards.shapes import prompts as P
    from rewards.shapes import world as W
    from rewards.shapes.verifier import ShapesEvalConfig

    rng = np.random.default_rng(0)
    items = [P.parse_prompt(t) for t in ("a circle", "a circle and a square", "three triangles", "a blue square",
                                         "a diamond above a circle", "a red circle and a green triangle")]
    scenes = [P.sample_scene(it, rng) for it in items]
    images = W.render_batch(scenes[:4] + scenes[:2])  # the last two do not match their prompts
    return RewardCase(ShapesEvalConfig(), images, items)
