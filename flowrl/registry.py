"""Name -> (config class, builder) registries for the pluggable parts of a run.

Heads, algorithms, rewards, prompt/data sources and environments register here, and a
config section picks one with its ``name`` key. The trainer only ever sees the built
objects, so it never learns which modality it trains.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Type


class ConfigError(ValueError):
    """A user mistake in a config or on the command line (the CLI exits with code 2)."""


@dataclass(frozen=True)
class Entry:
    config_cls: Type
    builder: Callable[..., Any]
    help: str


class Registry:
    """A small named registry. ``register(name, config_cls, help)`` decorates a builder."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: Dict[str, Entry] = {}

    def register(self, name: str, config_cls: Type, help: str = ""):
        def deco(builder):
            if name in self._entries:
                raise KeyError(f"{self.kind} '{name}' registered twice")
            self._entries[name] = Entry(config_cls, builder, help)
            return builder

        return deco

    def names(self):
        return sorted(self._entries)

    def get(self, name: str, key: str = "name") -> Entry:
        if name not in self._entries:
            hint = difflib.get_close_matches(str(name), self.names(), n=1)
            extra = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise ConfigError(
                f"{key}: unknown {self.kind} '{name}'{extra}; choose one of: {', '.join(self.names())}"
            )
        return self._entries[name]

    def __contains__(self, name: str) -> bool:
        return name in self._entries


HEADS = Registry("head")
ALGORITHMS = Registry("algorithm")
DATASETS = Registry("data source")
ENVIRONMENTS = Registry("environment")
