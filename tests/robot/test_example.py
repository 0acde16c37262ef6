"""examples/robot_offline_adaptation.py at a tiny budget: every method runs and reports."""
import importlib.util
import os

import torch

torch.set_num_threads(1)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_example_runs_all_methods(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("robot_example", os.path.join(ROOT, "examples", "robot_offline_adaptation.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--steps", "3", "--num-eval", "1", "--episodes", "12", "--max-steps", "30",
                     "--cache-dir", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
                     "--set", "data.episodes_per_task=1", "data.weighting.scorer_steps=20", "data.weighting.k=4",
                     "data.weighting.neighbours=4", "data.weighting.knn=4", "train.batch_size=32", "chain.num_steps=2"])
    assert [r["method"] for r in rows] == list(mod.METHODS)
    assert all(0.0 <= r["after_success"] <= 1.0 for r in rows)
    assert rows[[r["method"] for r in rows].index("oracle")]["auroc_clean_vs_corrupted"] == 1.0
    assert "after_success" in capsys.readouterr().out
    assert os.path.isfile(tmp_path / "out" / "comparison.json")
