"""Data sources: what an iteration trains on.

* ``ItemSource`` (online): lists of train and eval items (prompts, scenes) that
  ``Head.encode`` understands. Rewards receive the same items.
* ``OfflineDataset``: indexed samples (x0 and per-sample columns, e.g. a quality or
  source label) plus the items to condition on.
Iteration order is a pure function of (seed, step): resuming needs only the step.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from flowrl import rng

Tensor = torch.Tensor


class ItemSource:
    def train_items(self) -> Sequence[Any]:
        raise NotImplementedError

    def eval_items(self) -> Sequence[Any]:
        raise NotImplementedError


class OfflineDataset:
    def __len__(self) -> int:
        raise NotImplementedError

    def get(self, indices: Tensor) -> Tuple[List[Any], Tensor, Dict[str, Tensor]]:
        """(items for Head.encode, x0 [B, ...], columns {name: [B]}) for the indices."""
        raise NotImplementedError

    def eval_items(self) -> Sequence[Any]:
        raise NotImplementedError

    # Optional: ``report(output_dir) -> dict`` writes the source's own diagnostics (for
    # example per-sample weight statistics) at the end of a run; the trainer stores the
    # returned dict under ``report.json["data"]``.


def epoch_indices(seed: int, step: int, per_step: int, n: int) -> Tensor:
    """[per_step] dataset indices for ``step``: a fresh permutation every epoch.

    Deterministic in (seed, step), so a resumed run continues exactly where it stopped.
    """
    if n < 1:
        raise ValueError("empty data source")
    start = step * per_step
    out = []
    for pos in range(start, start + per_step):
        epoch, i = divmod(pos, n)
        perm = _perm(seed, epoch, n)
        out.append(int(perm[i]))
    return torch.tensor(out, dtype=torch.long)


_PERM_CACHE: Dict[Tuple[int, int, int], Tensor] = {}


def _perm(seed: int, epoch: int, n: int) -> Tensor:
    key = (seed, epoch, n)
    if key not in _PERM_CACHE:
        if len(_PERM_CACHE) > 8:
            _PERM_CACHE.clear()
        _PERM_CACHE[key] = torch.randperm(n, generator=rng.generator(seed, rng.STREAM_DATA, epoch))
    return _PERM_CACHE[key]
