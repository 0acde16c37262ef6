"""SD1.5-style UNets (``StableDiffusionPipeline``): epsilon/DDIM, or velocity when the
pipeline's scheduler is a flow-matching one.

- The usual case, a DDPM-trained UNet whose output is epsilon: the head declares
  ``prediction = "epsilon"`` and the trainer pairs it with ``DDIMSampler`` (sampler.name:
  ddim), whose Gaussian steps have exact log-probs (DDPO's construction). flowrl time t maps
  to the train timestep tau = round(t * N) - 1 (see ``flowrl.samplers.ddim``); the time grid
  follows the pipeline's scheduler (its timesteps and, with ``set_alpha_to_one=False``, a
  last step to tau = 0 instead of a clean alpha of 1).
- A UNet trained with rectified flow (the pipeline folder names a
  ``FlowMatchEulerDiscreteScheduler``, as the shapes world's model does): the UNet predicts
  the velocity eps - x0 at timestep N t, exactly like SD3's transformer, so the head declares
  ``prediction = "velocity"`` and every flow sampler (ODE, SDE, churn) and FDFO apply; the
  time grid is the scheduler's (shifted) sigmas.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch

from flowrl.heads.t2i.head import T2IHead

Tensor = torch.Tensor


def is_flow_scheduler(scheduler) -> bool:
    """True for diffusers' flow-matching schedulers (``FlowMatch*``), whose models predict velocity."""
    return type(scheduler).__name__.startswith("FlowMatch")


class SDHead(T2IHead):
    pipeline_class = "StableDiffusionPipeline"
    denoiser_name = "unet"
    default_targets = ("to_q", "to_k", "to_v", "to_out.0")
    prediction = "epsilon"
    text_encoder_targets = ("q_proj", "k_proj", "v_proj", "out_proj")

    def __init__(self, config):
        super().__init__(config)
        self.num_train_timesteps = int(self.pipe.scheduler.config.num_train_timesteps)
        if is_flow_scheduler(self.pipe.scheduler):
            self.prediction = "velocity"
        else:
            from diffusers import DDIMScheduler

            self.alphas_cumprod = DDIMScheduler.from_config(self.pipe.scheduler.config).alphas_cumprod.clone()

    def load_kwargs(self):
        return {"safety_checker": None, "requires_safety_checker": False}

    def encode_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        embeds, _ = self.pipe.encode_prompt(prompts, self.device, 1, False)
        return {"prompt_embeds": embeds}

    def tokenize_prompts(self, prompts: List[str]) -> Dict[str, Tensor]:
        tok = self.pipe.tokenizer
        out = tok(prompts, padding="max_length", max_length=tok.model_max_length, truncation=True, return_tensors="pt")
        masked = getattr(self.pipe.text_encoder.config, "use_attention_mask", False)
        return {"input_ids": out.input_ids, **({"attention_mask": out.attention_mask} if masked else {})}

    def embed_tokens(self, tokens: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """As ``encode_prompt`` without clip skip: the last hidden state of the text encoder."""
        hidden = self.text_encoder(tokens["input_ids"], attention_mask=tokens.get("attention_mask"))[0]
        return {"prompt_embeds": hidden.to(self.dtype)}

    def latent_shape(self):
        side = self.config.resolution // self.pipe.vae_scale_factor
        return (self.denoiser.config.in_channels, side, side)

    def denoise(self, x, t, cond):
        if self.prediction == "velocity":
            tau = (t * self.num_train_timesteps).to(x.device, x.dtype)
        else:
            tau = ((t.double() * self.num_train_timesteps).round() - 1).to(x.device)
        return self.denoiser(x, tau, encoder_hidden_states=cond["prompt_embeds"], return_dict=False)[0]

    def decode_latents(self, x):
        vae = self.pipe.vae
        shift = getattr(vae.config, "shift_factor", None) or 0.0
        return vae.decode(x / vae.config.scaling_factor + shift, return_dict=False)[0]

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        if self.prediction == "velocity":
            from diffusers import FlowMatchEulerDiscreteScheduler

            sched = FlowMatchEulerDiscreteScheduler.from_config(self.pipe.scheduler.config)
            sched.set_timesteps(num_steps, device="cpu")
            return sched.sigmas.float().cpu()
        from diffusers import DDIMScheduler

        sched = DDIMScheduler.from_config(self.pipe.scheduler.config)
        sched.set_timesteps(num_steps)
        taus = sched.timesteps.double()
        n = self.num_train_timesteps
        last = 0.0 if sched.config.set_alpha_to_one else 1.0 / n
        return torch.cat([(taus + 1) / n, torch.tensor([last], dtype=torch.float64)]).float()
