"""Planner denoiser (shapes, AdaLN-Zero identity at init) and the demonstration cache."""
import torch

from planners.driving.data import DemoConfig, DemoDataset, load_demos, record_demos, save_demos
from planners.driving.dynamics import bicycle_rollout, wheelbase_of
from planners.driving.model import (PlannerConfig, PlannerDenoiser, denoising_loss, leader_features,
                                    rollout_controls, scene_features, timestep_embedding)
from planners.driving.scenes import make_scenes

SMALL = PlannerConfig(d_model=32, heads=4, decoder_blocks=2)


def _cond(seeds=(1, 2, 3)):
    return scene_features(make_scenes(list(seeds)))


def test_denoiser_shapes_and_zero_output_at_init():
    torch.manual_seed(0)
    model = PlannerDenoiser(SMALL).eval()
    cond = _cond()
    a = cond["agent_valid"].shape[1]
    x = torch.randn(3, a, SMALL.horizon, 2)
    v = model(x, torch.rand(3), cond)
    assert v.shape == x.shape
    assert torch.equal(v, torch.zeros_like(v))  # zero-initialised head (DiT)
    v.sum().backward()
    assert model.out.weight.grad.abs().sum() > 0


def test_leader_features_hand_built_lane():
    # AGENT_FEATURES x, y, heading, vx, vy, length, width, valid; slots 0 and 1 are controlled.
    # Slot 0 at 10 m/s; agent 2 is 20 m ahead in its lane at 5 m/s (bumper gap 20 - 4 = 16 m);
    # agent 3 is ahead but in the next lane (4.5 m aside); agent 4 is ahead in its lane but
    # oncoming. Slot 1 has nobody ahead in its lane.
    now = torch.tensor([[[0.0, 0.0, 0.0, 10.0, 0.0, 4.0, 2.0, 1.0],
                         [-30.0, 4.5, 0.0, 8.0, 0.0, 4.0, 2.0, 1.0],
                         [20.0, 0.5, 0.0, 5.0, 0.0, 4.0, 2.0, 1.0],
                         [10.0, 4.5, 0.0, 1.0, 0.0, 4.0, 2.0, 1.0],
                         [12.0, 0.0, 3.14159, -9.0, 0.0, 4.0, 2.0, 1.0]]])
    valid = torch.ones(1, 5, dtype=torch.bool)
    out = leader_features(now, valid, a=2)
    assert out.shape == (1, 2, 3)
    assert torch.allclose(out[0, 0], torch.tensor([16 / 50, (10 - 5) / 10, 1.0]))
    # slot 1's lane (y = 4.5) holds agent 3, 36 m ahead (gap 36 m), slower by 7 m/s
    assert torch.allclose(out[0, 1], torch.tensor([36 / 50, 0.7, 1.0]))
    valid[0, 3] = False  # an invalid slot is never a leader
    assert torch.allclose(leader_features(now, valid, a=2)[0, 1], torch.tensor([1.0, 0.0, 0.0]))


def test_leader_input_is_opt_in_and_old_checkpoints_load():
    cond = _cond()
    assert cond["leader"].shape == cond["agent_valid"].shape + (3,)
    assert PlannerDenoiser(SMALL).leader_in is None  # the committed planner's architecture
    model = PlannerDenoiser(PlannerConfig(d_model=32, heads=4, leader_features=True)).eval()
    a = cond["agent_valid"].shape[1]
    assert model(torch.randn(3, a, SMALL.horizon, 2), torch.rand(3), cond).shape == (3, a, SMALL.horizon, 2)


def test_decoder_blocks_are_identity_at_init():
    torch.manual_seed(0)
    model = PlannerDenoiser(SMALL).eval()
    cond = _cond()
    scene, pad, _ = model.encode_scene(cond)
    h = torch.randn(3, cond["agent_valid"].shape[1], SMALL.d_model)
    c = torch.randn(3, SMALL.d_model)
    for blk in model.blocks:
        assert torch.equal(blk(h, c, ~cond["agent_valid"], scene, pad), h)
    # once the gates are non-zero the block is not the identity any more
    with torch.no_grad():
        model.blocks[0].ada[1].bias.fill_(0.1)
    assert not torch.allclose(model.blocks[0](h, c, ~cond["agent_valid"], scene, pad), h)


def test_denoiser_is_permutation_equivariant_over_samples_and_time_conditioned():
    torch.manual_seed(0)
    model = PlannerDenoiser(SMALL).eval()
    for p in model.parameters():  # leave the zero init so the output depends on everything
        torch.nn.init.normal_(p, std=0.05)
    cond = _cond()
    a = cond["agent_valid"].shape[1]
    x = torch.randn(3, a, SMALL.horizon, 2)
    t = torch.tensor([0.2, 0.5, 0.9])
    v = model(x, t, cond)
    v1 = model(x[1:2], t[1:2], {k: val[1:2] for k, val in cond.items()})
    assert torch.allclose(v[1:2], v1, atol=1e-5)
    assert not torch.allclose(model(x, t.flip(0), cond), v)
    assert timestep_embedding(t, 8).shape == (3, 8)


def test_rollout_controls_and_loss_are_differentiable():
    torch.manual_seed(0)
    model = PlannerDenoiser(SMALL)
    cond = _cond((4, 5))
    a = cond["agent_valid"].shape[1]
    controls = torch.zeros(2, a, SMALL.horizon, 2)
    states = rollout_controls(cond["ego_state"], controls, cond["wheelbase"])
    assert states.shape == (2, a, SMALL.horizon, 4)
    out = denoising_loss(model, cond, controls, torch.Generator().manual_seed(0))
    out["loss"].backward()
    assert torch.isfinite(out["loss"]) and model.out.weight.grad.abs().sum() > 0


def test_demos_round_trip_and_windows(tmp_path):
    cfg = DemoConfig(num_scenes=2, episode_steps=25, horizon=10, stride=5, chunk=2)
    tensors, meta = record_demos(cfg)
    assert meta["inverse_dynamics_max_error_m"] < 1e-3
    # the recovered controls reproduce the recorded states
    st, u = tensors["ctrl_states"], tensors["controls"]
    wb = wheelbase_of(tensors["agents_full"][:, : u.shape[1], -1, 5].clamp(min=1.0))
    valid = tensors["controlled"][:, : u.shape[1]]
    replay = bicycle_rollout(st[..., 0, :], u, wb)
    assert torch.allclose(replay[valid][..., :2], st[..., 1:, :2][valid], atol=1e-3)
    save_demos(tensors, meta, str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demos.safetensors", "meta.json"]
    loaded, meta2 = load_demos(str(tmp_path))
    assert all(torch.equal(loaded[k], v) for k, v in tensors.items())
    ds = DemoDataset(loaded, cfg.horizon, cfg.stride, eval_fraction=0.5)
    assert len(ds) == 4 and ds.eval_items() == [1]
    obs, x0, cols = ds.get(torch.tensor([0, 3]))
    a = x0.shape[1]
    assert x0.shape == (2, a, 10, 2) and cols["expert_states"].shape == (2, a, 10, 4)
    # the window's ego state is the observation's current state
    ego = scene_features(obs)["ego_state"]
    m = cols["agent_valid"]
    assert torch.allclose(ego[m], cols["ego_state"][m], atol=1e-4)
