"""What a benchmark's ``--reuse`` must check: that a finished run was trained as asked.

A run folder keeps the ``config.yaml`` it was trained with. Reusing a folder trained with
an earlier recipe (or another lever) would report its numbers under the current name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, List

# keys that do not change the trained weights: where a run was written, how it logged
NOT_TRAINING = frozenset({"output_dir", "overwrite", "resume", "train.progress", "train.tensorboard", "train.curves"})


def flat(d: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": leaf}."""
    out = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def settings_differ(run: Path, config: Path, seed: int, overrides: Iterable[str] = (),
                    ignore: Iterable[str] = (), ignore_prefixes: Iterable[str] = ("eval.",)) -> List[str]:
    """The keys in which ``run/config.yaml`` differs from what ``flowrl train config seed=S
    overrides...`` would run now, leaving out ``NOT_TRAINING``, ``ignore`` and keys under
    ``ignore_prefixes`` (by default the evaluation settings). Register the heads a config
    names (e.g. ``import planners.driving``) before calling."""
    import yaml

    import flowrl.builtins  # noqa: F401  (registers heads, rewards, algorithms)
    from flowrl.config import config_to_dict, load_config

    want = flat(config_to_dict(load_config(str(config), [f"seed={seed}", *overrides])))
    have = flat(yaml.safe_load((Path(run) / "config.yaml").read_text()))
    skip = NOT_TRAINING | set(ignore)
    prefixes = tuple(ignore_prefixes)
    return sorted(k for k in set(want) | set(have)
                  if k not in skip and not k.startswith(prefixes) and want.get(k) != have.get(k))
