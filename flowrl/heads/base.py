"""The Head contract: what the engine needs from any model it post-trains.

A head wraps one kind of model (a diffusers pipeline, a driving planner, a robot action
head). The trainer calls only the methods below, so it never learns the modality.

Time convention: flowrl's (see ``flowrl.types``): t = 1 noise, t = 0 data. A head whose
model expects another timestep convention converts inside ``velocity``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

Tensor = torch.Tensor


class Head(nn.Module):
    """Base class for heads. ``forward`` is ``velocity`` so distributed wrappers work.

    Class attributes:
      prediction: "velocity" (flow matching) or "epsilon" (DDPM-style); samplers and
                  offline losses check it.
      event_ndim: trailing dims of one agent's action in x (None = whole sample). A
                  multi-agent head with x [B, A, H, 2] sets 2, so log-probs are [B, A].
    """

    prediction: str = "velocity"
    event_ndim: Optional[int] = None

    # --- the contract ---------------------------------------------------------------
    def encode(self, batch: Sequence[Any]) -> Dict[str, Tensor]:
        """Conditioning for a batch of items (prompts, scenes, observations); no grad.

        Returns a dict of [B, ...] tensors (gathered across processes by the trainer).
        """
        raise NotImplementedError

    def init_noise(self, cond: Dict[str, Tensor], generators: Sequence[torch.Generator]) -> Tensor:
        """[B, ...] initial noise, sample i drawn from ``generators[i]``."""
        raise NotImplementedError

    def velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        """[B, ...] model output at (x [B, ...], t [B]); the one differentiable call."""
        raise NotImplementedError

    def reference_velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        """Model output of the reference (starting) policy, for KL terms; no grad.

        Heads implement it from the same weights (disabled adapter) or a frozen copy of
        the small trainable part; never from a second full model.
        """
        raise NotImplementedError(f"{type(self).__name__} has no reference policy; set the KL weight to 0")

    def decode(self, x: Tensor, cond: Dict[str, Tensor]) -> Any:
        """Final states -> what rewards consume (images, trajectories, actions)."""
        return x

    def trainable_parameters(self) -> List[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> Dict[str, Tensor]:
        """The tensors a checkpoint must hold to restore training (trainable params)."""
        names = {id(p) for p in self.trainable_parameters()}
        return {k: v.detach() for k, v in self.named_parameters() if id(v) in names}

    def load_trainable_state_dict(self, state: Dict[str, Tensor]) -> None:
        params = dict(self.named_parameters())
        missing = [k for k in self.trainable_state_dict() if k not in state]
        if missing:
            raise ValueError(f"checkpoint lacks trainable tensors: {missing[:3]}")
        with torch.no_grad():
            for k, v in state.items():
                params[k].copy_(v)

    def save_pretrained(self, directory: str) -> None:
        """Write the policy so that ``from_pretrained`` (or the model's own library) loads it."""
        raise NotImplementedError

    # --- distributed wrappers call forward ------------------------------------------
    def forward(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:  # noqa: D401
        return self.velocity(x, t, cond)
