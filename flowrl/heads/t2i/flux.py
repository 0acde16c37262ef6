"""FLUX.1 (``FluxPipeline``): flow matching on packed latents, guidance embedding.

State x is the packed latent sequence [B, (h/2)(w/2), 4C] the transformer consumes;
noise is drawn unpacked [C, h, w] per sample and packed, as the pipeline does, so the
same generator gives the same image in plain diffusers. FLUX.1-dev is guidance-distilled:
``guidance_scale`` feeds the guidance embedding and no CFG batch is run.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np
import torch

from flowrl.heads.t2i.head import T2IHead

Tensor = torch.Tensor


class FluxHead(T2IHead):
    pipeline_class = "FluxPipeline"
    denoiser_name = "transformer"
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    uses_cfg = False

    def _latent_hw(self) -> int:
        f = self.pipe.vae_scale_factor
        return 2 * (self.config.resolution // (f * 2))

    def encode_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        embeds, pooled, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=prompts, device=self.device,
                                                    max_sequence_length=self.config.max_sequence_length)
        return {"prompt_embeds": embeds, "pooled": pooled}

    def latent_shape(self):
        side = self._latent_hw()
        return ((side // 2) * (side // 2), self.denoiser.config.in_channels)

    def init_noise(self, cond, generators):
        side, c = self._latent_hw(), self.denoiser.config.in_channels // 4
        raw = torch.stack([torch.randn((c, side, side), generator=g, device=g.device) for g in generators])
        return self.pipe._pack_latents(raw, raw.shape[0], c, side, side)

    def denoise(self, x, t, cond):
        b = x.shape[0]
        side = self._latent_hw()
        img_ids = self.pipe._prepare_latent_image_ids(b, side // 2, side // 2, x.device, x.dtype)
        txt_ids = torch.zeros(cond["prompt_embeds"].shape[1], 3, device=x.device, dtype=x.dtype)
        guidance = None
        if self.denoiser.config.guidance_embeds:
            guidance = torch.full((b,), self.config.guidance_scale, device=x.device, dtype=torch.float32)
        return self.denoiser(hidden_states=x, timestep=t.to(x.device, x.dtype), guidance=guidance,
                             pooled_projections=cond["pooled"], encoder_hidden_states=cond["prompt_embeds"],
                             txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]

    def decode_latents(self, x):
        vae = self.pipe.vae
        res = self.config.resolution
        x = self.pipe._unpack_latents(x, res, res, self.pipe.vae_scale_factor)
        x = x / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(x, return_dict=False)[0]

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        from diffusers import FlowMatchEulerDiscreteScheduler
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        sched = FlowMatchEulerDiscreteScheduler.from_config(self.pipe.scheduler.config)
        cfg = sched.config
        mu = calculate_shift(self.latent_shape()[0], cfg.get("base_image_seq_len", 256),
                             cfg.get("max_image_seq_len", 4096), cfg.get("base_shift", 0.5), cfg.get("max_shift", 1.15))
        sigmas = np.linspace(1.0, 1 / num_steps, num_steps)
        sched.set_timesteps(sigmas=sigmas, device="cpu", mu=mu)
        return sched.sigmas.float().cpu()
