import torch; torch.set_num_threads(1)  # noqa: E702,I001

import numpy as np
import pytest

import rewards.shapes  # noqa: F401  (registers shapes_eval)
from flowrl.registry import ConfigError
from rewards.base import REWARDS, build_reward
from rewards.shapes import prompts as P
from rewards.shapes import world as W
from rewards.shapes.verifier import ShapesEvalConfig, credit, detect, evaluate, satisfies

PER_CATEGORY = 40  # ground-truth scenes per category and anti-aliasing mode


def _balanced_items(seed: int):
    """PER_CATEGORY items of every category (prompts drawn with replacement)."""
    rng = np.random.default_rng(seed)
    items = P.all_prompts()
    out = []
    for cat in P.CATEGORIES:
        pool = [it for it in items if it["category"] == cat]
        out += [pool[i] for i in rng.integers(len(pool), size=PER_CATEGORY)]
    return out


@pytest.fixture(scope="module", params=[False, True], ids=["hard", "antialiased"])
def ground_truth(request):
    """(items, images [B, 3, 32, 32], detections) for ground-truth renders of all categories."""
    items = _balanced_items(seed=11 + int(request.param))
    rng = np.random.default_rng(100 + int(request.param))
    images = W.render_batch([P.sample_scene(it, rng) for it in items], antialias=request.param)
    dets = [detect(im.permute(1, 2, 0).double().numpy() * 255) for im in images]
    return items, images, dets


def _accuracy(verdicts, items):
    out = {"overall": float(np.mean(verdicts))}
    for cat in P.CATEGORIES:
        v = [ok for ok, it in zip(verdicts, items) if it["category"] == cat]
        out[cat] = float(np.mean(v))
    return out


def test_ground_truth_renders_are_accepted(ground_truth):
    items, images, dets = ground_truth
    acc = evaluate(images, items)
    assert set(P.CATEGORIES) | {"overall", "category_mean"} == set(acc)
    assert min(acc.values()) >= 0.99, acc
    lenient = _accuracy([satisfies(d, it, strict=False) for d, it in zip(dets, items)], items)
    assert min(lenient.values()) >= 0.99, lenient


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_mismatched_prompts_are_rejected(ground_truth, strict):
    items, _, dets = ground_truth
    rng = np.random.default_rng(3)
    by_kind = {}
    for d, it in zip(dets, items):
        for kind in P.MISMATCHES[it["category"]]:
            wrong = P.mismatch(it, kind, rng)
            by_kind.setdefault((it["category"], kind), []).append(satisfies(d, P.item_spec(wrong), strict))
    acc = {k: float(np.mean(v)) for k, v in by_kind.items()}
    assert len(acc) == sum(len(k) for k in P.MISMATCHES.values())
    assert max(acc.values()) <= 0.05, acc
    for cat in P.CATEGORIES:
        assert np.mean([x for (c, _), v in by_kind.items() if c == cat for x in v]) <= 0.05


def test_detect_recovers_the_scene():
    scene = W.Scene((W.Obj("triangle", "yellow", 0.25, 0.3, 0.3), W.Obj("circle", "cyan", 0.7, 0.72, 0.26),
                     W.Obj("diamond", "purple", 0.75, 0.25, 0.33), W.Obj("square", "green", 0.25, 0.75, 0.25)))
    for size in (32, 64):
        for aa in (False, True):
            dets = detect(W.render(scene, size, aa).astype(float))
            assert sorted((d.shape, d.colour) for d in dets) == sorted((o.shape, o.colour) for o in scene.objects)
            for d in dets:  # centres within half a pixel
                o = next(o for o in scene.objects if o.shape == d.shape)
                assert abs(d.cx - o.cx) <= 0.5 / size and abs(d.cy - o.cy) <= 0.5 / size


def test_noise_specks_are_ignored_and_foreign_blobs_are_not():
    img = W.render(W.Scene((W.Obj("square", "red", 0.3, 0.3, 0.3),)), antialias=False).astype(float)
    item = P.parse_prompt("a square")
    speck = img.copy()
    speck[28, 28] = W.COLOURS["blue"]  # one stray pixel: noise
    assert satisfies(detect(speck), P.item_spec(item))
    blob = img.copy()
    blob[20:27, 20:27] = (0, 0, 0)  # a black blob (not a palette colour) is an unknown object
    dets = detect(blob)
    assert len(dets) == 2 and any(d.colour is None and d.shape is None for d in dets)
    assert not satisfies(dets, P.item_spec(item))
    assert satisfies(dets, P.item_spec(item), strict=False)


def test_strict_and_lenient_semantics():
    scene = W.Scene((W.Obj("circle", "red", 0.25, 0.25, 0.3), W.Obj("square", "blue", 0.75, 0.3, 0.3),
                     W.Obj("circle", "green", 0.5, 0.75, 0.3)))
    dets = detect(W.render(scene).astype(float))
    spec = P.item_spec
    assert not satisfies(dets, spec("a circle and a square"))  # extra circle
    assert satisfies(dets, spec("a circle and a square"), strict=False)
    assert satisfies(dets, spec("two circles"), strict=False) and not satisfies(dets, spec("one circle"), strict=False)
    assert satisfies(dets, spec("a circle left of a square"), strict=False)  # the red one is
    assert not satisfies(dets, spec("a square left of a circle"), strict=False)
    assert satisfies(dets, spec("a red circle and a blue square"), strict=False)
    assert not satisfies(dets, spec("a blue circle and a red square"), strict=False)


@pytest.mark.parametrize("graded", [False, True], ids=["relation01", "graded"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_partial_credit_is_one_exactly_when_the_image_passes(ground_truth, strict, graded):
    items, _, dets = ground_truth
    rng = np.random.default_rng(5)
    pairs = [(d, it) for d, it in zip(dets, items)]
    pairs += [(d, P.item_spec(P.mismatch(it, kind, rng))) for d, it in zip(dets, items)
              for kind in P.MISMATCHES[it["category"]]]
    scores = np.array([credit(d, it, strict, graded) for d, it in pairs])
    passes = np.array([satisfies(d, it, strict) for d, it in pairs])
    assert ((scores >= 0) & (scores <= 1)).all()
    assert ((scores == 1.0) == passes).all()
    assert 0 < scores[~passes].mean() < 1  # graded, not another pass/fail


def test_partial_credit_hand_cases():
    scene = W.Scene((W.Obj("circle", "red", 0.25, 0.25, 0.3), W.Obj("square", "blue", 0.75, 0.3, 0.3),
                     W.Obj("circle", "green", 0.5, 0.75, 0.3)))
    dets = detect(W.render(scene).astype(float))
    spec = P.item_spec
    # circle: 2 found for 1 wanted -> 1/2; square 1; named share 3/3; total 3 for 2 -> 2/3
    assert credit(dets, spec("a circle and a square")) == pytest.approx((0.5 + 1 + 1 + 2 / 3) / 4)
    assert credit(dets, spec("a circle and a square"), strict=False) == 1.0
    # four circles wanted, two found: 1 - 2/4; named 2/3; total 3 for 4 -> 3/4
    assert credit(dets, spec("four circles")) == pytest.approx((0.5 + 2 / 3 + 0.75) / 3)
    # lenient: the red circle is left of the square, the square is not left of any circle
    assert credit(dets, spec("a square left of a circle"), strict=False) == pytest.approx(2 / 3)
    assert credit([], spec("a circle")) == 0.0


def test_graded_relation_credit_rises_as_objects_move_towards_the_relation():
    spec = P.item_spec("a circle above a square")
    flat, graded = [], []
    for y in np.linspace(0.7, 0.3, 6):  # the circle rises; "above" holds once dy > |dx| = 0.35 (last two)
        scene = W.Scene((W.Obj("circle", "red", 0.25, float(y), 0.25), W.Obj("square", "blue", 0.6, 0.75, 0.25)))
        dets = detect(W.render(scene).astype(float))
        flat.append(credit(dets, spec))
        graded.append(credit(dets, spec, graded=True))
    assert flat == [pytest.approx(0.8)] * 4 + [1.0, 1.0]  # four checks pass, the relation is 0/1
    assert np.all(np.diff(graded[:4]) > 0) and graded[3] < 0.9 and graded[4:] == [1.0, 1.0]
    # at y = 0.7: dy = 0.05, |dx| = 0.35 -> margin -0.75 -> relation term 0.125
    assert graded[0] == pytest.approx((4 + 0.125) / 5, abs=0.01)
    assert credit(detect(W.render(W.Scene((W.Obj("circle", "red", 0.5, 0.5, 0.3),))).astype(float)),
                  spec, graded=True) == pytest.approx((1 + 0 + 1 + 0.5 + 0) / 5)  # no square: no pair, relation 0


def test_relation_weight_scales_the_relation_share_of_partial_credit():
    # the four other checks pass and the relation fails (0/1): credit 4 / (4 + w)
    scene = W.Scene((W.Obj("circle", "red", 0.25, 0.7, 0.25), W.Obj("square", "blue", 0.6, 0.75, 0.25)))
    dets = detect(W.render(scene).astype(float))
    spec = P.item_spec("a circle above a square")
    for w in (1.0, 4.0, 0.5):
        assert credit(dets, spec, relation_weight=w) == pytest.approx(4 / (4 + w))
    assert credit(dets, P.item_spec("a circle and a square"), relation_weight=4.0) == 1.0  # no relation: no effect
    moved = detect(W.render(W.Scene((W.Obj("circle", "red", 0.6, 0.3, 0.25),
                                     W.Obj("square", "blue", 0.6, 0.75, 0.25)))).astype(float))
    assert credit(moved, spec, relation_weight=4.0) == 1.0
    with pytest.raises(ConfigError, match="relation_weight"):
        ShapesEvalConfig(partial=True, relation_weight=0.0)
    with pytest.raises(ConfigError, match="needs partial"):
        ShapesEvalConfig(relation_weight=2.0)


def test_reward_is_registered_and_scores_batches():
    assert "shapes_eval" in REWARDS.names()
    reward = build_reward(ShapesEvalConfig())
    rng = np.random.default_rng(0)
    items = [P.parse_prompt("a red circle and a blue square"), P.parse_prompt("three triangles"),
             P.parse_prompt("a circle above a diamond")]
    images = W.render_batch([P.sample_scene(it, rng) for it in items])
    batch = [items[0], items[1]["prompt"], {"prompt": "a square above a diamond"}, "a photo of a dog"]
    images = torch.cat([images, images[:1]])
    images[2:3] = W.render_batch([P.sample_scene(items[2], rng)])
    out = reward(images, batch)
    assert out.score.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out.valid.tolist() == [True, True, True, False]
    assert out.info["acc/color_attr"] == 1.0 and out.info["acc/position"] == 0.0
    nan = images.clone()
    nan[0, 0, 0, 0] = float("nan")
    assert not bool(reward(nan, batch).valid[0])


def test_partial_reward_scores_credit_and_reports_pass_rates():
    reward = build_reward(ShapesEvalConfig(partial=True))
    rng = np.random.default_rng(0)
    item = P.parse_prompt("a circle above a diamond")
    images = W.render_batch([P.sample_scene(item, rng)] * 2)
    out = reward(images, [item, "a red circle"])
    assert out.score[0] == 1.0 and 0.0 <= float(out.score[1]) < 1.0
    assert out.info["acc/position"] == 1.0 and out.info["acc/colors"] == 0.0


def test_config_validation():
    ShapesEvalConfig(strict=False, min_iou=0.5)
    for bad in ({"bg_tol": 0}, {"colour_tol": -1}, {"min_area": 1.0}, {"min_iou": 0}, {"graded": True}):
        with pytest.raises(ConfigError):
            ShapesEvalConfig(**bad)
