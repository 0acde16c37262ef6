import pytest
from accelerate.commands.config.config_args import load_config_from_file


@pytest.mark.parametrize("name, kind", [("single_gpu", "NO"), ("ddp", "MULTI_GPU"), ("fsdp", "FSDP"),
                                        ("deepspeed_zero2", "DEEPSPEED")])
def test_accelerate_config_parses(name, kind):
    cfg = load_config_from_file(f"configs/accelerate/{name}.yaml")
    assert cfg.distributed_type.value == kind
