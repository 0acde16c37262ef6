"""Tiny diffusers pipelines (one per family), built once per test session."""
import pytest

from flowrl.heads.t2i.tiny import BUILDERS

FAMILIES = ["sd3", "flux", "sd"]


@pytest.fixture(scope="session")
def tiny_pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_pipelines")
    return {fam: BUILDERS[fam](str(root / fam)) for fam in FAMILIES}


def head_config(family, path, **kw):
    from flowrl.heads.t2i import T2IHeadConfig

    base = dict(family=family, path=path, resolution=32, max_sequence_length=16, lora_rank=4, lora_alpha=8)
    base.update(kw)
    return T2IHeadConfig(**base)
