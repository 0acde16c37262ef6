"""GenEval-style prompts for the shapes world, ground-truth scenes and the fixed split.

An item is a dict (what a JSONL prompt file line holds and what rewards receive):

    {"prompt": "a red circle and a blue square", "category": "color_attr",
     "objects": [{"shape": "circle", "colour": "red", "count": 1},
                 {"shape": "square", "colour": "blue", "count": 1}],
     "relation": null}

``colour`` null means any colour. ``relation`` ("left of", "right of", "above", "below")
relates objects[0] to objects[1]. Categories follow GenEval's: colours are named only
where colour is what the category tests, so each category checks something different.

    single_object  "a circle"                         one object of that shape
    two_object     "a circle and a square"            one of each shape (distinct shapes)
    counting       "three triangles" (one..four)       exactly n objects of that shape
    colors         "a blue square"                    one object; its colour is tested
    position       "a circle left of a square"         both objects, centres in the SPEC relation
    color_attr     "a red circle and a green square"  distinct shapes and colours; each colour
                                                      must be bound to its own shape

A satisfying scene holds exactly the objects the prompt names (unnamed colours are drawn
uniformly per object), so the strict verifier and ``sample_scene`` agree.

Held-out split (fixed; ``split_prompts``): a prompt is held out (eval) when it contains a
held-out composition of its category:
    single_object  shape in HELD_OUT_SINGLE
    two_object     unordered shape pair in HELD_OUT_PAIRS
    counting       (count, shape) in HELD_OUT_COUNTS
    colors         (colour, shape) in HELD_OUT_COLOUR_SHAPES
    position       layout (left-or-top shape, right-or-bottom shape, axis) in HELD_OUT_LAYOUTS;
                   "A left of B" and "B right of A" are the same layout
    color_attr     either (colour, shape) pair in HELD_OUT_COLOUR_SHAPES or HELD_OUT_BINDINGS
So a held-out (colour, shape) pair of HELD_OUT_COLOUR_SHAPES appears in no pretraining or
training prompt at all, and one of HELD_OUT_BINDINGS only on its own (in ``colors``)
but never bound inside a two-object prompt. The other prompts are split per category
between pretraining and RL training by a seeded shuffle.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from flowrl._fields import hfield
from flowrl.data import ItemSource
from flowrl.registry import DATASETS, ConfigError
from rewards.shapes.world import COLOURS, RELATIONS, SHAPES, Scene, sample_layout

CATEGORIES: Tuple[str, ...] = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
NUMBERS: Tuple[str, ...] = ("one", "two", "three", "four")
OPPOSITE: Dict[str, str] = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}

HELD_OUT_SINGLE: Tuple[str, ...] = ("square", "triangle")
HELD_OUT_PAIRS: Tuple[frozenset, ...] = (frozenset({"circle", "diamond"}), frozenset({"square", "triangle"}))
HELD_OUT_COUNTS: Tuple[Tuple[int, str], ...] = ((1, "diamond"), (2, "triangle"), (3, "circle"), (4, "square"))
HELD_OUT_COLOUR_SHAPES: Tuple[Tuple[str, str], ...] = (
    ("red", "triangle"), ("green", "diamond"), ("blue", "circle"), ("yellow", "square"))
HELD_OUT_BINDINGS: Tuple[Tuple[str, str], ...] = (("purple", "circle"), ("cyan", "square"), ("red", "diamond"))
HELD_OUT_LAYOUTS: Tuple[Tuple[str, str, str], ...] = (
    ("circle", "square", "h"), ("triangle", "circle", "v"), ("diamond", "circle", "h"),
    ("square", "triangle", "v"), ("diamond", "square", "v"), ("triangle", "diamond", "h"))


# --------------------------------------------------------------------------- text
def plural(shape: str) -> str:
    return shape + "s"


def obj(shape: str, colour: Optional[str] = None, count: int = 1) -> Dict[str, Any]:
    """One object spec: {"shape", "colour" (None = any), "count"}."""
    return {"shape": shape, "colour": colour, "count": count}


def prompt_text(category: str, objects: Sequence[Dict[str, Any]], relation: Optional[str] = None) -> str:
    """The prompt sentence of a structured prompt (the grammar ``parse_prompt`` reads)."""
    o = objects
    if category == "single_object":
        return f"a {o[0]['shape']}"
    if category == "two_object":
        return f"a {o[0]['shape']} and a {o[1]['shape']}"
    if category == "counting":
        n = o[0]["count"]
        return f"{NUMBERS[n - 1]} {plural(o[0]['shape']) if n > 1 else o[0]['shape']}"
    if category == "colors":
        return f"a {o[0]['colour']} {o[0]['shape']}"
    if category == "position":
        return f"a {o[0]['shape']} {relation} a {o[1]['shape']}"
    if category == "color_attr":
        return f"a {o[0]['colour']} {o[0]['shape']} and a {o[1]['colour']} {o[1]['shape']}"
    raise ValueError(f"unknown category {category!r}; choose one of {CATEGORIES}")


def make_item(category: str, objects: Sequence[Dict[str, Any]], relation: Optional[str] = None) -> Dict[str, Any]:
    """A prompt item {"prompt", "category", "objects", "relation"}."""
    objects = [dict(o) for o in objects]
    return {"prompt": prompt_text(category, objects, relation), "category": category,
            "objects": objects, "relation": relation}


_S = "|".join(SHAPES)
_C = "|".join(COLOURS)
_R = "|".join(RELATIONS)
_N = "|".join(NUMBERS)
_GRAMMAR = [
    ("color_attr", re.compile(rf"a ({_C}) ({_S}) and a ({_C}) ({_S})")),
    ("colors", re.compile(rf"a ({_C}) ({_S})")),
    ("two_object", re.compile(rf"a ({_S}) and a ({_S})")),
    ("position", re.compile(rf"a ({_S}) ({_R}) a ({_S})")),
    ("single_object", re.compile(rf"a ({_S})")),
    ("counting", re.compile(rf"({_N}) ({_S})s?")),
]


def parse_prompt(text: str) -> Optional[Dict[str, Any]]:
    """A prompt sentence of the grammar -> its item (None if it is not one)."""
    t = " ".join(text.strip().lower().rstrip(".").split())
    for category, rx in _GRAMMAR:
        m = rx.fullmatch(t)
        if not m:
            continue
        g = m.groups()
        if category == "color_attr":
            return make_item(category, [obj(g[1], g[0]), obj(g[3], g[2])])
        if category == "colors":
            return make_item(category, [obj(g[1], g[0])])
        if category == "two_object":
            return make_item(category, [obj(g[0]), obj(g[1])])
        if category == "position":
            return make_item(category, [obj(g[0]), obj(g[2])], g[1])
        if category == "single_object":
            return make_item(category, [obj(g[0])])
        n = NUMBERS.index(g[0]) + 1
        if (n > 1) != t.endswith("s"):
            return None
        return make_item(category, [obj(g[1], None, n)])
    return None


def item_spec(item: Any) -> Optional[Dict[str, Any]]:
    """The structured prompt of a batch item (a dict with "objects", or a prompt string /
    dict with only "prompt" parsed by the grammar); None if it is not a shapes prompt."""
    if isinstance(item, str):
        return parse_prompt(item)
    if not isinstance(item, dict):
        return None
    objects = item.get("objects")
    if objects is None:
        return parse_prompt(item["prompt"]) if isinstance(item.get("prompt"), str) else None
    try:
        ok = bool(objects) and all(o["shape"] in SHAPES and (o.get("colour") is None or o["colour"] in COLOURS)
                                   and 1 <= int(o.get("count", 1)) for o in objects)
    except (KeyError, TypeError, ValueError):
        return None
    rel = item.get("relation")
    if not ok or (rel is not None and (rel not in RELATIONS or len(objects) != 2)):
        return None
    return {"category": item.get("category"), "relation": rel,
            "objects": [{"shape": o["shape"], "colour": o.get("colour"), "count": int(o.get("count", 1))}
                        for o in objects]}


# --------------------------------------------------------------------------- enumeration
def all_prompts() -> List[Dict[str, Any]]:
    """Every prompt of the grammar, in a fixed order (category by category)."""
    out: List[Dict[str, Any]] = []
    out += [make_item("single_object", [obj(s)]) for s in SHAPES]
    out += [make_item("two_object", [obj(a), obj(b)]) for a in SHAPES for b in SHAPES if a != b]
    out += [make_item("counting", [obj(s, None, n)]) for n in range(1, 5) for s in SHAPES]
    out += [make_item("colors", [obj(s, c)]) for c in COLOURS for s in SHAPES]
    out += [make_item("position", [obj(a), obj(b)], r) for a in SHAPES for b in SHAPES if a != b for r in RELATIONS]
    out += [make_item("color_attr", [obj(s1, c1), obj(s2, c2)])
            for c1 in COLOURS for s1 in SHAPES for c2 in COLOURS for s2 in SHAPES if c1 != c2 and s1 != s2]
    return out


def layout_key(item: Dict[str, Any]) -> Tuple[str, str, str]:
    """Position prompt -> (left-or-top shape, right-or-bottom shape, "h" or "v")."""
    a, b = item["objects"][0]["shape"], item["objects"][1]["shape"]
    rel = item["relation"]
    axis = "h" if rel in ("left of", "right of") else "v"
    return (a, b, axis) if rel in ("left of", "above") else (b, a, axis)


def is_held_out(item: Dict[str, Any]) -> bool:
    """Does the prompt contain a held-out composition of its category (module docstring)?"""
    cat, objs = item["category"], item["objects"]
    pairs = {(o["colour"], o["shape"]) for o in objs}
    if cat == "single_object":
        return objs[0]["shape"] in HELD_OUT_SINGLE
    if cat == "two_object":
        return frozenset(o["shape"] for o in objs) in HELD_OUT_PAIRS
    if cat == "counting":
        return (objs[0]["count"], objs[0]["shape"]) in HELD_OUT_COUNTS
    if cat == "colors":
        return bool(pairs & set(HELD_OUT_COLOUR_SHAPES))
    if cat == "position":
        return layout_key(item) in HELD_OUT_LAYOUTS
    if cat == "color_attr":
        return bool(pairs & (set(HELD_OUT_COLOUR_SHAPES) | set(HELD_OUT_BINDINGS)))
    raise ValueError(f"unknown category {cat!r}")


def split_prompts(seed: int = 0, train_fraction: float = 0.3) -> Dict[str, List[Dict[str, Any]]]:
    """{"pretrain", "train", "eval"}: disjoint lists of items covering ``all_prompts()``.

    eval = every held-out prompt (fixed, independent of ``seed``). The rest is split per
    category: a shuffle seeded by ``seed`` sends round(train_fraction * n) prompts (at
    least one when n >= 2) to RL training and the others to pretraining.
    """
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    items = all_prompts()
    out: Dict[str, List[Dict[str, Any]]] = {"pretrain": [], "train": [], "eval": []}
    out["eval"] = [it for it in items if is_held_out(it)]
    rng = np.random.default_rng(seed)
    for cat in CATEGORIES:
        pool = [it for it in items if it["category"] == cat and not is_held_out(it)]
        order = rng.permutation(len(pool))
        n_train = max(1, int(round(train_fraction * len(pool)))) if len(pool) >= 2 else 0
        out["train"] += [pool[i] for i in sorted(order[:n_train])]
        out["pretrain"] += [pool[i] for i in sorted(order[n_train:])]
    return out


def take_per_category(items: Sequence[Dict[str, Any]], n: int, seed: int = 0) -> List[Dict[str, Any]]:
    """At most ``n`` items of each category (a seeded choice), kept in their input order:
    a balanced subset, e.g. of the eval split where color_attr dominates."""
    rng = np.random.default_rng(seed)
    keep: set = set()
    for cat in CATEGORIES:
        idx = [i for i, it in enumerate(items) if it["category"] == cat]
        keep.update(idx if len(idx) <= n else [idx[j] for j in rng.choice(len(idx), n, replace=False)])
    return [it for i, it in enumerate(items) if i in keep]


def balanced(items: Sequence[Dict[str, Any]], per_category: int, seed: int = 0) -> List[Dict[str, Any]]:
    """Exactly ``per_category`` items of every category present, in category order: a
    seeded subset of the category's prompts (``take_per_category``), cycled when it has
    fewer. The held-out evaluation set of the shapes recipes and scripts."""
    out: List[Dict[str, Any]] = []
    for cat in CATEGORIES:
        pick = take_per_category([it for it in items if it["category"] == cat], per_category, seed)
        out += [pick[j % len(pick)] for j in range(per_category)] if pick else []
    return out


# --------------------------------------------------------------------------- scenes
def sample_scene(item: Any, rng: np.random.Generator) -> Scene:
    """A random scene that satisfies the prompt (ground truth): exactly the named objects,
    unnamed colours uniform per object, a relation drawn with the SPEC's clear margin."""
    spec = item_spec(item)
    if spec is None:
        raise ValueError(f"{item!r} is not a shapes prompt")
    colours = list(COLOURS)
    objs: List[Tuple[str, str]] = []
    for o in spec["objects"]:
        for _ in range(o["count"]):
            objs.append((o["shape"], o["colour"] or colours[int(rng.integers(len(colours)))]))
    relation = (0, spec["relation"], 1) if spec["relation"] else None
    return sample_layout(objs, rng, relation)


# --------------------------------------------------------------------------- mismatches
MISMATCHES: Dict[str, Tuple[str, ...]] = {
    "single_object": ("wrong_shape",),
    "two_object": ("wrong_shape",),
    "counting": ("wrong_count", "wrong_shape"),
    "colors": ("wrong_colour", "wrong_shape"),
    "position": ("swapped_relation", "wrong_shape"),
    "color_attr": ("swapped_binding", "wrong_colour", "wrong_shape"),
}


def mismatch(item: Dict[str, Any], kind: str, rng: np.random.Generator) -> Dict[str, Any]:
    """A prompt of the same category that no scene satisfying ``item`` satisfies.

    kind: wrong_shape (one shape replaced by one the prompt does not name), wrong_colour
    (a colour replaced by one it does not name), wrong_count (another count in 1..4),
    swapped_relation (the opposite relation), swapped_binding (the two colours exchanged).
    """
    cat, objs, rel = item["category"], [dict(o) for o in item["objects"]], item.get("relation")
    if kind not in MISMATCHES[cat]:
        raise ValueError(f"{kind!r} does not apply to {cat}; choose one of {MISMATCHES[cat]}")
    i = int(rng.integers(len(objs)))
    if kind == "wrong_shape":
        free = [s for s in SHAPES if s not in {o["shape"] for o in objs}]
        objs[i]["shape"] = free[int(rng.integers(len(free)))]
    elif kind == "wrong_colour":
        free = [c for c in COLOURS if c not in {o["colour"] for o in objs}]
        objs[i]["colour"] = free[int(rng.integers(len(free)))]
    elif kind == "wrong_count":
        free = [n for n in range(1, 5) if n != objs[0]["count"]]
        objs[0]["count"] = free[int(rng.integers(len(free)))]
    elif kind == "swapped_relation":
        rel = OPPOSITE[rel]
    elif kind == "swapped_binding":
        objs[0]["colour"], objs[1]["colour"] = objs[1]["colour"], objs[0]["colour"]
    return make_item(cat, objs, rel)


# --------------------------------------------------------------------------- files
def write_jsonl(items: Sequence[Dict[str, Any]], path: str) -> str:
    """One JSON object per line (a "prompt" key + metadata), the format flowrl's prompt
    source reads. Returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for it in items:
            fh.write(json.dumps(it, sort_keys=True) + "\n")
    return path


def read_jsonl(path: str) -> List[Dict[str, Any]]:
    """Items of a JSONL file (blank lines skipped)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_split(directory: str, seed: int = 0, train_fraction: float = 0.3) -> Dict[str, str]:
    """Write pretrain.jsonl, train.jsonl and eval.jsonl of ``split_prompts`` to ``directory``;
    returns {split: path}."""
    split = split_prompts(seed, train_fraction)
    return {name: write_jsonl(items, os.path.join(directory, f"{name}.jsonl")) for name, items in split.items()}


# --------------------------------------------------------------------------- data source
@dataclass
class ShapesPromptsConfig:
    """The shapes world's prompt split as a flowrl data source (no files needed)."""

    name: str = hfield("shapes_prompts", "data source name")
    split_seed: int = hfield(0, "seed of split_prompts (which non-held-out prompts go to pretrain vs train)")
    train_split: str = hfield("train", "training prompts: train (the RL split, never pretrained on), pretrain, or all "
                                       "(both: every prompt that is not held out)")
    eval_per_category: int = hfield(16, "held-out evaluation items per category (balanced; prompts cycled)")
    balance_train: bool = hfield(False, "draw training prompts category-balanced, like the evaluation (each "
                                        "category's prompts cycled to the largest category's count); False: "
                                        "uniform over prompts, where color_attr is 70% of the RL split")

    def __post_init__(self) -> None:
        if self.train_split not in ("train", "pretrain", "all"):
            raise ConfigError(f"data.train_split: '{self.train_split}' is not one of train, pretrain, all")
        if self.eval_per_category < 1:
            raise ConfigError(f"data.eval_per_category: must be >= 1, got {self.eval_per_category}")


class ShapesPrompts(ItemSource):
    """train_items: the ``train_split`` prompts (with ``balance_train``, cycled per category
    to equal counts); eval_items: the held-out prompts,
    ``eval_per_category`` per category (``balanced``), so evaluation means are category means."""

    def __init__(self, config: ShapesPromptsConfig):
        split = split_prompts(config.split_seed)
        self._train = split["pretrain"] + split["train"] if config.train_split == "all" else split[config.train_split]
        if config.balance_train:
            counts = [sum(it["category"] == c for it in self._train) for c in CATEGORIES]
            self._train = balanced(self._train, max(counts))
        self._eval = balanced(split["eval"], config.eval_per_category)

    def train_items(self) -> List[Dict[str, Any]]:
        return list(self._train)

    def eval_items(self) -> List[Dict[str, Any]]:
        return list(self._eval)


DATASETS.register("shapes_prompts", ShapesPromptsConfig,
                  help="shapes-world prompts: RL train split and balanced held-out compositions")(ShapesPrompts)


__all__ = ["CATEGORIES", "balanced", "ShapesPromptsConfig", "ShapesPrompts", "NUMBERS", "OPPOSITE", "HELD_OUT_SINGLE", "HELD_OUT_PAIRS", "HELD_OUT_COUNTS",
           "HELD_OUT_COLOUR_SHAPES", "HELD_OUT_BINDINGS", "HELD_OUT_LAYOUTS", "MISMATCHES", "obj", "make_item",
           "prompt_text", "parse_prompt", "item_spec", "all_prompts", "layout_key", "is_held_out", "split_prompts",
           "take_per_category", "sample_scene", "mismatch", "write_jsonl", "read_jsonl", "write_split"]
