"""SD1.5-style UNets (``StableDiffusionPipeline``): epsilon prediction, sampled with DDIM(eta).

The UNet's output is epsilon, so the head declares ``prediction = "epsilon"`` and the
trainer pairs it with ``DDIMSampler`` (sampler.name: ddim), whose Gaussian steps have
exact log-probs (DDPO's construction). flowrl time t maps to the train timestep
tau = round(t * N) - 1 (see ``flowrl.samplers.ddim``); the time grid follows the
pipeline's scheduler (its timesteps and, with ``set_alpha_to_one=False``, a last step
to tau = 0 instead of a clean alpha of 1).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from flowrl.heads.t2i.head import T2IHead

Tensor = torch.Tensor


class SDHead(T2IHead):
    pipeline_class = "StableDiffusionPipeline"
    denoiser_name = "unet"
    default_targets = ("to_q", "to_k", "to_v", "to_out.0")
    prediction = "epsilon"

    def __init__(self, config):
        super().__init__(config)
        from diffusers import DDIMScheduler

        self.ddim = DDIMScheduler.from_config(self.pipe.scheduler.config)
        self.alphas_cumprod = self.ddim.alphas_cumprod.clone()
        self.num_train_timesteps = int(self.ddim.config.num_train_timesteps)

    def load_kwargs(self):
        return {"safety_checker": None, "requires_safety_checker": False}

    def encode_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)
        return {"prompt_embeds": embeds}

    def latent_shape(self):
        side = self.config.resolution // self.pipe.vae_scale_factor
        return (self.denoiser.config.in_channels, side, side)

    def denoise(self, x, t, cond):
        tau = (t.double() * self.num_train_timesteps).round() - 1
        return self.denoiser(x, tau.to(x.device), encoder_hidden_states=cond["prompt_embeds"], return_dict=False)[0]

    def decode_latents(self, x):
        return self.pipe.vae.decode(x / self.pipe.vae.config.scaling_factor, return_dict=False)[0]

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        from diffusers import DDIMScheduler

        sched = DDIMScheduler.from_config(self.pipe.scheduler.config)
        sched.set_timesteps(num_steps)
        taus = sched.timesteps.double()
        n = self.num_train_timesteps
        last = 0.0 if sched.config.set_alpha_to_one else 1.0 / n
        return torch.cat([(taus + 1) / n, torch.tensor([last], dtype=torch.float64)]).float()
