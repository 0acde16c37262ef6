"""Stable Diffusion 3 / 3.5 (``StableDiffusion3Pipeline``): flow matching, shifted sigmas.

The transformer takes timestep = 1000 * t (its scheduler's sigmas scaled by
``num_train_timesteps``) and predicts the velocity eps - x0, which is flowrl's
convention already.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from flowrl.heads.t2i.head import T2IHead

Tensor = torch.Tensor


class SD3Head(T2IHead):
    pipeline_class = "StableDiffusion3Pipeline"
    denoiser_name = "transformer"
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")

    def encode_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        embeds, _, pooled, _ = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, prompt_3=prompts, device=self.device, do_classifier_free_guidance=False,
            max_sequence_length=self.config.max_sequence_length)
        return {"prompt_embeds": embeds, "pooled": pooled}

    def latent_shape(self):
        side = self.config.resolution // self.pipe.vae_scale_factor
        return (self.denoiser.config.in_channels, side, side)

    def denoise(self, x, t, cond):
        timestep = (t * self.pipe.scheduler.config.num_train_timesteps).to(x.device, x.dtype)
        return self.denoiser(hidden_states=x, timestep=timestep, encoder_hidden_states=cond["prompt_embeds"],
                             pooled_projections=cond["pooled"], return_dict=False)[0]

    def decode_latents(self, x):
        vae = self.pipe.vae
        x = x / vae.config.scaling_factor + vae.config.shift_factor
        return vae.decode(x, return_dict=False)[0]

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        from diffusers import FlowMatchEulerDiscreteScheduler

        sched = FlowMatchEulerDiscreteScheduler.from_config(self.pipe.scheduler.config)
        kwargs = {}
        if sched.config.get("use_dynamic_shifting", False):
            from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift

            side = self.latent_shape()[1] // self.denoiser.config.patch_size
            kwargs["mu"] = calculate_shift(side * side, sched.config.get("base_image_seq_len", 256),
                                           sched.config.get("max_image_seq_len", 4096),
                                           sched.config.get("base_shift", 0.5), sched.config.get("max_shift", 1.16))
        sched.set_timesteps(num_steps, device="cpu", **kwargs)
        return sched.sigmas.float().cpu()
