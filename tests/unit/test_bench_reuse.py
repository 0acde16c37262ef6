"""A benchmark's --reuse reads a finished run only if it was trained as the benchmark would
train it now (tests/benchmarks/reuse.py), so an earlier recipe's numbers cannot pass as the
current one's."""
import subprocess
import sys

import yaml

import flowrl.builtins  # noqa: F401
from flowrl.config import config_to_dict, load_config
from tests.benchmarks.reuse import settings_differ
from tests.conftest import ROOT

CONFIG = f"{ROOT}/configs/t2i/shapes_fdfo.yaml"


def _finished_run(folder, overrides):
    folder.mkdir(parents=True)
    cfg = config_to_dict(load_config(CONFIG, overrides))
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / "report.json").write_text("{}")
    return folder


def test_settings_differ_names_training_keys_and_ignores_where_and_how_a_run_was_evaluated(tmp_path):
    run = _finished_run(tmp_path / "run", ["seed=0", f"output_dir={tmp_path}/elsewhere", "eval.num_items=12",
                                           "train.progress=false"])
    assert settings_differ(run, CONFIG, 0) == []
    assert settings_differ(run, CONFIG, 1) == ["seed"]
    assert settings_differ(run, CONFIG, 0, ["optim.lr=5e-3", "head.lora_rank=4"]) == ["head.lora_rank", "optim.lr"]


def test_bench_shapes_refuses_to_reuse_a_run_trained_otherwise(tmp_path):
    _finished_run(tmp_path / "bench" / "fdfo-0", ["seed=0", "optim.lr=5e-3"])
    res = subprocess.run([sys.executable, f"{ROOT}/tests/benchmarks/bench_shapes.py", "--reuse", "--algorithms", "fdfo",
                          "--seeds", "0", "--out", str(tmp_path / "bench.json")], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    assert "fdfo-0 was trained with other settings (optim.lr)" in res.stderr
    assert "Traceback" not in res.stderr
