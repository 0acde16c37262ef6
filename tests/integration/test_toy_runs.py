"""End-to-end toy runs through `flowrl train`: learning, resume, two processes."""
import json
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _rows(out: Path) -> list:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith("perf/")}


@pytest.mark.parametrize("name", ["fdfo", "flow_grpo", "dance_grpo", "vg_grpo", "offline_weighted"])
def test_toy_config_moves_samples_into_favoured_mode(name, tmp_path):
    out = tmp_path / name
    t0 = time.perf_counter()
    res = run_cli("train", f"configs/toy/{name}.yaml", f"output_dir={out}", "train.progress=false")
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    report = _report(out)
    before, after = report["before"]["toy_mode_fraction"], report["after"]["toy_mode_fraction"]
    assert 0.4 <= before <= 0.6, report
    assert after >= 0.8, report
    assert elapsed < 60, f"{name} took {elapsed:.1f} s"
    # the run's folder layout is the documented contract
    for f in ("config.yaml", "metrics.jsonl", "final/trainable.safetensors", "final/model.safetensors"):
        assert (out / f).exists(), f
    steps = [r["step"] for r in _rows(out)]
    assert steps == list(range(1, len(steps) + 1))
    assert any(p.name.startswith("step-") for p in (out / "checkpoints").iterdir())


@pytest.mark.parametrize("name", ["vg_grpo", "fdfo", "offline_weighted"])
def test_resume_reproduces_uninterrupted_run(name, tmp_path):
    common = [f"configs/toy/{name}.yaml", "train.progress=false", "train.ema_decay=0.9", "train.tensorboard=false"]
    full, part = tmp_path / "full", tmp_path / "part"
    assert run_cli("train", *common, f"output_dir={full}", "max_steps=4").returncode == 0
    assert run_cli("train", *common, f"output_dir={part}", "max_steps=2").returncode == 0
    res = run_cli("train", *common, f"output_dir={part}", "max_steps=4", "resume=true")
    assert res.returncode == 0, res.stderr[-2000:]
    a, b = _rows(full), _rows(part)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    assert [_strip(r) for r in a] == [_strip(r) for r in b]
    assert _report(full) == _report(part)


def test_resume_after_a_killed_checkpoint_write_uses_the_last_complete_one(tmp_path):
    out = tmp_path / "run"
    common = ["configs/toy/flow_grpo.yaml", "train.progress=false", f"output_dir={out}", "train.tensorboard=false"]
    assert run_cli("train", *common, "max_steps=2").returncode == 0
    # a write killed half-way leaves only a hidden temporary folder
    tmp = out / "checkpoints" / ".tmp-step-3-999"
    shutil.copytree(out / "checkpoints" / "step-2", tmp)
    (tmp / "trainer_state.json").unlink()
    res = run_cli("train", *common, "max_steps=3", "resume=true")
    assert res.returncode == 0, res.stderr[-2000:]
    assert [r["step"] for r in _rows(out)] == [1, 2, 3]


def test_two_processes_match_one_process(tmp_path):
    common = ["configs/toy/flow_grpo.yaml", "train.progress=false", "max_steps=3", "train.tensorboard=false"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert run_cli("train", *common, f"output_dir={one}").returncode == 0
    launcher = [str(Path(sys.executable).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "flowrl.cli"]
    res = run_cli("train", *common, f"output_dir={two}", launcher=launcher, env={"ACCELERATE_USE_CPU": "true"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert "2 process(es)" in res.stdout
    state = json.loads((two / "checkpoints" / "step-3" / "trainer_state.json").read_text())
    assert state["world_size"] == 2
    a, b = _rows(one), _rows(two)
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        for k, v in _strip(ra).items():
            if isinstance(v, float):
                assert rb[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
            else:
                assert rb[k] == v, k
    assert _report(two)["after"] == pytest.approx(_report(one)["after"], rel=1e-4)


def test_closed_loop_two_layer_run_improves_return(tmp_path):
    out = tmp_path / "cl"
    res = run_cli("train", "configs/toy/closed_loop.yaml", f"output_dir={out}", "train.progress=false")
    assert res.returncode == 0, res.stderr[-2000:]
    report = _report(out)
    assert report["after"]["return"] > report["before"]["return"] + 0.3, report



def test_gradient_accumulation_and_bf16_autocast(tmp_path):
    common = ["configs/toy/flow_grpo.yaml", "train.progress=false", "max_steps=2", "train.tensorboard=false"]
    runs = {}
    for name, extra in {"plain": [], "micro": ["train.micro_batch_size=100"], "bf16": ["train.mixed_precision=bf16"]}.items():
        res = run_cli("train", *common, f"output_dir={tmp_path / name}", *extra)
        assert res.returncode == 0, res.stderr[-2000:]
        runs[name] = _rows(tmp_path / name)
    # accumulating 7 micro-batches gives the same gradient as one pass
    for a, b in zip(runs["plain"], runs["micro"]):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["reward/total"] == pytest.approx(a["reward/total"], rel=1e-5)
    # rollout and update run under the same autocast, so the first update is exactly on-policy
    first = runs["bf16"][0]
    assert first["policy/ratio"] == pytest.approx(1.0, abs=1e-6) and first["policy/clipfrac"] == 0.0


@pytest.mark.parametrize("config", ["configs/toy/flow_grpo.yaml", "configs/toy/closed_loop.yaml"])
def test_ode_outside_window_updates_on_policy(tmp_path, config):
    # MixGRPO's mixed sampling: only the 3 window steps are noisy; the recorded log-probs of
    # the trained steps must be the ones the update recomputes (first ratio exactly 1)
    out = tmp_path / "mix"
    res = run_cli("train", config, f"output_dir={out}", "train.progress=false", "train.tensorboard=false",
                  "max_steps=2", "chain.ode_outside_window=true", "chain.train_window_start=2",
                  "chain.train_window_size=3")
    assert res.returncode == 0, res.stderr[-2000:]
    first = _rows(out)[0]
    assert first["policy/ratio"] == pytest.approx(1.0, abs=1e-6) and first["policy/clipfrac"] == 0.0


def test_sample_and_eval_see_the_same_samples(tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    common = ["configs/toy/fdfo.yaml", "train.progress=false", "train.tensorboard=false"]
    assert run_cli("train", *common, f"output_dir={out}", "max_steps=5").returncode == 0
    res = run_cli("sample", *common, f"checkpoint={out / 'final'}", f"output_dir={tmp_path / 's'}")
    assert res.returncode == 0, res.stderr[-2000:]
    final = load_file(str(tmp_path / "s" / "samples.safetensors"))["final"]
    assert final.shape == (16 * 16, 2)
    fraction = float((final[:, 0] > 0).float().mean())
    assert fraction == pytest.approx(_report(out)["after"]["toy_mode_fraction"], abs=1e-9)
