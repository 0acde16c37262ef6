"""Tiny text-to-image pipelines built in code, saved in diffusers' real on-disk format.

Tests, examples and smoke configs load them through the head's normal loading path (the
pipeline's own ``from_pretrained``), exactly as SD3.5, FLUX.1 or SD1.5 weights would be.
Weights are random (seeded); components are put in eval mode before saving.
"""
from __future__ import annotations

import os
from typing import Callable, Dict

import torch

from flowrl.heads.t2i.tokenizers import build_clip_tokenizer

NUM_MERGES = 2000  # a small real BPE vocabulary (2514 tokens)


def _clip_text(projection: bool, hidden: int = 32, vocab: int = 2514, seed: int = 0):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, projection_dim=hidden,
                         bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    torch.manual_seed(seed)
    model = (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg)
    return model.eval()


def _t5(d_model: int = 64, vocab: int = 2514, seed: int = 0):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=vocab, d_model=d_model, d_kv=16, d_ff=2 * d_model, num_layers=2, num_heads=2,
                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=vocab - 1, eos_token_id=vocab - 1)
    torch.manual_seed(seed)
    return T5EncoderModel(cfg).eval()


def _vae(latent_channels: int, blocks=(8,), seed: int = 0, **kw):
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    vae = AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=blocks, layers_per_block=1,
                        latent_channels=latent_channels, norm_num_groups=4,
                        down_block_types=("DownEncoderBlock2D",) * len(blocks),
                        up_block_types=("UpDecoderBlock2D",) * len(blocks), **kw)
    return vae.eval()


def build_tiny_sd3(directory: str, seed: int = 0) -> str:
    """A tiny StableDiffusion3Pipeline (two CLIP encoders + T5, SD3 transformer, VAE)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                        attention_head_dim=8, num_attention_heads=2, joint_attention_dim=64,
                                        caption_projection_dim=16, pooled_projection_dim=64, out_channels=4,
                                        pos_embed_max_size=16).eval()
    tok = build_clip_tokenizer(os.path.join(directory, "_tok"), NUM_MERGES)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=_vae(4, shift_factor=0.0609, scaling_factor=1.5035, use_quant_conv=False, use_post_quant_conv=False),
        text_encoder=_clip_text(True, seed=seed + 1), tokenizer=tok,
        text_encoder_2=_clip_text(True, seed=seed + 2), tokenizer_2=tok,
        text_encoder_3=_t5(seed=seed + 3), tokenizer_3=tok,
    )
    pipe.save_pretrained(directory)
    return directory


def build_tiny_flux(directory: str, seed: int = 0) -> str:
    """A tiny FluxPipeline (CLIP + T5, Flux transformer with guidance embedding, VAE)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    torch.manual_seed(seed)
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                         attention_head_dim=8, num_attention_heads=2, joint_attention_dim=64,
                                         pooled_projection_dim=32, guidance_embeds=True,
                                         axes_dims_rope=(2, 2, 4)).eval()
    tok = build_clip_tokenizer(os.path.join(directory, "_tok"), NUM_MERGES)
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                            base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(
        transformer=transformer, scheduler=sched,
        vae=_vae(4, blocks=(8, 8), shift_factor=0.1159, scaling_factor=0.3611, use_quant_conv=False,
                 use_post_quant_conv=False),
        text_encoder=_clip_text(False, seed=seed + 1), tokenizer=tok,
        text_encoder_2=_t5(seed=seed + 2), tokenizer_2=tok,
    )
    pipe.save_pretrained(directory)
    return directory


def build_tiny_sd(directory: str, seed: int = 0, flow: bool = False) -> str:
    """A tiny StableDiffusionPipeline (CLIP text encoder, UNet, VAE, DDIM scheduler; with
    ``flow`` a ``FlowMatchEulerDiscreteScheduler``: a velocity-predicting UNet)."""
    from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1,
                                block_out_channels=(16, 32), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                                attention_head_dim=4, norm_num_groups=8).eval()
    tok = build_clip_tokenizer(os.path.join(directory, "_tok"), NUM_MERGES)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0) if flow else DDIMScheduler(
        beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, set_alpha_to_one=False,
        steps_offset=1)
    pipe = StableDiffusionPipeline(unet=unet, scheduler=sched, vae=_vae(4, blocks=(8, 8)),
                                   text_encoder=_clip_text(False, seed=seed + 1), tokenizer=tok,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(directory)
    return directory


BUILDERS: Dict[str, Callable[[str, int], str]] = {"sd3": build_tiny_sd3, "flux": build_tiny_flux, "sd": build_tiny_sd}
