"""The shapes world through the trainer, on a tiny random SD3 pipeline: the shapes prompt
source, per-category evaluation, before/after grids with captions, curves.png."""
import glob
import json

import numpy as np
import pytest
from PIL import Image

import flowrl.builtins  # noqa: F401
from flowrl.config import load_config
from flowrl.trainer import Trainer
from flowrl.trainer.report import group_means
from rewards.shapes.prompts import CATEGORIES, ShapesPrompts, ShapesPromptsConfig, split_prompts
from tests.conftest import run_cli

SHAPES_RECIPES = sorted(glob.glob("configs/t2i/shapes_*.yaml"))


def test_every_algorithm_has_a_shapes_recipe_and_each_validates():
    names = {p.split("shapes_")[-1][:-5] for p in SHAPES_RECIPES}
    assert names == {"fdfo", "flow_grpo", "dance_grpo", "vg_grpo"}
    for recipe in SHAPES_RECIPES:
        cfg = load_config(recipe)
        assert cfg.data.name == "shapes_prompts" and cfg.rewards[0].name == "shapes_eval"
        assert cfg.eval.num_items == 6 * cfg.data.eval_per_category  # the whole balanced held-out set


def test_validate_command_accepts_the_demo_recipe_and_builds_it_without_writing(tmp_path):
    out = tmp_path / "demo"
    res = run_cli("validate", "configs/t2i/shapes_fdfo.yaml", f"output_dir={out}")
    assert res.returncode == 0 and "ok (" in res.stdout, res.stderr
    # --build loads the committed model and rewards and runs train's start-up checks
    res = run_cli("validate", "--build", "configs/t2i/shapes_fdfo.yaml", f"output_dir={out}")
    assert res.returncode == 0 and "ok, built" in res.stdout, res.stderr
    assert not out.exists()


def test_shapes_prompt_source_trains_on_rl_prompts_and_evaluates_balanced_held_out():
    src = ShapesPrompts(ShapesPromptsConfig(eval_per_category=3))
    split = split_prompts(0)
    held_out = {it["prompt"] for it in split["eval"]}
    assert [it["prompt"] for it in src.train_items()] == [it["prompt"] for it in split["train"]]
    ev = src.eval_items()
    assert [it["category"] for it in ev] == [c for c in CATEGORIES for _ in range(3)]
    assert all(it["prompt"] in held_out for it in ev)
    every = ShapesPrompts(ShapesPromptsConfig(train_split="all")).train_items()
    assert len(every) == len(split["pretrain"]) + len(split["train"])
    assert not {it["prompt"] for it in every} & held_out
    even = ShapesPrompts(ShapesPromptsConfig(balance_train=True)).train_items()
    per = {c: [it["prompt"] for it in even if it["category"] == c] for c in CATEGORIES}
    assert len({len(v) for v in per.values()}) == 1  # every category equally often
    assert {p for v in per.values() for p in v} == {it["prompt"] for it in split["train"]}
    with pytest.raises(ValueError, match="train_split"):
        ShapesPromptsConfig(train_split="eval")


def test_evaluate_script_scores_any_split_balanced_per_category():
    from examples.shapes.evaluate import eval_items

    split = split_prompts(0)
    for name in ("eval", "train", "pretrain"):
        items = eval_items(0, 2, name)
        assert [it["category"] for it in items] == [c for c in CATEGORIES for _ in range(2)]
        assert {it["prompt"] for it in items} <= {it["prompt"] for it in split[name]}
    assert eval_items(0, 2) == eval_items(0, 2, "eval")  # the held-out default is unchanged


def test_pass_at_k_is_the_unbiased_best_of_k_estimate():
    import numpy as np
    from examples.shapes.evaluate import pass_at_k

    # 4 samples of 3 items: passes c = 3, 1, 0
    passed = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=bool)
    out = pass_at_k(passed, [1, 2, 4])
    assert out["pass@1"] == pytest.approx((0.75 + 0.25 + 0) / 3)  # the mean pass rate
    assert out["pass@2"] == pytest.approx((1 + (1 - 3 / 6) + 0) / 3)  # 1 - C(S-c, 2) / C(4, 2)
    assert out["pass@4"] == pytest.approx(2 / 3)  # any pass among all four
    with pytest.raises(ValueError, match="pass@5"):
        pass_at_k(passed, [5])


def test_evaluate_samples_adds_headroom_metrics_ground_truth_passes_everything():
    from examples.shapes.evaluate import run

    metrics, images = run(ground=True, per_category=1, samples=2)
    assert images.shape[0] == len(CATEGORIES)
    assert metrics["mean_pass"] == 1.0 and metrics["pass@1"] == 1.0 and metrics["pass@2"] == 1.0
    assert "pass@1" not in run(ground=True, per_category=1)[0]


def test_headroom_metrics_per_category():
    from examples.shapes.evaluate import headroom_metrics

    passed = np.array([[1, 0, 0, 0], [0, 0, 1, 0]], dtype=bool)  # 2 samples x 4 items
    m = headroom_metrics(passed, ["colors", "colors", "position", "position"])
    assert m["mean_pass"] == 0.25 and m["pass@1"] == 0.25 and m["pass@2"] == 0.5
    assert m["mean_pass/colors"] == 0.25 and m["pass@2/colors"] == 0.5
    assert m["mean_pass/position"] == 0.25 and m["pass@2/position"] == 0.5
    m = headroom_metrics(np.array([[1, 1, 0, 0], [1, 1, 0, 0]], dtype=bool), ["colors", "colors", "position", "position"])
    assert m["pass@2/colors"] == 1.0 and m["pass@2/position"] == 0.0 and m["mean_pass"] == 0.5


def test_group_means_report_each_group_and_their_unweighted_mean():
    sums = {"r": [3.0, 4.0], "r/a": [1.0, 1.0], "r/b": [2.0, 3.0], "q": [0.0, 0.0]}
    out = group_means(sums, ["r", "q"])
    assert out["r"] == 0.75 and out["r/a"] == 1.0 and out["r/b"] == pytest.approx(2 / 3)
    assert out["r/group_mean"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert out["q"] != out["q"]  # no valid sample: NaN, not 0


def test_curves_get_one_panel_per_reward_so_each_keeps_its_scale():
    from flowrl.trainer.logging import by_family

    train = {"reward/clip": 1, "reward/shapes_partial": 2, "reward/total": 3}
    assert by_family(train, "reward/") == {"clip": {"reward/clip": 1}, "shapes_partial": {"reward/shapes_partial": 2},
                                           "total": {"reward/total": 3}}
    evals = {"clip": 1, "shapes_eval": 2, "shapes_eval/colors": 3, "shapes_eval/group_mean": 4}
    assert by_family(evals) == {"clip": {"clip": 1},
                                "shapes_eval": {"shapes_eval": 2, "shapes_eval/colors": 3, "shapes_eval/group_mean": 4}}


def test_a_shapes_run_reports_per_category_and_writes_captioned_grids_and_curves(tiny_pipelines, tmp_path):
    out = tmp_path / "run"
    cfg = load_config("configs/t2i/shapes_fdfo.yaml", [
        "head.family=sd3", f"head.path={tiny_pipelines['sd3']}", "head.max_sequence_length=16", "head.lora_rank=4", "head.lora_alpha=4",
        "data.eval_per_category=1", "eval.num_items=6", "chain.num_steps=3", "eval.num_steps=3", "max_steps=2",
        "train.prompts_per_step=2", "train.micro_batch_size=4", "train.eval_every=1", "train.progress=false",
        "train.tensorboard=false", f"output_dir={out}"])
    report = Trainer(cfg).train()
    for part in ("before", "after"):  # pass/fail held-out accuracy, and the training rewards, per category
        for key in ("shapes_eval", "shapes_partial"):
            assert {f"{key}/{c}" for c in CATEGORIES} | {key, f"{key}/group_mean"} <= set(report[part])
        assert "clip" in report[part]
    assert json.loads((out / "report.json").read_text()) == report
    before = Image.open(out / "samples" / "before.png")
    assert before.size[1] > before.size[0] // 2  # image tiles with caption rows under them
    assert (out / "samples" / "after.png").is_file() and (out / "samples" / "step-000001.png").is_file()
    assert Image.open(out / "curves.png").size[0] > 500
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert "eval/shapes_eval/color_attr" in rows[0]


def test_nearest_mean_loo_separates_clusters_and_not_noise():
    from examples.shapes.noise_colour import nearest_mean_loo

    rng = np.random.default_rng(0)
    y = ["red"] * 20 + ["blue"] * 20
    apart = np.concatenate([rng.normal(0, 0.1, (20, 3)), rng.normal(3, 0.1, (20, 3))])
    assert nearest_mean_loo(apart, y) == 1.0
    # features independent of the labels: leave-one-out can do no better than chance
    assert nearest_mean_loo(rng.normal(0, 1, (40, 3)), y) < 0.75


def test_object_colour_and_mask_on_a_render():
    from examples.shapes.noise_colour import object_colour_and_mask
    from rewards.shapes.world import Obj, Scene, render

    image = render(Scene((Obj("circle", "cyan", 0.3, 0.6, 0.3),)))  # [H, W, 3] uint8
    colour, mask = object_colour_and_mask(image.astype(np.float64))
    assert colour == "cyan" and mask[int(0.6 * 32), int(0.3 * 32)] and not mask[2, 30]
    assert object_colour_and_mask(np.full((32, 32, 3), 210.0)) == (None, None)


def test_noise_colour_script_runs_on_the_committed_model(tmp_path):
    from examples.shapes.noise_colour import main

    out = tmp_path / "nc.json"
    main(["--seeds", "2", "--per-category", "6", "--threads", "1", "--out", str(out)])
    res = json.loads(out.read_text())
    assert 0 < res["objects"] <= 12 and 0.0 <= res["prompt_match"] <= 1.0
    assert 0.0 <= res["noise_predicts"] <= 1.0 and 0.0 < res["majority"] <= 1.0
    assert any(k.startswith("shifted/") for k in res)
    # FDFO's pairs: a pair where exactly one branch has the prompt's colour differs in colour
    assert 0 < res["pair/pairs"] <= 6 and 0.0 <= res["pair/one_matches"] <= res["pair/colour_differs"] <= 1.0


def test_pairs_compare_sees_a_swapped_relation_and_only_that():
    from examples.shapes.pairs import compare
    from rewards.shapes.prompts import item_spec, parse_prompt
    from rewards.shapes.world import Obj, Scene, render

    spec = item_spec(parse_prompt("a circle left of a square"))
    left = Obj("circle", "red", 0.25, 0.5, 0.3), Obj("square", "blue", 0.75, 0.5, 0.3)
    right = Obj("circle", "red", 0.75, 0.5, 0.3), Obj("square", "blue", 0.25, 0.5, 0.3)
    a, b = (render(Scene(objs)).astype(np.float64) for objs in (left, right))
    assert compare(a, b, spec) == (True, False, True)
    assert compare(a, a, spec) == (True, True, False)
    missing = render(Scene(left[:1])).astype(np.float64)  # the square is not drawn: no relation to compare
    assert compare(a, missing, spec) == (True, False, None)
    assert compare(a, a, item_spec(parse_prompt("a circle")))[2] is None


def test_pairs_script_runs_on_the_committed_model(tmp_path):
    from examples.shapes.pairs import main

    out = tmp_path / "pairs.json"
    main(["--seeds", "1", "--per-category", "2", "--threads", "1", "--out", str(out)])
    res = json.loads(out.read_text())
    assert set(res) == set(CATEGORIES)
    for cat, st in res.items():
        assert st["pairs"] == 2 and 0.0 <= st["both_pass"] + st["pass_differs"] <= 1.0
        assert ("rel_pairs" in st) == (cat == "position")
