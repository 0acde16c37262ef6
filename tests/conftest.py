"""Shared test set-up: offline, one steady CPU thread, fixed seeds."""
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
os.chdir(ROOT)  # configs/ paths in tests are relative to the repository root


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def run_cli(*args, env=None, timeout=300, launcher=None):
    """Run ``python -m flowrl ARGS`` (or a launcher command) from the repo root."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "FLOWRL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    cmd = (launcher or [sys.executable, "-m", "flowrl"]) + [str(a) for a in args]
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
