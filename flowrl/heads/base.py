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

    @property
    def has_reference(self) -> bool:
        """Whether ``reference_velocity`` works for this head as configured."""
        return type(self).reference_velocity is not Head.reference_velocity

    @property
    def reference_hint(self) -> str:
        """Why ``has_reference`` is False and how the user gets one (shown in the start-up error)."""
        return "this head implements no reference policy"

    def reference_velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        """Model output of the reference (starting) policy, for KL terms; no grad.

        Heads implement it from the same weights (disabled adapter) or a frozen copy of
        the small trainable part; never from a second full model.
        """
        raise NotImplementedError(f"{type(self).__name__} has no reference policy; set the KL weight to 0")

    def decode(self, x: Tensor, cond: Dict[str, Tensor]) -> Any:
        """Final states -> what rewards consume (images, trajectories, actions)."""
        return x

    def time_grid(self, num_steps: int) -> Optional[Tensor]:
        """[K+1] times (1 -> end) of the model's own scheduler, or None for a uniform grid."""
        return None

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


def check_head_contract(head: Head, items: Sequence[Any], tmp_dir: Optional[str] = None) -> None:
    """Assert the Head contract on ``items``; every head's tests call this (shared suite).

    Checks: encode gives [B, ...] tensors without grad; init_noise is per-sample
    deterministic (sample i depends only on generator i); velocity keeps x's shape and is
    differentiable w.r.t. the trainable parameters; reference_velocity (if any) carries no
    grad and equals velocity before training; train/eval mode is eval; save_pretrained
    writes something when a folder is given.
    """
    import os

    b = len(items)
    assert not head.training, "heads must be in eval mode (dropout off); call .eval()"
    cond = head.encode(items)
    assert isinstance(cond, dict) and cond, "encode must return a non-empty dict of tensors"
    for k, v in cond.items():
        assert isinstance(v, torch.Tensor) and v.shape[0] == b, f"cond[{k!r}] must be a [B, ...] tensor"
        assert not v.requires_grad, f"cond[{k!r}] must carry no grad"
    gens = [torch.Generator().manual_seed(100 + i) for i in range(b)]
    x = head.init_noise(cond, gens)
    assert x.shape[0] == b
    solo = head.init_noise({k: v[1:2] for k, v in cond.items()}, [torch.Generator().manual_seed(101)])
    assert torch.equal(solo[0], x[1]), "init_noise of sample i must depend only on generator i"
    t = torch.full((b,), 0.5)
    v = head.velocity(x, t, cond)
    assert v.shape == x.shape, "velocity must keep x's shape"
    params = head.trainable_parameters()
    assert params, "a head must expose trainable parameters"
    v.float().pow(2).mean().backward()
    assert any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in params), "velocity must be differentiable"
    for p in params:
        p.grad = None
    try:
        ref = head.reference_velocity(x, t, cond)
    except NotImplementedError:
        ref = None
    assert (ref is not None) == head.has_reference, "has_reference must say whether reference_velocity works"
    assert head.has_reference or (isinstance(head.reference_hint, str) and head.reference_hint), \
        "a head without a reference must say why in reference_hint"
    if ref is not None:
        assert not ref.requires_grad, "reference_velocity must carry no grad"
        assert torch.allclose(ref, v.detach(), atol=1e-5), "before training the reference equals the policy"
    if tmp_dir is not None:
        head.save_pretrained(tmp_dir)
        assert os.listdir(tmp_dir), "save_pretrained wrote nothing"
