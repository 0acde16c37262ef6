"""Prompt sources: a text file (one prompt per line), a JSONL file (one object with a
"prompt" key per line; the other keys are metadata handed to rewards), or lists given in
the config / from Python. Train and eval sets are separate; the trainer shuffles the
train set deterministically per epoch (``flowrl.data.epoch_indices``).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, List, Optional

from flowrl._fields import hfield
from flowrl.data import ItemSource
from flowrl.registry import DATASETS, ConfigError


def read_prompts(path: str, key: str) -> List[Any]:
    """Items of a .txt (strings) or .jsonl (dicts with "prompt") file; one-line errors."""
    if not os.path.isfile(path):
        raise ConfigError(f"{key}: prompt file {path} not found; pass a .txt (one prompt per line) or .jsonl file")
    items: List[Any] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            if path.endswith(".jsonl"):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    raise ConfigError(f"{key}: {path} line {n} is not valid JSON") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
                    raise ConfigError(f"{key}: {path} line {n} needs a string \"prompt\" key")
                items.append(obj)
            else:
                items.append(line)
    if not items:
        raise ConfigError(f"{key}: {path} holds no prompts")
    return items


@dataclass
class PromptsConfig:
    """Train and eval prompts."""

    name: str = hfield("prompts", "data source name")
    train: Optional[str] = hfield(None, "training prompts: .txt (one per line) or .jsonl (objects with a prompt key)")
    eval: Optional[str] = hfield(None, "held-out evaluation prompts, same formats")
    train_prompts: List[str] = hfield(default_factory=list, help="training prompts given inline (instead of a file)")
    eval_prompts: List[str] = hfield(default_factory=list, help="evaluation prompts given inline")

    def __post_init__(self) -> None:
        if not self.train and not self.train_prompts:
            raise ValueError("data.train: set a prompt file or data.train_prompts")
        if not self.eval and not self.eval_prompts:
            raise ValueError("data.eval: set a held-out prompt file or data.eval_prompts")


class Prompts(ItemSource):
    def __init__(self, config: PromptsConfig):
        self._train = read_prompts(config.train, "data.train") if config.train else list(config.train_prompts)
        self._eval = read_prompts(config.eval, "data.eval") if config.eval else list(config.eval_prompts)

    def train_items(self):
        return self._train

    def eval_items(self):
        return self._eval


DATASETS.register("prompts", PromptsConfig, help="text prompts from .txt/.jsonl files or inline lists")(Prompts)
