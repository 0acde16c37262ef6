"""Exponential moving average of the trainable tensors."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Dict, Iterator, List

import torch
from torch import nn


class EMA:
    """shadow <- decay * shadow + (1 - decay) * param, after every optimizer step."""

    def __init__(self, named: Dict[str, nn.Parameter], decay: float):
        self.decay = decay
        self.params = named
        self.shadow = {k: p.detach().clone().float() for k, p in named.items()}

    @torch.no_grad()
    def update(self) -> None:
        for k, p in self.params.items():
            self.shadow[k].lerp_(p.detach().float(), 1 - self.decay)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        for k in self.shadow:
            self.shadow[k].copy_(state[k])

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Temporarily swap the EMA weights into the model."""
        backup: List[torch.Tensor] = []
        with torch.no_grad():
            for k, p in self.params.items():
                backup.append(p.detach().clone())
                p.copy_(self.shadow[k].to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for (k, p), b in zip(self.params.items(), backup):
                    p.copy_(b)
