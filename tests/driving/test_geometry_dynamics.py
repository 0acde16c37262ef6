"""Hand-built cases for boxes, the drivable area and the bicycle model."""
import math

import torch

from planners.driving import geometry as geo
from planners.driving.dynamics import bicycle_rollout, bicycle_step, inverse_dynamics
from planners.driving.sim import offroad

T = torch.tensor


def overlap(p1, h1, p2, h2, l1=4.0, w1=2.0, l2=4.0, w2=2.0):
    return bool(geo.boxes_overlap(T(p1), T(h1), T(l1), T(w1), T(p2), T(h2), T(l2), T(w2)))


def test_axis_aligned_boxes_overlap_or_not():
    assert overlap([0.0, 0.0], 0.0, [3.9, 0.0], 0.0)  # 4 m long boxes, 3.9 m apart
    assert not overlap([0.0, 0.0], 0.0, [4.1, 0.0], 0.0)
    assert overlap([0.0, 0.0], 0.0, [0.0, 1.9], 0.0)
    assert not overlap([0.0, 0.0], 0.0, [0.0, 2.1], 0.0)


def test_rotated_boxes_where_bounding_boxes_disagree():
    # two thin 45-degree boxes side by side: their axis-aligned bounding boxes overlap,
    # the boxes themselves do not
    h = math.pi / 4
    assert not overlap([0.0, 0.0], h, [1.5, -1.5], h, l1=6.0, w1=1.0, l2=6.0, w2=1.0)
    c1 = geo.box_corners(T([0.0, 0.0]), T(h), T(6.0), T(1.0))
    c2 = geo.box_corners(T([1.5, -1.5]), T(h), T(6.0), T(1.0))
    assert c1[:, 0].max() > c2[:, 0].min() and c2[:, 1].max() > c1[:, 1].min()  # AABBs overlap
    # crossing at right angles at the same centre: overlap
    assert overlap([0.0, 0.0], 0.0, [0.0, 0.0], math.pi / 2)
    # a box rotated by 90 degrees just past the other's end: separate; just inside: overlap
    assert not overlap([0.0, 0.0], 0.0, [3.05, 0.0], math.pi / 2)
    assert overlap([0.0, 0.0], 0.0, [2.95, 0.0], math.pi / 2)


def test_overlap_is_batched_and_symmetric():
    g = torch.Generator().manual_seed(0)
    p1, p2 = torch.randn(200, 2, generator=g) * 3, torch.randn(200, 2, generator=g) * 3
    h1, h2 = torch.rand(200, generator=g) * 6, torch.rand(200, generator=g) * 6
    l, w = torch.full((200,), 4.5), torch.full((200,), 1.9)
    ab = geo.boxes_overlap(p1, h1, l, w, p2, h2, l, w)
    ba = geo.boxes_overlap(p2, h2, l, w, p1, h1, l, w)
    assert torch.equal(ab, ba) and 0 < int(ab.sum()) < 200


def _straight_lane(half_width=1.75):
    pts = torch.stack([torch.linspace(0, 100, 20), torch.zeros(20)], -1)
    a, b, hw = geo.segments_of(pts[None, None], torch.ones(1, 1, dtype=torch.bool), torch.full((1, 1), half_width))
    return a, b, hw


def _offroad(x, y, h, length=4.0, width=2.0):
    a, b, hw = _straight_lane()
    return bool(offroad(T([[[x, y]]]), T([[h]]), T([[length]]), T([[width]]), a, b, hw)[0, 0])


def test_car_leaving_the_road():
    assert not _offroad(50.0, 0.0, 0.0)  # on the centreline
    assert not _offroad(50.0, 0.7, 0.0)  # corner at 1.7 m < 1.75 m
    assert _offroad(50.0, 0.8, 0.0)  # corner at 1.8 m > 1.75 m
    assert _offroad(50.0, 0.0, math.pi / 2)  # turned across the lane: front corners stick out
    assert _offroad(50.0, 6.0, 0.0)  # fully off


def test_bicycle_straight_line_closed_form():
    state = T([[1.0, 2.0, 0.3, 5.0]])
    controls = T([[1.5, 0.0]]).expand(30, 2)[None]
    out = bicycle_rollout(state, controls, T([2.7]))
    t = 0.1 * torch.arange(1, 31)
    dist = 5.0 * t + 0.5 * 1.5 * t**2
    assert torch.allclose(out[0, :, 0], 1.0 + dist * math.cos(0.3), atol=1e-4)
    assert torch.allclose(out[0, :, 1], 2.0 + dist * math.sin(0.3), atol=1e-4)
    assert torch.allclose(out[0, :, 3], 5.0 + 1.5 * t, atol=1e-5)


def test_bicycle_constant_turn_radius():
    wb, steer, h0 = 2.7, 0.2, 0.4
    radius = wb / math.tan(steer)
    state = T([[0.0, 0.0, h0, 8.0]])
    out = bicycle_rollout(state, T([[0.0, steer]]).expand(50, 2)[None], T([wb]))
    centre = T([-radius * math.sin(h0), radius * math.cos(h0)])
    r = (out[0, :, :2] - centre).norm(dim=-1)
    assert torch.allclose(r, torch.full_like(r, radius), atol=1e-3)
    # heading advances by arc length / radius
    assert torch.allclose(out[0, -1, 2], T(h0 + 8.0 * 5.0 / radius), atol=1e-4)


def test_bicycle_is_differentiable_in_controls():
    u = T([[0.5, 0.1]], requires_grad=True)
    nxt = bicycle_step(T([[0.0, 0.0, 0.0, 10.0]]), u, T([2.7]))
    nxt[0, 1].backward()
    assert u.grad[0, 1].abs() > 0


def test_inverse_dynamics_round_trip():
    g = torch.Generator().manual_seed(1)
    b, h = 16, 40
    state = torch.cat([torch.randn(b, 2, generator=g) * 10, torch.rand(b, 1, generator=g) * 6, 3 + 10 * torch.rand(b, 1, generator=g)], -1)
    controls = torch.stack([torch.randn(b, h, generator=g), 0.2 * torch.randn(b, h, generator=g).clamp(-2, 2)], -1)
    wb = 2.5 + torch.rand(b, generator=g)
    states = bicycle_rollout(state, controls, wb)
    full = torch.cat([state[:, None], states], 1)
    rec = inverse_dynamics(full, wb)
    moving = full[:, 1:, 3] > 0.1
    assert torch.allclose(rec[..., 0], controls[..., 0], atol=1e-3)
    assert torch.allclose(rec[..., 1][moving], controls[..., 1][moving], atol=1e-3)
    again = bicycle_rollout(state, rec, wb)
    assert torch.allclose(again[..., :2], states[..., :2], atol=1e-3)
