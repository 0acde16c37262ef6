"""Text-to-image head over diffusers pipelines; ``head.family`` picks the adapter."""
from __future__ import annotations

from typing import Dict, Type

from flowrl.registry import HEADS


def _families() -> Dict[str, str]:
    return {"sd3": "flowrl.heads.t2i.sd3:SD3Head", "flux": "flowrl.heads.t2i.flux:FluxHead",
            "sd": "flowrl.heads.t2i.sd:SDHead"}


FAMILIES = _families()


def family_class(name: str) -> Type:
    import importlib

    module, cls = FAMILIES[name].split(":")
    return getattr(importlib.import_module(module), cls)


from flowrl.heads.t2i import prompts  # noqa: E402,F401  (registers the prompt source)
from flowrl.heads.t2i.head import T2IHead, T2IHeadConfig  # noqa: E402


@HEADS.register("t2i", T2IHeadConfig, help="diffusers text-to-image pipeline (sd3, flux, sd families)")
def build_t2i_head(config: T2IHeadConfig) -> T2IHead:
    return family_class(config.family)(config)


__all__ = ["T2IHead", "T2IHeadConfig", "FAMILIES", "family_class"]
