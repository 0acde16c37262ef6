"""ShapesEval: decide from pixels alone whether a shapes-world image satisfies its prompt.

Pipeline for one image [3, H, W] in [0, 1] (see ``SPEC.md`` for the world it checks):

1. Colour segmentation. Every palette colour c defines the segment from the background b
   to c (the values an anti-aliased edge pixel can take). A pixel p gets, for each colour,
   its coverage a_c = <p - b, c - b> / |c - b|^2 and its distance to that line. Pixels
   within ``bg_tol`` of the background are background; the others take the colour with
   the smallest line distance, and are "unknown" when even that exceeds ``colour_tol``.
2. Objects. Pixels of one colour with coverage >= 0.5 form masks whose 8-connected
   components are objects; unknown pixels form components too. Components smaller than
   ``min_area`` (a share of the image) are noise and ignored. Each object's soft mask is
   the coverage of its own colour on the component grown by one pixel (the anti-aliased
   fringe).
3. Shape. From the soft mask's area and centroid each candidate shape's pose follows
   (size from the area, centre from the centroid; a triangle's centre sits s / 6 above its
   centroid). The candidate rendered at that pose with the world's renderer (anti-aliased
   unless the mask is binary) that overlaps the mask best (soft IoU) names the shape, if
   its IoU >= ``min_iou``.
4. Check. Each object spec of the prompt (shape, optional colour, count) must be matched
   by exactly ``count`` objects (strict, the default, also allows no other objects; with
   ``strict=False`` extra objects are ignored and non-counting specs need at least
   ``count``); a relation compares the two matched objects' centres with the SPEC rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from flowrl._fields import hfield
from flowrl.registry import ConfigError
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.images import check_images
from rewards.shapes.prompts import CATEGORIES, item_spec
from rewards.shapes.world import BACKGROUND, COLOURS, SHAPES, coverage, relation_holds, relation_margin

_PALETTE = np.asarray([COLOURS[c] for c in COLOURS], dtype=np.float64)  # [K, 3]
_NAMES = list(COLOURS)
_UNKNOWN = -1


@dataclass(frozen=True)
class Detection:
    """One object found in an image: shape (None if unrecognised), colour (None if not a
    palette colour), centre (cx, cy) in normalised units (x right, y down), area as a
    share of the image, and the best template IoU."""

    shape: Optional[str]
    colour: Optional[str]
    cx: float
    cy: float
    area: float
    iou: float


@dataclass(frozen=True)
class DetectParams:
    """Thresholds of the pixel pipeline (values in 0..255 colour units)."""

    bg_tol: float = 40.0
    colour_tol: float = 45.0
    min_area: float = 0.01
    min_iou: float = 0.6


# --------------------------------------------------------------------------- segmentation
def colour_coverage(image: np.ndarray, bg_tol: float, colour_tol: float) -> Tuple[np.ndarray, np.ndarray]:
    """uint8-range float image [H, W, 3] -> (label [H, W] int: palette index, -1 unknown,
    -2 background; alpha [H, W]: coverage of the assigned colour, clipped to [0, 1])."""
    bg = np.asarray(BACKGROUND, dtype=np.float64)
    d = _PALETTE - bg  # [K, 3]
    p = image.astype(np.float64) - bg  # [H, W, 3]
    a = np.einsum("hwc,kc->hwk", p, d) / (d * d).sum(1)  # [H, W, K]
    a = np.clip(a, 0.0, None)
    resid = np.linalg.norm(p[:, :, None, :] - a[..., None] * d, axis=-1)  # [H, W, K]
    k = resid.argmin(-1)
    best = np.take_along_axis(resid, k[..., None], -1)[..., 0]
    alpha = np.clip(np.take_along_axis(a, k[..., None], -1)[..., 0], 0.0, 1.0)
    label = np.where(best <= colour_tol, k, _UNKNOWN)
    label = np.where(np.linalg.norm(p, axis=-1) <= bg_tol, -2, label)
    alpha = np.where(label == _UNKNOWN, 1.0, np.where(label == -2, 0.0, alpha))
    return label, alpha


def connected_components(mask: np.ndarray) -> Tuple[np.ndarray, int]:
    """8-connected components of a bool mask [H, W] -> (labels [H, W] int, 0 = off, 1..n; n)."""
    h, w = mask.shape
    lab = np.where(mask, np.arange(1, h * w + 1).reshape(h, w), 0)
    big = h * w + 1
    while True:
        pad = np.pad(np.where(mask, lab, big), 1, constant_values=big)
        nb = np.min(np.stack([pad[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                              for dy in (-1, 0, 1) for dx in (-1, 0, 1)]), axis=0)
        new = np.where(mask, np.minimum(lab, nb), 0)
        if np.array_equal(new, lab):
            break
        lab = new
    ids = np.unique(lab[lab > 0])
    remap = np.zeros(h * w + 2, dtype=np.int64)
    remap[ids] = np.arange(1, len(ids) + 1)
    return remap[lab], len(ids)


def _grow(mask: np.ndarray) -> np.ndarray:
    """Dilate a bool mask [H, W] by one pixel (8-neighbourhood)."""
    h, w = mask.shape
    pad = np.pad(mask, 1)
    return np.any(np.stack([pad[1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                            for dy in (-1, 0, 1) for dx in (-1, 0, 1)]), axis=0)


# --------------------------------------------------------------------------- shape
def _pose(shape: str, area: float, cx: float, cy: float) -> Tuple[float, float, float]:
    """(cx, cy, size) of ``shape`` with the given area and centroid (normalised units)."""
    if shape == "circle":
        s = 2 * np.sqrt(area / np.pi)
    elif shape == "square":
        s = np.sqrt(area)
    else:  # triangle and diamond: area = s^2 / 2
        s = np.sqrt(2 * area)
    return (cx, cy - s / 6, float(s)) if shape == "triangle" else (cx, cy, float(s))


def soft_iou(a: np.ndarray, b: np.ndarray) -> float:
    """sum(min(a, b)) / sum(max(a, b)) of two [H, W] masks in [0, 1]."""
    den = np.maximum(a, b).sum()
    return float(np.minimum(a, b).sum() / den) if den > 0 else 0.0


def is_binary(soft: np.ndarray, tol: float = 0.1, share: float = 0.05) -> bool:
    """True when (almost) no pixel of the mask [H, W] is partly covered: the image was
    rendered without anti-aliasing."""
    on = soft > 0
    partial = on & (soft > tol) & (soft < 1 - tol)
    return bool(partial.sum() <= share * max(int(on.sum()), 1))


def classify_shape(soft: np.ndarray) -> Tuple[Optional[str], float, Tuple[float, float]]:
    """Soft mask [N, N] of one object -> (best shape, its IoU, its centre (cx, cy)).

    Each candidate is rendered at the pose its area and centroid imply (anti-aliased, or
    not when the mask is binary); the best soft IoU wins.
    """
    n = soft.shape[0]
    aa = not is_binary(soft)
    area = soft.sum() / (n * n)
    c = (np.arange(n) + 0.5) / n
    cx = float((soft.sum(0) * c).sum() / soft.sum())
    cy = float((soft.sum(1) * c).sum() / soft.sum())
    best: Tuple[Optional[str], float, Tuple[float, float]] = (None, -1.0, (cx, cy))
    for shape in SHAPES:
        px, py, s = _pose(shape, area, cx, cy)
        iou = soft_iou(soft, coverage(shape, px, py, s, n, antialias=aa))
        if iou > best[1]:
            best = (shape, iou, (px, py))
    return best


def detect(image: np.ndarray, params: DetectParams = DetectParams()) -> List[Detection]:
    """Objects of one image: float [H, W, 3] in 0..255 (H == W) -> list of Detection."""
    h, w, _ = image.shape
    if h != w:
        raise ValueError(f"shapes images are square, got {h}x{w}")
    label, alpha = colour_coverage(image, params.bg_tol, params.colour_tol)
    out: List[Detection] = []
    for k in [_UNKNOWN] + list(range(len(_NAMES))):
        own = label == k
        if not own.any():
            continue
        comps, n = connected_components(own & (alpha >= 0.5))
        for i in range(1, n + 1):
            comp = comps == i
            if comp.sum() < params.min_area * h * w:
                continue
            soft = np.where(_grow(comp) & own, alpha, 0.0)
            shape, iou, (cx, cy) = classify_shape(soft)
            ok = k != _UNKNOWN and iou >= params.min_iou
            out.append(Detection(shape if ok else None, _NAMES[k] if k != _UNKNOWN else None,
                                 cx, cy, float(soft.sum() / (h * w)), iou))
    return out


# --------------------------------------------------------------------------- checking
def _matches(d: Detection, spec: Dict[str, Any]) -> bool:
    return d.shape == spec["shape"] and (spec.get("colour") is None or d.colour == spec["colour"])


def satisfies(detections: Sequence[Detection], item: Dict[str, Any], strict: bool = True) -> bool:
    """Do the detected objects satisfy the prompt ``item`` (structured, see prompts.py)?"""
    objects = item["objects"]
    groups = [[d for d in detections if _matches(d, o)] for o in objects]
    for o, g in zip(objects, groups):
        exact = strict or item.get("category") == "counting"
        if (len(g) != o["count"]) if exact else (len(g) < o["count"]):
            return False
    if strict:
        if len(detections) != sum(o["count"] for o in objects):
            return False
        if any(not any(_matches(d, o) for o in objects) for d in detections):
            return False
    rel = item.get("relation")
    return _relation_holds(groups, rel) if rel else True


def _relation_holds(groups: Sequence[Sequence[Detection]], rel: str) -> bool:
    """Some object of groups[0] stands in relation ``rel`` to some other object of groups[1]."""
    return any(relation_holds((x.cx, x.cy), (y.cx, y.cy), rel) for x in groups[0] for y in groups[1] if x is not y)


def _relation_credit(groups: Sequence[Sequence[Detection]], rel: str, graded: bool) -> float:
    """1 if the relation holds for some pair, else 0 -- or, ``graded``, (1 + margin) / 2 in
    [0, 0.5) for the best pair's ``relation_margin`` (0 without a pair), so the credit rises
    continuously as the objects move towards the relation."""
    if _relation_holds(groups, rel):
        return 1.0
    if not graded:
        return 0.0
    margins = [relation_margin((x.cx, x.cy), (y.cx, y.cy), rel) for x in groups[0] for y in groups[1] if x is not y]
    return (1.0 + max(margins)) / 2 if margins else 0.0


def _count_credit(found: int, want: int, exact: bool) -> float:
    """1 at the right count, falling linearly: exact counts are penalised both ways."""
    if exact:
        return 1.0 - abs(found - want) / max(found, want)
    return min(found, want) / want


def credit(detections: Sequence[Detection], item: Dict[str, Any], strict: bool = True, graded: bool = False,
           relation_weight: float = 1.0) -> float:
    """Partial credit in [0, 1] of the detected objects for the prompt ``item``; 1.0 exactly
    when ``satisfies`` holds.

    The weighted mean of the checks ``satisfies`` makes: one count check per object spec
    (found objects of that shape and colour against the count, see ``_count_credit``); with
    ``strict``, the share of detections the prompt names and the total count (weight 1
    each); the relation (0 or 1, or with ``graded`` see ``_relation_credit``; weight
    ``relation_weight``) when there is one.
    """
    objects = item["objects"]
    groups = [[d for d in detections if _matches(d, o)] for o in objects]
    terms = [_count_credit(len(g), o["count"], strict or item.get("category") == "counting")
             for o, g in zip(objects, groups)]
    if strict:
        named = sum(any(_matches(d, o) for o in objects) for d in detections)
        terms.append(named / len(detections) if detections else 0.0)
        terms.append(_count_credit(len(detections), sum(o["count"] for o in objects), True))
    weights = [1.0] * len(terms)
    rel = item.get("relation")
    if rel:
        terms.append(_relation_credit(groups, rel, graded))
        weights.append(relation_weight)
    return float(np.average(terms, weights=weights))


def _to_hwc255(images: torch.Tensor) -> np.ndarray:
    """[B, 3, H, W] in [0, 1] -> float64 [B, H, W, 3] in 0..255."""
    x = torch.nan_to_num(check_images(images.detach()), nan=0.0)
    return x.permute(0, 2, 3, 1).cpu().double().numpy() * 255.0


def judge(images: torch.Tensor, items: Sequence[Any], strict: bool = True,
          params: DetectParams = DetectParams(), partial: bool = False, graded: bool = False,
          relation_weight: float = 1.0) -> Tuple[List[Optional[Any]], List[Optional[str]]]:
    """Per-image verdicts: ([B] True/False -- or with ``partial`` the ``credit`` in [0, 1],
    ``graded`` and ``relation_weight`` passed on -- or None where the item is not a shapes
    prompt; [B] category or None)."""
    arr = _to_hwc255(images)
    if len(arr) != len(items):
        raise ValueError(f"{len(arr)} images but {len(items)} items")
    verdicts: List[Optional[Any]] = []
    cats: List[Optional[str]] = []
    for img, item in zip(arr, items):
        spec = item_spec(item)
        if spec is None:
            verdicts.append(None)
            cats.append(None)
            continue
        dets = detect(img, params)
        verdicts.append(credit(dets, spec, strict, graded, relation_weight) if partial
                        else satisfies(dets, spec, strict))
        cats.append(spec.get("category"))
    return verdicts, cats


def accuracy_by_category(verdicts: Sequence[Optional[bool]], cats: Sequence[Optional[str]]) -> Dict[str, float]:
    """{"overall": mean, "<category>": mean, ...} over the judged (non-None) images; the
    overall value is the plain mean over images (GenEval averages categories instead:
    see ``evaluate``'s ``category_mean``)."""
    ok = [(bool(v), c) for v, c in zip(verdicts, cats) if v is not None]
    out: Dict[str, float] = {"overall": float(np.mean([v for v, _ in ok])) if ok else float("nan")}
    for cat in CATEGORIES:
        vals = [v for v, c in ok if c == cat]
        if vals:
            out[cat] = float(np.mean(vals))
    return out


def evaluate(images: torch.Tensor, items: Sequence[Any], strict: bool = True) -> Dict[str, float]:
    """Per-category accuracy of images [B, 3, H, W] in [0, 1] against their prompts.

    Returns {"overall": share of images judged correct, "category_mean": mean of the
    per-category accuracies (GenEval's overall score), "<category>": accuracy, ...}; only
    categories present appear. Items that are not shapes prompts are skipped.
    """
    verdicts, cats = judge(images, items, strict)
    out = accuracy_by_category(verdicts, cats)
    per = [out[c] for c in CATEGORIES if c in out]
    out["category_mean"] = float(np.mean(per)) if per else float("nan")
    return out


# --------------------------------------------------------------------------- reward
@dataclass
class ShapesEvalConfig(RewardConfig):
    name: str = hfield("shapes_eval", "reward name")
    strict: bool = hfield(True, "also fail images that hold objects the prompt does not name "
                                "(False: GenEval-style, extra objects are ignored)")
    bg_tol: float = hfield(40.0, "RGB distance (0..255) within which a pixel counts as background")
    colour_tol: float = hfield(45.0, "largest RGB distance (0..255) of a pixel from its colour's edge-blend line "
                                     "(background to colour) for it to count as that colour")
    min_area: float = hfield(0.01, "components smaller than this share of the image are noise and ignored")
    min_iou: float = hfield(0.6, "soft IoU with the best-fitting shape template needed to recognise a shape")
    partial: bool = hfield(False, "score partial credit in [0, 1] (the mean of the prompt's count, purity and "
                                  "relation checks; 1 exactly when the image passes) instead of pass/fail: "
                                  "a denser training signal; evaluate with the pass/fail default")
    graded: bool = hfield(False, "with partial: a failed relation scores (1 + margin) / 2 in [0, 0.5) from how "
                                 "far the centres are from satisfying it, instead of 0 (continuous in the image, "
                                 "so finite differences of close samples see it)")
    relation_weight: float = hfield(1.0, "with partial: weight of the relation check against 1 for each other check "
                                         "(position prompts have four others); > 1 gives the relation a larger "
                                         "share of the training signal")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.graded and not self.partial:
            raise ConfigError(f"{self.name}.graded: needs partial: true (pass/fail has no graded terms)")
        if not self.relation_weight > 0:
            raise ConfigError(f"{self.name}.relation_weight: must be > 0, got {self.relation_weight}")
        if self.relation_weight != 1.0 and not self.partial:
            raise ConfigError(f"{self.name}.relation_weight: needs partial: true (pass/fail has no weighted terms)")
        for key in ("bg_tol", "colour_tol"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{self.name}.{key}: must be > 0, got {getattr(self, key)}")
        if not 0 <= self.min_area < 1:
            raise ConfigError(f"{self.name}.min_area: must be in [0, 1), got {self.min_area}")
        if not 0 < self.min_iou <= 1:
            raise ConfigError(f"{self.name}.min_iou: must be in (0, 1], got {self.min_iou}")


class ShapesEval(Reward):
    """1.0 if the image satisfies its shapes prompt, else 0.0 -> [B] (with ``partial``:
    ``credit``, in [0, 1], 1.0 exactly when it passes).

    Items are dicts from ``rewards.shapes.prompts`` (or plain prompt strings of its
    grammar, parsed). An item that is not a shapes prompt is invalid. ``info`` carries
    ``acc/<category>`` (this batch's accuracy per category present) and ``groups`` (each
    sample's category, so ``flowrl`` evaluations report ``shapes_eval/<category>``).
    """

    def score(self, outputs: torch.Tensor, batch: Sequence[Any]) -> RewardOutput:
        c = self.config
        params = DetectParams(c.bg_tol, c.colour_tol, c.min_area, c.min_iou)
        verdicts, cats = judge(outputs, batch, c.strict, params, c.partial, c.graded, c.relation_weight)
        finite = torch.isfinite(outputs.reshape(outputs.shape[0], -1)).all(1).cpu()
        score = torch.tensor([float(v) if v is not None else 0.0 for v in verdicts], dtype=torch.float32)
        valid = torch.tensor([v is not None for v in verdicts], dtype=torch.bool) & finite
        acc = accuracy_by_category([v == 1 if ok else None for v, ok in zip(verdicts, valid.tolist())], cats)
        info: Dict[str, Any] = {f"acc/{k}": v for k, v in acc.items() if k != "overall"}
        info["groups"] = [cat or "not_a_shapes_prompt" for cat in cats]  # evaluation breaks scores down by category
        return RewardOutput(score, valid, info)


REWARDS.register("shapes_eval", ShapesEvalConfig,
                 help="shapes-world verifier: 1 if the image satisfies its GenEval-style prompt (from pixels)"
                 )(ShapesEval)

__all__ = ["Detection", "DetectParams", "colour_coverage", "connected_components", "classify_shape", "is_binary",
           "detect", "satisfies", "credit", "judge", "accuracy_by_category", "evaluate", "soft_iou", "ShapesEvalConfig",
           "ShapesEval"]
