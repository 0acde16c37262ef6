"""Dataclass <-> dict/YAML conversion with type checks, dotted overrides and clear errors.

Dataclasses are the source of truth; YAML is a serialised instance. Every error is a
``ConfigError`` whose one-line message names the offending key and the fix.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from typing import Any, Dict, List, Mapping, Tuple

import yaml

from flowrl.registry import ConfigError, Registry

# A field whose type is a registry-polymorphic section is declared with metadata
# {"registry": REGISTRY}; its value is a dict with a "name" key selecting the config class.


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert ``value`` to annotation ``tp``; raise ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: cannot be null")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {_type_name(tp)} fields, got {value!r}")
        return from_dict(tp, value, prefix=key)
    if origin in (list, List):
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner,) = args or (Any,)
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin in (tuple, Tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if args and args[-1] is not Ellipsis and len(args) != len(value):
            raise ConfigError(f"{key}: expected {len(args)} values, got {len(value)}")
        inner = args if args and args[-1] is not Ellipsis else [args[0] if args else Any] * len(value)
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, inner)))
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-4 (no dot in the mantissa) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a string, got {str(value).lower()} "
                              f"(YAML reads yes/no/on/off as booleans; quote the value)")
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def _unknown_key(cls, key: str, prefix: str) -> ConfigError:
    names = [f.name for f in dataclasses.fields(cls)]
    hint = difflib.get_close_matches(key, names, n=1)
    full = f"{prefix}.{key}" if prefix else key
    extra = f"; did you mean '{hint[0]}'?" if hint else f"; valid keys: {', '.join(names)}"
    return ConfigError(f"{full}: unknown key{extra}")


def from_dict(cls, data: Mapping[str, Any], prefix: str = ""):
    """Build dataclass ``cls`` from a (nested) mapping, checking keys and types."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise _unknown_key(cls, str(key), prefix)
        f = known[key]
        full = f"{prefix}.{key}" if prefix else key
        registry = f.metadata.get("registry")
        if registry is not None and f.metadata.get("many"):
            if not isinstance(value, list):
                raise ConfigError(f"{full}: expected a list of {registry.kind} sections ({{name: ...}})")
            kwargs[key] = [build_section(registry, v, f"{full}[{i}]") for i, v in enumerate(value)]
        elif registry is not None:
            kwargs[key] = None if value is None and f.metadata.get("optional") else build_section(registry, value, full)
        else:
            kwargs[key] = _coerce(value, hints[key], full)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"{prefix + ': ' if prefix and not msg.startswith(prefix) else ''}{msg}") from None


def build_section(registry: Registry, value: Any, key: str):
    """A registry-polymorphic section: {name: X, ...fields of X's config}."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return value
    if isinstance(value, str):
        value = {"name": value}
    if not isinstance(value, Mapping) or "name" not in value:
        raise ConfigError(f"{key}.name: missing; choose one of: {', '.join(registry.names())}")
    entry = registry.get(value["name"], key=f"{key}.name")
    return from_dict(entry.config_cls, value, prefix=key)


def to_dict(obj: Any) -> Any:
    """Dataclass (nested) -> plain dict/list/scalars, suitable for YAML/JSON."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def parse_override(text: str) -> Tuple[List[str], Any]:
    """'a.b.c=value' -> (['a','b','c'], yaml-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"{text}: overrides are key=value (for example max_steps=10)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"{text}: malformed key; use dotted keys like optim.lr=1e-4")
    try:
        value = yaml.safe_load(raw) if raw.strip() != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: Dict[str, Any], overrides: List[str]) -> Dict[str, Any]:
    """Apply dotted ``key=value`` overrides onto a raw nested dict (in place, returned)."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif isinstance(nxt, str) and path[i + 1] != "name":
                nxt = node[part] = {"name": nxt}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"{'.'.join(path[: i + 1])}: is a value, not a section; cannot set {'.'.join(path)}")
            node = nxt
        node[path[-1]] = value
    return data


def load_yaml(path: str) -> Dict[str, Any]:
    """Read a YAML config file into a dict, with one-line errors."""
    if not os.path.isfile(path):
        raise ConfigError(f"{path}: config file not found; pass the path of a YAML config (see configs/)")
    try:
        with open(path, "r", encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: invalid YAML{where}; fix the syntax") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text YAML file") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of keys (seed, output_dir, ...)")
    return data


def field_help(cls) -> Dict[str, str]:
    """{field name: help line} for a config dataclass."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
