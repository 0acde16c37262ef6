"""configs/robot/ci.yaml end to end, twice: MetaWorld data generation, PTR scorer fit on
clean pretraining data, weighted adaptation of the committed head, closed-loop evaluation.
Asserts determinism (identical weights, final weights and metrics) and weight statistics,
not success margins."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from planners.robot.runner import run

torch.set_num_threads(1)
TIMING = ("weights/compute_s", "scorer/total_s", "scorer/fit_s", "scorer/cached", "scorer/final_loss")


def test_ci_config_is_deterministic_and_weights_are_sane(tmp_path):
    cache = str(tmp_path / "data")
    res = []
    for name in ("a", "b"):   # run a generates data and fits the scorer; run b reads both from the cache
        out = str(tmp_path / name)
        res.append(run("configs/robot/ci.yaml", [f"output_dir={out}", f"data.cache_dir={cache}"]))
    a, b = res
    assert a["before"] == b["before"] and a["after"] == b["after"]
    assert {"success", "return"} <= set(a["after"])
    wa, wb = load_file(str(tmp_path / "a/final/model.safetensors")), load_file(str(tmp_path / "b/final/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    d = a["weights"]
    assert {k: v for k, v in d.items() if k not in TIMING} == {k: v for k, v in b["weights"].items() if k not in TIMING}
    # weight statistics
    assert d["weights/method"] == "ptr"
    assert d["weights/ess"] == pytest.approx(0.3, abs=0.02)                 # the ess calibration's target
    masses = [v for k, v in d.items() if k.startswith("weights/mass/")]
    assert sum(masses) == pytest.approx(1.0, abs=1e-5)
    assert 0.0 <= d["weights/auroc_clean_vs_corrupted"] <= 1.0 and 0.0 <= d["scorer/acc_full"] <= 1.0
    assert os.path.isfile(tmp_path / "a/weight_mass.png")
    assert json.load(open(tmp_path / "a/report.json"))["data"]["weights/method"] == "ptr"
