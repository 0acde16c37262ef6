"""PTR weight formula, self-normalisation and the scorer's InfoNCE loss on hand-made tensors."""
import math

import pytest
import torch

from flowrl.algorithms.ptr import (PTR, PTRConfig, auroc, clip_bounds, effective_sample_size, info_nce_loss,
                                   posterior_scores, ptr_weights, weighted_regression)

torch.set_num_threads(1)


def test_info_nce_matches_hand_computation():
    logits = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 3.0]])
    target = torch.tensor([0, 2, 3])
    got = info_nce_loss(logits, target)
    want = torch.tensor([-(2 - math.log(math.exp(2) + 3)), math.log(4.0), -(3 - math.log(2 + math.e + math.exp(3)))])
    assert torch.allclose(got, want, atol=1e-6)
    assert got.shape == (3,)


def test_posterior_score_is_k_times_posterior():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, -10.0, -10.0, -10.0], [-10.0, 10.0, -10.0, -10.0]])
    r = posterior_scores(logits, torch.tensor([0, 0, 0]))
    assert torch.allclose(r[0], torch.tensor(1.0))           # uniform posterior -> 1
    assert abs(float(r[1]) - 4.0) < 1e-6                     # certain -> K
    assert float(r[2]) < 1e-6                                # wrong -> 0
    # consistent with the loss: r = K * exp(-CE)
    ce = info_nce_loss(logits, torch.tensor([0, 0, 0]))
    assert torch.allclose(r, 4 * torch.exp(-ce), atol=1e-6)


def test_weight_formula():
    r = torch.tensor([0.0, 0.5, 1.0, 3.0, 100.0])
    w = ptr_weights(r, lam=0.5, w_min=0.5, w_max=2.0)
    assert torch.allclose(w, torch.tensor([0.75, 0.75, 1.0, 1.5, 1.5]))
    assert torch.allclose(ptr_weights(r, 0.0, 0.5, 2.0), torch.ones(5))     # lam = 0: uniform
    assert torch.allclose(ptr_weights(r, 1.0, 0.5, 2.0), r.clamp(0.5, 2.0))
    with pytest.raises(ValueError):
        ptr_weights(r, 1.5, 0.5, 2.0)
    with pytest.raises(ValueError):
        ptr_weights(r, 0.5, 2.0, 0.5)


def test_clip_bounds_follow_spread():
    r = torch.arange(101, dtype=torch.float)   # 0..100
    assert clip_bounds(r, 0.1, 0.9) == pytest.approx((10.0, 90.0))
    # saturated scores (every r near K): bounds collapse, so the weights are uniform
    lo, hi = clip_bounds(torch.full((50,), 31.5), 0.1, 0.9)
    assert torch.allclose(ptr_weights(torch.full((50,), 31.5), 1.0, lo, hi), torch.full((50,), 31.5))


def test_self_normalisation():
    per = torch.tensor([1.0, 2.0, 4.0])
    w = torch.tensor([1.0, 0.0, 3.0])
    assert float(weighted_regression(per, w)) == pytest.approx((1 + 12) / 4)
    assert float(weighted_regression(per, 7 * w)) == pytest.approx(float(weighted_regression(per, w)))  # scale-free
    assert float(weighted_regression(per, torch.ones(3))) == pytest.approx(per.mean().item())


def test_ptr_algorithm_units_and_trainer_reduction():
    alg = PTR(PTRConfig(lam=1.0, w_min=0.5, w_max=2.0))
    x0 = torch.zeros(4, 8, 4)
    units = alg.make_offline_units(x0, {"ptr_score": torch.tensor([0.1, 1.0, 1.5, 9.0])})
    assert torch.allclose(units["weight"], torch.tensor([0.5, 1.0, 1.5, 2.0]))
    assert torch.equal(alg.unit_norm(units), units["weight"])   # trainer divides by sum(w)
    with pytest.raises(ValueError):
        alg.make_offline_units(x0, {"other": torch.ones(4)})
    with pytest.raises(ValueError):
        PTRConfig(weight_key="quality")


def test_ess_and_auroc():
    assert effective_sample_size(torch.ones(10)) == pytest.approx(1.0)
    assert effective_sample_size(torch.tensor([1.0, 0, 0, 0])) == pytest.approx(0.25)
    pos = torch.tensor([1, 1, 0, 0]).bool()
    assert auroc(torch.tensor([3.0, 4.0, 1.0, 2.0]), pos) == 1.0
    assert auroc(torch.tensor([1.0, 2.0, 3.0, 4.0]), pos) == 0.0
    assert auroc(torch.ones(4), pos) == 0.5
