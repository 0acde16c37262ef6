"""Deterministic per-sample randomness.

Every random draw of a rollout comes from a generator derived from a tuple of integers
(seed, stream, step, sample id, ...), so a sample's noise does not depend on how many
processes run the batch or where in the batch it sits.
"""
from __future__ import annotations

import hashlib
from typing import List, Sequence

import torch


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from a tuple of integers (stable across runs and platforms)."""
    text = ",".join(str(int(p)) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def generator(*parts: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derive_seed(*parts))
    return g


def generators(base: Sequence[int], ids: Sequence[int], device: str | torch.device = "cpu") -> List[torch.Generator]:
    """One generator per id: ``generator(*base, id)``."""
    return [generator(*base, int(i), device=device) for i in ids]


# stream ids (second element of every seed tuple) so that streams never collide
STREAM_INIT = 1
STREAM_CHAIN = 2
STREAM_SHUFFLE = 3
STREAM_EVAL = 4
STREAM_DATA = 5
STREAM_TIME = 6
