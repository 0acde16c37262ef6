"""Dataclass field helper: every config field carries a one-line help text."""
from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any


def hfield(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING, **meta: Any) -> Any:
    """A dataclass field with ``metadata["help"]`` (shown by ``flowrl validate --keys``).

    Extra keyword arguments go to the metadata (``registry=``, ``many=``, ``optional=``
    mark registry-polymorphic sections for the config loader).
    """
    if not help:
        raise ValueError("every config field needs a help line")
    metadata = {"help": help, **meta}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)
