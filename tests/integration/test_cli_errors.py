"""Command-line error contract, end to end through ``python -m flowrl``.

Contract: a user mistake (missing file, bad YAML, unknown key, wrong type, invalid
combination, malformed override, missing checkpoint or weights, reused output_dir)
exits with code 2 and prints exactly ONE line on stderr, starting ``flowrl: error:``,
that names the offending key and the fix, with no traceback; and a failed start never
touches the files of an existing output_dir.

Every subprocess pays ~2-3 s of imports, so the independent cases (the error table and
the validate checks) run concurrently in one module-scoped batch, and the run-based
cases share one tiny real training run.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "configs" / "toy"
FLOW = "configs/toy/flow_grpo.yaml"
FDFO = "configs/toy/fdfo.yaml"
TINY = ["max_steps=1", "train.prompts_per_step=2", "eval.num_items=2", "eval.samples_per_item=2",
        "head.pretrain_steps=50"]
TINY_EVAL = ["eval.num_items=2", "eval.samples_per_item=2", "head.pretrain_steps=50"]
EVAL_KEYS = {"toy_mode", "toy_mode_fraction"}
REQUIRED = ("seed", "output_dir", "max_steps", "resume")
CPS_TO_ZERO = ["sampler={name: cps, eta: 0.5}", "chain.num_steps=10"]  # CPS's last step has no noise
TOY_CONFIGS = sorted(p.name for p in TOY.glob("*.yaml"))
ALGORITHMS = ("fdfo", "flow_grpo", "dance_grpo", "vg_grpo", "flow_matching")
TIMEOUT_S = 180


def _env() -> Dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["FLOWRL_NUM_THREADS"] = "1"
    return env


def run_cli(*args: str, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flowrl", *args], cwd=str(ROOT), env=_env(),
                          capture_output=True, text=True, timeout=timeout)


def _detail(proc: subprocess.CompletedProcess) -> str:
    return (f"\nargv: {proc.args}\nrc={proc.returncode}\n--- stderr ---\n{proc.stderr}"
            f"\n--- stdout (tail) ---\n{proc.stdout[-2000:]}")


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """rc 2, exactly one stderr line starting 'flowrl: error:', no traceback, names ``needles``."""
    d = _detail(proc)
    assert "Traceback" not in proc.stderr, "traceback on stderr" + d
    assert proc.returncode == 2, "exit code is not 2" + d
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}" + d
    line = lines[0]
    assert line.startswith("flowrl: error:"), "stderr line does not start with 'flowrl: error:'" + d
    for n in needles:
        assert n in line, f"{n!r} not in the error line" + d
    return line


def snapshot(directory: Path) -> Dict[str, bytes]:
    """{relative path: bytes} of every file under ``directory``."""
    return {p.relative_to(directory).as_posix(): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- the table
# (id, argv with {tmp} standing for the module's scratch folder, substrings of the error line:
#  the offending key first, then something that says the fix)
ERROR_CASES: List[Tuple[str, List[str], Tuple[str, ...]]] = [
    ("config-file-missing", ["validate", "{tmp}/nope.yaml"], ("nope.yaml", "not found")),
    ("yaml-syntax-error", ["validate", "{tmp}/broken.yaml"], ("broken.yaml", "invalid YAML")),
    ("top-level-not-mapping", ["validate", "{tmp}/list.yaml"], ("list.yaml", "mapping")),
    *[(f"missing-required-{k}", ["validate", f"{{tmp}}/no_{k}.yaml"], (f"{k}:", "required"))
      for k in REQUIRED],
    ("unknown-top-level-key-near-miss", ["validate", FLOW, "max_step=3"], ("max_step:", "'max_steps'")),
    ("unknown-nested-key", ["validate", FLOW, "optim.lrr=1"], ("optim.lrr", "'lr'")),
    ("wrong-type-int", ["validate", FLOW, "max_steps=abc"], ("max_steps", "integer")),
    ("wrong-type-float-list", ["validate", FLOW, "optim.lr=[1]"], ("optim.lr", "number")),
    ("wrong-type-bool", ["validate", FLOW, "resume=maybe"], ("resume", "true or false")),
    ("unknown-algorithm", ["validate", FLOW, "algorithm.name=ppo"], ("algorithm.name", "ppo", "flow_grpo")),
    ("unknown-head", ["validate", FLOW, "head.name=nohead"], ("head.name", "nohead", "toy")),
    ("unknown-reward", ["validate", FLOW, "rewards=[{name: noreward}]"], ("rewards[0].name", "noreward", "toy_mode")),
    ("flow_grpo-with-euler", ["validate", FLOW, "sampler.name=euler"], ("sampler.name", "flow_sde")),
    ("fdfo-with-flow_sde", ["validate", FDFO, "sampler.name=flow_sde"], ("sampler.name", "churn")),
    ("negative-eta", ["validate", FLOW, "sampler.eta=-0.5"], ("sampler.eta", ">= 0")),
    ("init-gamma-off-churn", ["validate", FLOW, "sampler.init_gamma=0.5"], ("sampler.init_gamma", "churn")),
    ("group-size-1", ["validate", FLOW, "algorithm.group_size=1"], ("algorithm.group_size", ">= 2")),
    ("bogus-schedule", ["validate", FLOW, "optim.schedule=bogus"], ("optim.schedule", "cosine")),
    ("override-without-equals", ["validate", FLOW, "max_steps"], ("max_steps", "key=value")),
    ("eval-missing-checkpoint", ["eval", FLOW, "checkpoint=/nonexistent", *TINY_EVAL, "output_dir={tmp}/eval_nockpt"],
     ("checkpoint", "/nonexistent", "final")),
    ("noise-corr-out-of-range", ["validate", FLOW, "sampler.noise_corr=1"], ("sampler.noise_corr", "[0, 1)")),
    ("demo-yield-prob-out-of-range", ["validate", "configs/driving/pretrain.yaml", "data.demos.yield_prob=1.5"],
     ("data.demos.yield_prob", "[0, 1]")),
    ("noise-corr-axis-outside-action", ["train", FLOW, *TINY, "sampler.noise_corr=0.5", "output_dir={tmp}/train_corr"],
     ("sampler.noise_corr_dim=-2", "event dims")),
    ("noise-corr-with-gaussian-mean-kl", ["train", FLOW, *TINY, "sampler.noise_corr=0.5", "sampler.noise_corr_dim=-1",
                                         "algorithm.kl_beta=0.1", "algorithm.kl_type=gaussian_mean",
                                         "output_dir={tmp}/train_corr_kl"], ("algorithm.kl_type", "k3")),
    # checks that need the built parts: plain validate passes these (OK_CASES), --build catches them
    ("build-cps-window-reaches-noiseless-step", ["validate", "--build", FLOW, *CPS_TO_ZERO],
     ("step 9", "chain.train_window_size=9")),
    ("build-noise-corr-axis-outside-action", ["validate", "--build", FLOW, "sampler.noise_corr=0.5"],
     ("sampler.noise_corr_dim=-2", "event dims")),
    ("build-on-train", ["train", "--build", FLOW], ("--build", "validate")),
    ("train-missing-head-weights", ["train", FLOW, *TINY, "head.path=/nonexistent", "output_dir={tmp}/train_nohead"],
     ("head.path", "/nonexistent")),
]

OK_CASES: List[Tuple[str, List[str]]] = [
    *[(f"validate-{name}", ["validate", f"configs/toy/{name}"]) for name in TOY_CONFIGS],
    ("list-algorithms", ["validate", "--list", "algorithms"]),
    ("validate-skips-built-checks", ["validate", FLOW, *CPS_TO_ZERO]),
    ("validate-build-fdfo", ["validate", "--build", FDFO, "output_dir={tmp}/build_fdfo"]),
]


def _write_inputs(tmp: Path) -> None:
    (tmp / "broken.yaml").write_text("seed: 0\noutput_dir: [unclosed\nmax_steps: 3\n")
    (tmp / "list.yaml").write_text("- seed: 0\n- max_steps: 3\n")
    base = yaml.safe_load((TOY / "flow_grpo.yaml").read_text())
    for key in REQUIRED:
        data = {k: v for k, v in base.items() if k != key}
        (tmp / f"no_{key}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def _run_based_cases(tmp: Path) -> Dict[str, Any]:
    """Train once, then (concurrently, each on its own folder) reuse the run dir, evaluate
    a copy of it and resume another copy. Returns processes and snapshots by name."""
    res: Dict[str, Any] = {}
    out = tmp / "run"
    res["out"] = out
    res["train"] = run_cli("train", FLOW, *TINY, f"output_dir={out}")
    if res["train"].returncode != 0:
        return res
    res["snap"] = snapshot(out)
    eval_run, resume_run = tmp / "run_for_eval", tmp / "run_for_resume"
    shutil.copytree(out, eval_run)
    shutil.copytree(out, resume_run)
    res["eval_run"], res["resume_run"] = eval_run, resume_run

    def protect() -> None:  # sequential, so a damaged file is blamed on the right start
        res["rerun"] = run_cli("train", FLOW, *TINY, f"output_dir={out}")
        res["snap_rerun"] = snapshot(out)
        res["bad_override"] = run_cli("train", FLOW, *TINY, f"output_dir={out}", "optim.lr=-1")
        res["snap_bad_override"] = snapshot(out)

    def evaluate() -> None:
        ckpt = f"checkpoint={eval_run / 'final'}"
        res["eval_default"] = run_cli("eval", FLOW, ckpt, *TINY_EVAL, f"output_dir={tmp / 'eval_default'}")
        res["eval_seed5"] = run_cli("eval", FLOW, ckpt, *TINY_EVAL, f"output_dir={tmp / 'eval_seed5'}", "seed=5")
        res["snap_eval_run"] = snapshot(eval_run)

    def resume() -> None:
        res["resume"] = run_cli("train", FLOW, *TINY, f"output_dir={resume_run}", "resume=true", "max_steps=2")

    with ThreadPoolExecutor(max_workers=3) as pool:
        for f in [pool.submit(fn) for fn in (protect, evaluate, resume)]:
            f.result()
    return res


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Dict[str, Any]:
    """Run every case concurrently (the CPU is the bottleneck: ~2 s of imports each);
    {case id: finished process, "run": results of the run-based cases, "tmp": scratch}."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    _write_inputs(tmp)
    jobs = {cid: [a.replace("{tmp}", str(tmp)) for a in argv] for cid, argv, _ in ERROR_CASES}
    jobs.update({cid: [a.replace("{tmp}", str(tmp)) for a in argv] for cid, argv in OK_CASES})
    with ThreadPoolExecutor(max_workers=1) as chain_pool, \
            ThreadPoolExecutor(max_workers=(os.cpu_count() or 2) + 1) as pool:
        chain = chain_pool.submit(_run_based_cases, tmp)  # longest path first
        futures = {cid: pool.submit(run_cli, *argv) for cid, argv in jobs.items()}
        results: Dict[str, Any] = {cid: f.result() for cid, f in futures.items()}
        results["run"] = chain.result()
    results["tmp"] = tmp
    return results


@pytest.mark.parametrize("case_id,needles", [pytest.param(cid, needles, id=cid) for cid, _, needles in ERROR_CASES])
def test_user_error_is_one_line_exit_2(batch, case_id: str, needles: Sequence[str]) -> None:
    assert_user_error(batch[case_id], *needles)


def test_failed_train_creates_no_output_dir(batch) -> None:
    """The missing-weights train case fails before anything is written."""
    assert not (batch["tmp"] / "train_nohead").exists()


@pytest.mark.parametrize("name", TOY_CONFIGS)
def test_validate_every_toy_config(batch, name: str) -> None:
    proc = batch[f"validate-{name}"]
    assert proc.returncode == 0, _detail(proc)
    assert "ok" in proc.stdout, _detail(proc)
    assert "Traceback" not in proc.stderr, _detail(proc)


def test_validate_build_builds_the_parts_and_writes_nothing(batch) -> None:
    """Plain validate reads the config only; --build also builds the head, sampler and data and
    runs the checks train makes before its first step, without creating output_dir."""
    for cid, says in (("validate-skips-built-checks", "ok ("), ("validate-build-fdfo", "ok, built")):
        proc = batch[cid]
        assert proc.returncode == 0 and says in proc.stdout, _detail(proc)
    assert not (batch["tmp"] / "build_fdfo").exists()


def test_validate_list_algorithms(batch) -> None:
    proc = batch["list-algorithms"]
    assert proc.returncode == 0, _detail(proc)
    listed = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    missing = set(ALGORITHMS) - listed
    assert not missing, f"not listed: {sorted(missing)}" + _detail(proc)


@pytest.mark.parametrize("argv", [pytest.param([], id="no-args"), pytest.param(["bogus"], id="unknown-command"),
                                  pytest.param(["train"], id="train-without-config")])
def test_bad_command_line_exits_nonzero_without_traceback(argv: List[str]) -> None:
    proc = run_cli(*argv)
    assert proc.returncode != 0, _detail(proc)
    assert "Traceback" not in proc.stderr, _detail(proc)
    assert proc.stderr.strip(), "no message on stderr" + _detail(proc)


# --------------------------------------------------------------------------- an existing run
@pytest.fixture(scope="module")
def run(batch) -> Dict[str, Any]:
    """A tiny real training run (and what was done to it and its copies)."""
    res = batch["run"]
    assert res["train"].returncode == 0, "tiny training run failed" + _detail(res["train"])
    for f in ("config.yaml", "metrics.jsonl", "report.json", "final/trainable.safetensors"):
        assert f in res["snap"], f"training did not write {f}; wrote {sorted(res['snap'])}"
    return res


def _assert_same(before: Dict[str, bytes], after: Dict[str, bytes]) -> None:
    assert sorted(after) == sorted(before), (
        f"file set changed: added {sorted(set(after) - set(before))}, removed {sorted(set(before) - set(after))}")
    changed = [k for k in before if before[k] != after[k]]
    assert not changed, f"files modified by a failed start: {changed}"


def test_rerun_on_existing_output_dir_is_refused(run) -> None:
    assert_user_error(run["rerun"], "output_dir", "resume=true", "overwrite=true")
    _assert_same(run["snap"], run["snap_rerun"])


def test_bad_override_on_existing_output_dir_leaves_it_alone(run) -> None:
    assert_user_error(run["bad_override"], "optim.lr", "> 0")
    _assert_same(run["snap"], run["snap_bad_override"])


def _read_eval(proc: subprocess.CompletedProcess, out: Path) -> Dict[str, float]:
    assert proc.returncode == 0, _detail(proc)
    path = out / "eval.json"
    assert path.is_file(), f"eval.json not written in {out}" + _detail(proc)
    metrics = json.loads(path.read_text())
    assert EVAL_KEYS <= set(metrics), f"eval.json lacks metric keys: {metrics}"
    for k in EVAL_KEYS:
        assert isinstance(metrics[k], float) and math.isfinite(metrics[k]), metrics
    return metrics


def test_eval_final_checkpoint(run, batch) -> None:
    _read_eval(run["eval_default"], batch["tmp"] / "eval_default")
    _assert_same(run["snap"], run["snap_eval_run"])  # evaluating a run does not write into it


def test_eval_with_seed_override(run, batch) -> None:
    default = _read_eval(run["eval_default"], batch["tmp"] / "eval_default")
    seeded = _read_eval(run["eval_seed5"], batch["tmp"] / "eval_seed5")
    assert set(seeded) == set(default)
    # Different numbers are expected but not required (a tiny eval can coincide).
    print(f"eval seed=default {default} / seed=5 {seeded}")


def test_resume_continues_the_run(run) -> None:
    proc = run["resume"]
    assert proc.returncode == 0, _detail(proc)
    assert "Traceback" not in proc.stderr, _detail(proc)
    lines = (run["resume_run"] / "metrics.jsonl").read_text().splitlines()
    steps = Counter(json.loads(line).get("step") for line in lines if line.strip())
    assert steps[1] == 1 and steps[2] == 1, f"steps logged: {dict(steps)}"
