"""Under DDP (two CPU ranks) a LoRA'd diffusers transformer, and a fully fine-tuned channels-last UNet,
train as in one process."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from flowrl.heads.t2i.tiny import build_tiny_sd
from tests.conftest import run_cli
from tests.t2i.test_t2i_training import tiny_overrides

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("family, head", [
    ("sd3", []),
    ("sd", ["head.family=sd", "head.lora_rank=0", "head.channels_last=true", "algorithm.kl_beta=0"]),  # NHWC grads
])
def test_two_ranks_match_one_rank(tiny_pipelines, tmp_path, family, head):
    common = ["configs/t2i/sd35m_flow_grpo.yaml", "algorithm.group_size=2", "train.micro_batch_size=2"]
    one, two = tmp_path / "one", tmp_path / "two"
    path = tiny_pipelines["sd3"] if family == "sd3" else build_tiny_sd(str(tmp_path / "flow_unet"), flow=True)
    res = run_cli("train", *common, *tiny_overrides(path, one), *head)
    assert res.returncode == 0, res.stderr[-3000:]
    launcher = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "flowrl.cli"]
    res = run_cli("train", *common, *tiny_overrides(path, two), *head, launcher=launcher,
                  env={"ACCELERATE_USE_CPU": "true"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 process(es)" in res.stdout
    rows = [[json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (one, two)]
    assert len(rows[0]) == len(rows[1]) == 4  # 2 iterations x 2 minibatches (the recipe's num_minibatches)
    for a, b in zip(*rows):
        for key in ("loss", "grad_norm", "reward/total", "policy/ratio"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key
    # the evaluation grid holds every rank's images, in the same order as one process
    for name in ("before.png", "after.png"):
        g1 = np.asarray(Image.open(one / "samples" / name), dtype=np.int16)
        g2 = np.asarray(Image.open(two / "samples" / name), dtype=np.int16)
        assert g1.shape == g2.shape and np.abs(g1 - g2).max() <= 1
