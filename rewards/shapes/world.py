"""The shapes world: a procedural renderer of flat coloured shapes on a plain background.

SPEC (also in ``rewards/shapes/SPEC.md``; a checker written from it alone should agree
with ``rewards.shapes.verifier``).

Coordinates. An image is square, ``size`` x ``size`` pixels (default 32). Scene geometry
is in normalised units: x in [0, 1] from the left edge to the right edge, y in [0, 1]
from the TOP edge to the bottom edge (y grows downwards, like image rows). Pixel
(row i, column j) covers [j, j+1) x [i, i+1) / size and its centre is
((j + 0.5) / size, (i + 0.5) / size).

Background. Every pixel not covered by an object is RGB (210, 210, 210).

Colours (exact RGB of a fully covered pixel):
    red (220, 40, 40), green (40, 170, 60), blue (40, 80, 220), yellow (240, 200, 30),
    purple (150, 50, 170), cyan (20, 190, 200).

Shapes. An object has a centre (cx, cy) and a size s (normalised); h = s / 2. Its
bounding box is the square [cx - h, cx + h] x [cy - h, cy + h] for every shape, and a
point (x, y) is inside the object when
    circle:   (x - cx)^2 + (y - cy)^2 <= h^2                    (disc of diameter s)
    square:   |x - cx| <= h and |y - cy| <= h                  (axis-aligned)
    triangle: cy - h <= y <= cy + h and |x - cx| <= (y - (cy - h)) / 2
              (upright isosceles: apex at (cx, cy - h), base from (cx - h, cy + h) to
              (cx + h, cy + h); base = height = s; its centroid is at (cx, cy + s / 6))
    diamond:  |x - cx| + |y - cy| <= h                         (square turned 45 degrees)
Areas: circle pi s^2 / 4, square s^2, triangle s^2 / 2, diamond s^2 / 2.

Rasterisation. Without anti-aliasing a pixel takes the object's colour when its centre
is inside the object. With anti-aliasing (the default) the image is rendered that way at
4x the resolution (sample points at ((4j + k + 0.5) / (4 size), ...), k = 0..3) and
box-downscaled: a pixel's coverage c in [0, 1] is the share of its 16 sample points
inside the object and its value is round(background + c * (colour - background)). A pixel
is never covered by two objects (see the gap rule), so every pixel lies on the segment
from the background colour to exactly one object colour.

Layout rules (what ``sample_layout`` draws and ``valid_layout`` checks):
    size       s uniform in [SIZE_MIN, SIZE_MAX] = [0.25, 0.34375]: 8 to 11 px at 32x32
    margin     every bounding box lies inside [MARGIN, 1 - MARGIN]^2, MARGIN = 1/32 (1 px at 32)
    no overlap any two bounding boxes are at least GAP = 2/32 (2 px at 32) apart along x
               or along y: max(|dx|, |dy|) - (s1 + s2) / 2 >= GAP with (dx, dy) the
               difference of the centres
    count      1 to 4 objects per scene
Centres are drawn uniformly over the positions the margin allows, object by object, and
redrawn until the rules (and a requested relation) hold.

Relations between objects A and B, with (dx, dy) = centre(B) - centre(A) (y down):
    "A left of B"  when  dx > |dy|        "A right of B" when -dx > |dy|
    "A above B"    when  dy > |dx|        "A below B"    when -dy > |dx|
i.e. the displacement's dominant axis and its sign; the four are mutually exclusive.
Ground-truth scenes for a relation are drawn with a clear margin: the dominant component
is at least RELATION_RATIO = 2 times the other one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch

SHAPES: Tuple[str, ...] = ("circle", "square", "triangle", "diamond")
COLOURS: Dict[str, Tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 200, 30),
    "purple": (150, 50, 170),
    "cyan": (20, 190, 200),
}
BACKGROUND: Tuple[int, int, int] = (210, 210, 210)
RELATIONS: Tuple[str, ...] = ("left of", "right of", "above", "below")

DEFAULT_SIZE = 32
SUPERSAMPLE = 4
SIZE_MIN = 8 / 32
SIZE_MAX = 11 / 32
MARGIN = 1 / 32
GAP = 2 / 32
MAX_OBJECTS = 4
RELATION_RATIO = 2.0
_MAX_TRIES = 1000


@dataclass(frozen=True)
class Obj:
    """One object: ``shape`` in SHAPES, ``colour`` in COLOURS, centre (cx, cy) and size in
    normalised units (x right, y down; the bounding box is the square of side ``size``)."""

    shape: str
    colour: str
    cx: float
    cy: float
    size: float

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose one of {SHAPES}")
        if self.colour not in COLOURS:
            raise ValueError(f"unknown colour {self.colour!r}; choose one of {tuple(COLOURS)}")
        if not self.size > 0:
            raise ValueError(f"object size must be > 0, got {self.size}")

    @property
    def bbox(self) -> Tuple[float, float, float, float]:
        """(x0, y0, x1, y1) of the bounding square."""
        h = self.size / 2
        return (self.cx - h, self.cy - h, self.cx + h, self.cy + h)


@dataclass(frozen=True)
class Scene:
    """The objects of one image (drawn in order; they never overlap)."""

    objects: Tuple[Obj, ...]


# --------------------------------------------------------------------------- geometry
def inside(shape: str, x: np.ndarray, y: np.ndarray, cx: float, cy: float, size: float) -> np.ndarray:
    """Boolean mask of points (x, y) (any equal shapes, normalised units) inside the shape."""
    h = size / 2
    ax, ay = np.abs(x - cx), np.abs(y - cy)
    if shape == "circle":
        return ax * ax + ay * ay <= h * h
    if shape == "square":
        return (ax <= h) & (ay <= h)
    if shape == "triangle":
        top = cy - h
        return (y >= top) & (y <= cy + h) & (ax <= (y - top) / 2)
    if shape == "diamond":
        return ax + ay <= h
    raise ValueError(f"unknown shape {shape!r}; choose one of {SHAPES}")


def sample_grid(size: int, antialias: bool) -> Tuple[np.ndarray, np.ndarray]:
    """Sample-point coordinates (x, y), each [size * k, size * k] with k = SUPERSAMPLE if
    ``antialias`` else 1, in normalised units (point centres)."""
    n = size * (SUPERSAMPLE if antialias else 1)
    c = (np.arange(n, dtype=np.float64) + 0.5) / n
    return np.meshgrid(c, c, indexing="xy")


def coverage(shape: str, cx: float, cy: float, size: float, image_size: int = DEFAULT_SIZE,
             antialias: bool = True) -> np.ndarray:
    """Share of each pixel covered by the shape: float64 [image_size, image_size] in [0, 1]
    (exactly 0 or 1 without anti-aliasing)."""
    x, y = sample_grid(image_size, antialias)
    hard = inside(shape, x, y, cx, cy, size).astype(np.float64)
    if not antialias:
        return hard
    k = SUPERSAMPLE
    return hard.reshape(image_size, k, image_size, k).mean(axis=(1, 3))


def render(scene: Scene, size: int = DEFAULT_SIZE, antialias: bool = True) -> np.ndarray:
    """Scene -> uint8 [size, size, 3] RGB image (rows top to bottom)."""
    if size < 8:
        raise ValueError(f"image size must be >= 8 pixels, got {size}")
    bg = np.asarray(BACKGROUND, dtype=np.float64)
    img = np.broadcast_to(bg, (size, size, 3)).copy()
    for o in scene.objects:
        cov = coverage(o.shape, o.cx, o.cy, o.size, size, antialias)[..., None]
        colour = np.asarray(COLOURS[o.colour], dtype=np.float64)
        img = img + cov * (colour - bg)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def to_tensor(images: Sequence[np.ndarray]) -> torch.Tensor:
    """uint8 [H, W, 3] images -> float32 [B, 3, H, W] in [0, 1]."""
    arr = np.stack([np.asarray(im) for im in images]).astype(np.float32) / 255.0
    return torch.from_numpy(arr).permute(0, 3, 1, 2).contiguous()


def render_batch(scenes: Sequence[Scene], size: int = DEFAULT_SIZE, antialias: bool = True) -> torch.Tensor:
    """Scenes -> float32 [B, 3, size, size] in [0, 1] (the image convention of rewards)."""
    return to_tensor([render(s, size, antialias) for s in scenes])


# --------------------------------------------------------------------------- layout
def separated(a: Obj, b: Obj, gap: float = GAP) -> bool:
    """True when the bounding boxes of ``a`` and ``b`` are >= ``gap`` apart along x or y."""
    reach = (a.size + b.size) / 2
    return max(abs(a.cx - b.cx), abs(a.cy - b.cy)) - reach >= gap - 1e-12


def in_bounds(o: Obj, margin: float = MARGIN) -> bool:
    """True when the bounding box lies inside [margin, 1 - margin]^2."""
    x0, y0, x1, y1 = o.bbox
    lo, hi = margin - 1e-12, 1 - margin + 1e-12
    return x0 >= lo and y0 >= lo and x1 <= hi and y1 <= hi


def _along_across(a: Tuple[float, float], b: Tuple[float, float], relation: str) -> Tuple[float, float]:
    """(signed displacement component the relation names, |the other component|) of the
    centres a -> b; "A left of B" wants b to the right of a (x right, y down)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    if relation in ("left of", "right of"):
        return (dx if relation == "left of" else -dx), abs(dy)
    if relation in ("above", "below"):
        return (dy if relation == "above" else -dy), abs(dx)
    raise ValueError(f"unknown relation {relation!r}; choose one of {RELATIONS}")


def relation_holds(a: Tuple[float, float], b: Tuple[float, float], relation: str, ratio: float = 1.0) -> bool:
    """Does "A <relation> B" hold for centres a = (x, y), b = (x, y)? The dominant
    displacement component must exceed ``ratio`` times the other one (1 = the SPEC rule)."""
    along, across = _along_across(a, b, relation)
    return along > ratio * across


def relation_margin(a: Tuple[float, float], b: Tuple[float, float], relation: str) -> float:
    """Signed margin in [-1, 1] of "A <relation> B" for centres a, b: (the relation's
    displacement component - |the other component|) / (|dx| + |dy|). It is > 0 exactly when
    ``relation_holds`` (ratio 1) and varies continuously with the centres; 0 when a == b."""
    along, across = _along_across(a, b, relation)
    norm = abs(along) + across
    return (along - across) / norm if norm > 0 else 0.0


def valid_layout(scene: Scene) -> bool:
    """The SPEC's layout rules: 1..MAX_OBJECTS objects, sizes in range, margins, no overlap."""
    objs = scene.objects
    if not 1 <= len(objs) <= MAX_OBJECTS:
        return False
    if any(not (SIZE_MIN - 1e-12 <= o.size <= SIZE_MAX + 1e-12) or not in_bounds(o) for o in objs):
        return False
    return all(separated(objs[i], objs[j]) for i in range(len(objs)) for j in range(i + 1, len(objs)))


def _draw_object(shape: str, colour: str, rng: np.random.Generator) -> Obj:
    s = float(rng.uniform(SIZE_MIN, SIZE_MAX))
    lo, hi = MARGIN + s / 2, 1 - MARGIN - s / 2
    return Obj(shape, colour, float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi)), s)


def sample_layout(specs: Sequence[Tuple[str, str]], rng: np.random.Generator,
                  relation: Optional[Tuple[int, str, int]] = None) -> Scene:
    """Place objects (shape, colour) at random under the layout rules.

    ``relation`` = (i, "left of", j) also requires objects i and j to satisfy the relation
    with the ground-truth margin RELATION_RATIO. Deterministic given ``rng``'s state.
    """
    if not 1 <= len(specs) <= MAX_OBJECTS:
        raise ValueError(f"a scene holds 1 to {MAX_OBJECTS} objects, got {len(specs)}")
    for _ in range(_MAX_TRIES):
        placed: list = []
        for shape, colour in specs:
            for _ in range(100):
                o = _draw_object(shape, colour, rng)
                if all(separated(o, p) for p in placed):
                    placed.append(o)
                    break
            else:
                break
        if len(placed) < len(specs):
            continue
        if relation is not None:
            i, rel, j = relation
            a, b = placed[i], placed[j]
            if not relation_holds((a.cx, a.cy), (b.cx, b.cy), rel, RELATION_RATIO):
                continue
        return Scene(tuple(placed))
    raise RuntimeError(f"could not place {specs} with relation {relation} in {_MAX_TRIES} tries")


def random_scene(rng: np.random.Generator, num_objects: Optional[int] = None) -> Scene:
    """A scene of ``num_objects`` (default: uniform 1..MAX_OBJECTS) random objects."""
    n = int(rng.integers(1, MAX_OBJECTS + 1)) if num_objects is None else num_objects
    specs = [(SHAPES[int(rng.integers(len(SHAPES)))], list(COLOURS)[int(rng.integers(len(COLOURS)))]) for _ in range(n)]
    return sample_layout(specs, rng)


__all__ = ["SHAPES", "COLOURS", "BACKGROUND", "RELATIONS", "DEFAULT_SIZE", "SUPERSAMPLE", "SIZE_MIN", "SIZE_MAX",
           "MARGIN", "GAP", "MAX_OBJECTS", "RELATION_RATIO", "Obj", "Scene", "inside", "sample_grid", "coverage",
           "render", "render_batch", "to_tensor", "separated", "in_bounds", "relation_holds", "relation_margin",
           "valid_layout",
           "sample_layout", "random_scene"]
