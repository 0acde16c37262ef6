import torch; torch.set_num_threads(1)  # noqa: E702,I001

import json
import re
from pathlib import Path

import numpy as np
import pytest

from flowrl.heads.t2i.prompts import read_prompts
from rewards.shapes import prompts as P
from rewards.shapes import world as W

SPEC = Path(W.__file__).with_name("SPEC.md")


def _scenes(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return [W.random_scene(rng) for _ in range(n)]


# --------------------------------------------------------------------------- renderer
def test_render_is_deterministic_from_seed():
    a = [W.render(s) for s in _scenes(3, 8)]
    b = [W.render(s) for s in _scenes(3, 8)]
    c = [W.render(s) for s in _scenes(4, 8)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_render_batch_convention():
    scenes = _scenes(0, 3)
    x = W.render_batch(scenes, size=24, antialias=False)
    assert x.shape == (3, 3, 24, 24) and x.dtype == torch.float32
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    assert torch.equal(x[1], torch.from_numpy(W.render(scenes[1], 24, False)).permute(2, 0, 1).float() / 255)


def test_exact_colours_without_antialiasing():
    allowed = {W.BACKGROUND, *W.COLOURS.values()}
    for scene in _scenes(1, 20):
        img = W.render(scene, antialias=False)
        assert {tuple(int(v) for v in p) for p in img.reshape(-1, 3)} <= allowed
        for o in scene.objects:  # the pixels of each object are exactly its inside test
            mask = W.coverage(o.shape, o.cx, o.cy, o.size, 32, antialias=False).astype(bool)
            assert mask.sum() > 0 and (img[mask] == np.asarray(W.COLOURS[o.colour])).all()


def test_antialiased_pixels_lie_on_background_to_colour_segments():
    bg = np.asarray(W.BACKGROUND, float)
    for scene in _scenes(2, 10):
        img = W.render(scene, antialias=True).astype(float)
        for o in scene.objects:
            cov = W.coverage(o.shape, o.cx, o.cy, o.size, 32, antialias=True)
            expect = np.round(bg + cov[..., None] * (np.asarray(W.COLOURS[o.colour], float) - bg))
            on = cov > 0
            assert np.array_equal(img[on], expect[on])
            assert np.array_equal(img[cov == 1], np.broadcast_to(W.COLOURS[o.colour], img[cov == 1].shape))


def test_layout_rules_hold_for_random_and_ground_truth_scenes():
    rng = np.random.default_rng(5)
    scenes = _scenes(6, 100) + [P.sample_scene(it, rng) for it in P.all_prompts()[::3]]
    for scene in scenes:
        assert W.valid_layout(scene)
        objs = scene.objects
        covers = sum(W.coverage(o.shape, o.cx, o.cy, o.size, 32, True) > 0 for o in objs)
        assert covers.max() <= 1  # no pixel touched by two objects
        for o in objs:
            assert W.SIZE_MIN <= o.size <= W.SIZE_MAX and W.in_bounds(o)


def test_coordinate_convention_and_shape_geometry():
    left = W.Obj("square", "red", 0.25, 0.5, 0.3)
    img = W.render(W.Scene((left,)), antialias=False)
    cols = np.nonzero((img != W.BACKGROUND).any(-1).any(0))[0]
    assert cols.max() < 16  # x = 0.25 is in the left half
    tri = W.Obj("triangle", "blue", 0.5, 0.5, 0.34375)
    mask = W.coverage("triangle", tri.cx, tri.cy, tri.size, 64, antialias=False).astype(bool)
    widths = mask.sum(1)[mask.any(1)]
    assert widths[0] < widths[-1]  # apex up, base down (y grows downwards)
    assert W.relation_holds((0.2, 0.5), (0.8, 0.55), "left of")
    assert W.relation_holds((0.5, 0.2), (0.45, 0.8), "above")
    holds = [W.relation_holds((0.3, 0.4), (0.7, 0.6), r) for r in W.RELATIONS]
    assert holds == [True, False, False, False]


def test_relation_margin_signs_bounds_and_continuity():
    rng = np.random.default_rng(3)
    for _ in range(200):
        a, b = tuple(rng.uniform(0, 1, 2)), tuple(rng.uniform(0, 1, 2))
        for r in W.RELATIONS:
            m = W.relation_margin(a, b, r)
            assert -1 <= m <= 1 and (m > 0) == W.relation_holds(a, b, r)
    assert W.relation_margin((0.2, 0.5), (0.8, 0.5), "left of") == 1.0
    assert W.relation_margin((0.2, 0.5), (0.8, 0.5), "right of") == -1.0
    assert W.relation_margin((0.5, 0.5), (0.7, 0.7), "below") == pytest.approx(-1.0)
    assert W.relation_margin((0.5, 0.5), (0.5, 0.5), "above") == 0.0
    ys = np.linspace(0.45, 0.25, 9)  # A rises towards "above B" at (0.7, 0.45)
    ms = [W.relation_margin((0.3, y), (0.7, 0.45), "above") for y in ys]
    assert np.all(np.diff(ms) > 0)
    with pytest.raises(ValueError):
        W.relation_margin(a, b, "near")


def test_ground_truth_relations_have_the_spec_margin():
    rng = np.random.default_rng(7)
    for it in [i for i in P.all_prompts() if i["category"] == "position"]:
        a, b = P.sample_scene(it, rng).objects
        assert W.relation_holds((a.cx, a.cy), (b.cx, b.cy), it["relation"], W.RELATION_RATIO)


def test_spec_md_matches_the_code():
    text = SPEC.read_text()
    table = dict(re.findall(r"\| (\w+) \| \((\d+, \d+, \d+)\) \|", text))
    assert {k: tuple(int(v) for v in s.split(", ")) for k, s in table.items()} == W.COLOURS
    assert "(210, 210, 210)" in text and str(tuple(W.BACKGROUND)) in W.__doc__
    for name, rgb in W.COLOURS.items():
        assert f"{name} {rgb}" in " ".join(W.__doc__.split())


# --------------------------------------------------------------------------- prompts
def test_parse_round_trip_and_rejects_other_text():
    items = P.all_prompts()
    assert len({it["prompt"] for it in items}) == len(items)
    for it in items:
        assert P.parse_prompt(it["prompt"]) == it
        assert P.item_spec(it)["objects"] == it["objects"]
    for bad in ["a dog", "two circle", "one circles", "a red circle and a square", "five squares", ""]:
        assert P.parse_prompt(bad) is None
    assert P.item_spec(42) is None and P.item_spec({"objects": [{"shape": "hexagon"}]}) is None


def _keys(it):
    """Every composition key a prompt contains (to check held-out ones never leak)."""
    cat, objs = it["category"], it["objects"]
    keys = {(cat, "pair", o["colour"], o["shape"]) for o in objs if o["colour"]}
    keys |= {("any", "pair", o["colour"], o["shape"]) for o in objs if o["colour"]}
    if cat == "single_object":
        keys.add((cat, objs[0]["shape"]))
    if cat == "two_object":
        keys.add((cat, frozenset(o["shape"] for o in objs)))
    if cat == "counting":
        keys.add((cat, objs[0]["count"], objs[0]["shape"]))
    if cat == "position":
        keys.add((cat, P.layout_key(it)))
    return keys


def test_split_is_disjoint_complete_and_holds_out_compositions():
    split = P.split_prompts(0)
    texts = {k: {it["prompt"] for it in v} for k, v in split.items()}
    assert all(len(texts[k]) == len(split[k]) for k in split)
    assert not (texts["pretrain"] & texts["train"] or texts["pretrain"] & texts["eval"] or texts["train"] & texts["eval"])
    assert set().union(*texts.values()) == {it["prompt"] for it in P.all_prompts()}
    for name in split:
        assert {it["category"] for it in split[name]} == set(P.CATEGORIES), name
    held = ({("single_object", s) for s in P.HELD_OUT_SINGLE}
            | {("two_object", p) for p in P.HELD_OUT_PAIRS}
            | {("counting", n, s) for n, s in P.HELD_OUT_COUNTS}
            | {("any", "pair", c, s) for c, s in P.HELD_OUT_COLOUR_SHAPES}
            | {("color_attr", "pair", c, s) for c, s in P.HELD_OUT_BINDINGS}
            | {("position", k) for k in P.HELD_OUT_LAYOUTS})
    seen = set().union(*(_keys(it) for it in split["pretrain"] + split["train"]))
    assert not (seen & held)
    assert all(_keys(it) & held for it in split["eval"])
    # the bindings held out of color_attr are still seen alone, in colors
    assert {("colors", "pair", c, s) for c, s in P.HELD_OUT_BINDINGS} <= seen


def test_split_is_deterministic_and_eval_fixed():
    a, b, c = P.split_prompts(0), P.split_prompts(0), P.split_prompts(1)
    assert a == b
    assert a["eval"] == c["eval"] and a["train"] != c["train"]
    sub = P.take_per_category(a["eval"], 3, seed=0)
    assert max(sum(it["category"] == cat for it in sub) for cat in P.CATEGORIES) == 3
    assert sub == P.take_per_category(a["eval"], 3, seed=0)


def test_jsonl_files_load_through_flowrl_prompt_reader(tmp_path):
    paths = P.write_split(str(tmp_path), seed=0)
    split = P.split_prompts(0)
    for name, path in paths.items():
        items = read_prompts(path, f"data.{name}")
        assert items == json.loads(json.dumps(split[name])) == P.read_jsonl(path)
        assert all(isinstance(it["prompt"], str) for it in items)


@pytest.mark.parametrize("category", P.CATEGORIES)
def test_mismatches_are_valid_prompts_of_the_same_category(category):
    rng = np.random.default_rng(0)
    items = [it for it in P.all_prompts() if it["category"] == category][:10]
    for it in items:
        for kind in P.MISMATCHES[category]:
            m = P.mismatch(it, kind, rng)
            assert m["category"] == category and m["prompt"] != it["prompt"]
            assert P.parse_prompt(m["prompt"]) == m
