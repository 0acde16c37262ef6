"""Every example runs as documented (short versions)."""
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("script", ["toy_quickstart.py", "custom_reward.py"])
def test_example_runs(script, tmp_path):
    res = subprocess.run([sys.executable, f"examples/{script}", "--steps", "3", "--output-dir", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert "->" in res.stdout.splitlines()[-1]
    assert (tmp_path / "out" / "report.json").exists()
