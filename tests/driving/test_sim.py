"""Simulator, traffic and scene generation against hand-built cases."""
from types import SimpleNamespace

import pytest
import torch

from planners.driving import traffic
from planners.driving.expert import ExpertConfig, run_expert
from planners.driving.metrics import (RewardWeights, dense_reward_terms, episode_metric_pairs, metrics_by_kind,
                                      penalised_collisions)
from planners.driving.scenes import ROUTE_FEATURES, SCENE_KINDS, Scene, SceneConfig, make_scene, make_scenes
from planners.driving.sim import ChunkRecord, DrivingEnv, DrivingEnvConfig, collision_blame

IDM = (25.0, 1.5, 1.5, 2.0, 2.0)  # v0, T, a_max, b, s0


def straight_scene(s_leader: float, s_follower: float, speed: float, length: float = 1200.0) -> Scene:
    """One straight lane along +x; slot 0 (controlled, A = 1) leads, slot 1 (background) follows."""
    r = int(length) + 1
    x = torch.arange(r, dtype=torch.float32)
    route = torch.stack([x, torch.zeros(r), torch.zeros(r), torch.ones(r)], -1)
    poly_x = torch.linspace(0, length, 20)
    polyline = torch.stack([poly_x, torch.zeros(20), torch.ones(20), torch.zeros(20), torch.full((20,), 1.75), torch.ones(20)], -1)
    agents = torch.zeros(1, 2, 2, 8)
    for n, s in enumerate((s_leader, s_follower)):
        agents[0, n, :, 0] = torch.tensor([s - 0.1 * speed, s])
        agents[0, n, :, 3] = speed
        agents[0, n, :, 5:8] = torch.tensor([4.5, 1.9, 1.0])
    return Scene(
        agents=agents, agent_mask=torch.ones(1, 2, dtype=torch.bool), controlled=torch.tensor([[True, False]]),
        polylines=polyline[None, None], polyline_mask=torch.ones(1, 1, dtype=torch.bool),
        routes=route[None, None].repeat(1, 2, 1, 1), route_length=torch.full((1, 2), length),
        route_s=torch.tensor([[s_leader, s_follower]]), lane_routes=torch.zeros(1, 0, r, len(ROUTE_FEATURES)),
        lane_index=torch.full((1, 2), -1), num_lanes=torch.zeros(1, dtype=torch.long), lane_width=torch.tensor([3.5]),
        idm=torch.tensor([IDM, IDM])[None], speed_limit=torch.tensor([25.0]), kind=torch.zeros(1, dtype=torch.long),
        seed=torch.zeros(1, dtype=torch.long), max_controlled=torch.ones(1, dtype=torch.long),
    )


def test_idm_equilibrium_formula():
    v = 15.0
    s_e = traffic.idm_equilibrium_gap(v, IDM)
    a = traffic.idm_accel(torch.tensor(v), torch.tensor(v), torch.tensor(s_e), torch.tensor(IDM))
    assert abs(float(a)) < 1e-5


def test_idm_steady_state_following_distance_in_the_simulator():
    v = 15.0
    env = DrivingEnv(DrivingEnvConfig(episode_steps=10_000))
    state = env.reset_scene(straight_scene(60.0, 20.0, v))
    zero = torch.zeros(1, 1, 2)  # the controlled leader cruises at constant speed
    for _ in range(700):
        state, rec = env.tick(state, zero)
    gap = float(state.pos[0, 0, 0] - state.pos[0, 1, 0]) - 4.5
    assert abs(float(state.speed[0, 1]) - v) < 0.05
    assert abs(gap - traffic.idm_equilibrium_gap(v, IDM)) < 0.3, gap
    assert not rec["collision"].any() and not rec["offroad"].any()


def test_sim_flags_a_collision_and_leaving_the_road():
    env = DrivingEnv()
    state = env.reset_scene(straight_scene(30.0, 20.0, 10.0))
    # the controlled car steers hard left off a 3.5 m wide straight lane
    state, rec = env.tick(state, torch.tensor([[[0.0, 0.0]]]))
    assert not rec["offroad"].any()
    for _ in range(15):
        state, rec = env.tick(state, torch.tensor([[[0.0, 0.6]]]))
    assert rec["offroad"][0, 0]
    # a controlled car placed on top of the background one collides
    state = env.reset_scene(straight_scene(22.0, 20.0, 10.0))
    state, rec = env.tick(state, torch.zeros(1, 1, 2))
    assert rec["collision"][0, 0]


def test_rear_end_blame_falls_on_the_follower():
    env = DrivingEnv()
    # the controlled car (slot 0) is hit from behind by the background car: not at fault
    # ... but hit by background traffic, which at_fault_or_traffic penalises
    _, rec = env.tick(env.reset_scene(straight_scene(22.0, 20.0, 10.0)), torch.zeros(1, 1, 2))
    assert rec["collision"][0, 0] and not rec["collision_at_fault"][0, 0] and rec["collision_by_traffic"][0, 0]
    # the controlled car drives into the background car ahead of it: at fault, not hit by it
    _, rec = env.tick(env.reset_scene(straight_scene(20.0, 22.0, 10.0)), torch.zeros(1, 1, 2))
    assert rec["collision"][0, 0] and rec["collision_at_fault"][0, 0] and not rec["collision_by_traffic"][0, 0]


def test_hit_by_traffic_only_counts_background_partners():
    # two vehicles along +x: slot 1 (at x = 0) rear-ends slot 0 (at x = 4)
    pos = torch.tensor([[[4.0, 0.0], [0.0, 0.0]]])
    heading = torch.zeros(1, 2)
    pairs = torch.tensor([[[False, True], [True, False]]])
    # the follower is another planned vehicle: the leader is neither at fault nor hit by traffic
    fault, by_traffic = collision_blame(pairs, pos, heading, torch.tensor([[False, False]]))
    assert by_traffic.tolist() == [[False, False]]
    assert fault.tolist() == [[False, True]]
    # the follower is background traffic: the leader is hit by traffic
    _, by_traffic = collision_blame(pairs, pos, heading, torch.tensor([[False, True]]))
    assert by_traffic.tolist() == [[True, False]]


def test_scene_determinism_and_layout():
    cfg = SceneConfig()
    a, b = make_scene(5, cfg), make_scene(5, cfg)
    for k, v in a.tensors().items():
        assert torch.equal(v, getattr(b, k)), k
    c = make_scene(6, cfg)
    assert not torch.equal(a.agents, c.agents)
    batch = make_scenes([5, 6], cfg)
    assert torch.equal(batch[0].agents, a.agents)
    n = cfg.num_agents
    for kind in SCENE_KINDS:
        s = make_scene(11, cfg, kind=kind)
        assert s.agents.shape == (1, n, cfg.history, 8)
        assert s.polylines.shape == (1, cfg.max_polylines, cfg.polyline_points, 6)
        assert s.routes.shape[:2] == (1, n) and s.routes.shape[-1] == 4
        assert cfg.min_controlled <= int(s.controlled.sum()) <= cfg.max_controlled
        assert not s.controlled[0, cfg.max_controlled:].any()
        assert bool(s.agent_mask[0, s.controlled[0]].all())


def test_batched_sim_equals_per_scene_sim():
    env = DrivingEnv()
    scenes = [make_scene(20 + i, kind=k) for i, k in enumerate(SCENE_KINDS)]
    g = torch.Generator().manual_seed(0)
    controls = torch.randn(3, 8, 15, 2, generator=g) * torch.tensor([1.0, 0.05])
    batched = env.reset_scene(Scene.stack(scenes))
    for k in range(15):
        batched, _ = env.tick(batched, controls[:, :, k])
    for i, sc in enumerate(scenes):
        solo = env.reset_scene(sc)
        for k in range(15):
            solo, _ = env.tick(solo, controls[i:i + 1, :, k])
        assert torch.allclose(solo.pos, batched.pos[i:i + 1], atol=1e-3)
        assert torch.equal(solo.alive, batched.alive[i:i + 1])


def test_env_protocol_step_and_expert_runs():
    env = DrivingEnv(DrivingEnvConfig(episode_steps=10))
    state = env.reset(list(range(2)), [3, 4])
    obs = env.observe(state)
    assert len(obs) == 2 and obs.agents.shape[2] == env.config.scene.history
    a = obs.num_slots
    state, reward, done = env.step(state, torch.zeros(2, a, 20, 2))
    assert reward.shape == (2, a) and done.shape == (2,) and not done.any()
    assert bool((reward[~state.last_chunk.valid] == 0).all())
    state, _, done = env.step(state, torch.zeros(2, a, 20, 2))
    assert done.all()
    final, out = run_expert(env, env.reset([0], [7]), 5)
    assert out["ctrl_states"].shape == (1, a, 6, 4)


def test_yielding_expert_avoids_junction_collisions():
    """expert.yield_prob: agents that yield at conflict points (gap acceptance) collide less at
    junctions; yield_prob = 0 is the imperfect expert, draw for draw."""
    env = DrivingEnv(DrivingEnvConfig(scene=SceneConfig(kinds=("intersection", "roundabout")), episode_steps=60))
    scenes = make_scenes(list(range(24)), env.config.scene)
    runs = {}
    for p in (0.0, 1.0):
        _, out = run_expert(env, env.reset_scene(scenes), 60, ExpertConfig(yield_prob=p), seed=0)
        collided = torch.stack([r["collision"] for r in out["records"]], -1).any(-1)
        runs[p] = (int(collided.sum()), out["ctrl_states"])
    assert runs[1.0][0] <= runs[0.0][0] // 2 and runs[0.0][0] >= 6  # measured: 12 -> 4 agents
    _, plain = run_expert(env, env.reset_scene(scenes), 60, seed=0)
    assert torch.equal(plain["ctrl_states"], runs[0.0][1])
    with pytest.raises(ValueError, match="yield_prob"):
        ExpertConfig(yield_prob=1.5)


def test_dense_reward_weights():
    col = torch.tensor([[[False, True], [False, False]]])
    off = torch.tensor([[[False, False], [True, True]]])
    r = dense_reward_terms(col, off, torch.tensor([[2.0, 4.0]]), torch.tensor([[4.0, 4.0]]), weights=RewardWeights())
    assert torch.allclose(r, torch.tensor([[-8.0 + 4 * 0.5, -1.0 + 4 * 1.0]]))
    # collision_reward picks which collision flags the dense reward reads
    assert RewardWeights.from_env(DrivingEnvConfig()).collisions == "any"
    f, t = torch.tensor([[[False]]]), torch.tensor([[[True]]])
    chunk = SimpleNamespace(collision=t, collision_at_fault=f, collision_by_traffic=t)
    for which, hit in (("any", True), ("at_fault", False), ("at_fault_or_traffic", True)):
        w = RewardWeights.from_env(DrivingEnvConfig(collision_reward=which))
        assert w.collisions == which and bool(penalised_collisions(chunk, w.collisions).any()) == hit
    chunk.collision_by_traffic = f  # hit from behind by a planned vehicle: only "any" penalises it
    assert not penalised_collisions(chunk, "at_fault_or_traffic").any()
    with pytest.raises(ValueError, match="collision_reward"):
        DrivingEnvConfig(collision_reward="victim")


def test_metrics_by_kind_are_exact_subsets_with_agent_weights():
    # 3 scenes x 2 agent slots, 2 ticks: scene 0 highway (2 agents, one collides), scene 1
    # intersection (1 agent, collides), scene 2 highway (1 agent, no collision)
    valid = torch.tensor([[True, True], [True, False], [True, False]])
    coll = torch.zeros(3, 2, 2, dtype=torch.bool)
    coll[0, 1, 1] = coll[1, 0, 0] = True
    coll[1, 1, :] = True  # an unused slot's flags never count
    speed = torch.tensor([[[10.0, 12.0], [8.0, 8.0]], [[4.0, 6.0], [99.0, 99.0]], [[20.0, 20.0], [99.0, 99.0]]])
    z = torch.zeros(3, 2, 2, dtype=torch.bool)
    rec = ChunkRecord(collision=coll, collision_at_fault=coll, collision_by_traffic=z, offroad=z, ttc_unsafe=z,
                      comfort=z, speed=speed, accel=torch.zeros(3, 2, 2), curvature=torch.zeros(3, 2, 2),
                      pos=torch.zeros(3, 2, 2, 2), progress=torch.zeros(3, 2), expected=torch.ones(3, 2), valid=valid)
    kind = torch.tensor([SCENE_KINDS.index("highway"), SCENE_KINDS.index("intersection"), SCENE_KINDS.index("highway")])
    by = metrics_by_kind(rec, kind, SCENE_KINDS)
    assert by["collision_rate/highway"] == pytest.approx((1 / 3, 3.0))
    assert by["collision_rate/intersection"] == pytest.approx((1.0, 1.0))
    assert by["avg_speed/highway"] == pytest.approx(((10 + 12 + 8 + 8 + 20 + 20) / 6, 6.0))
    assert not any(k.endswith("/roundabout") for k in by)  # no roundabout agent: left out
    # the weighted per-kind means give back the overall means
    overall = episode_metric_pairs(rec)
    for name in ("collision_rate", "avg_speed"):
        parts = [v for k, v in by.items() if k.startswith(name + "/")]
        total = sum(m * w for m, w in parts)
        assert overall[name][1] == sum(w for _, w in parts)
        assert overall[name][0] == pytest.approx(total / overall[name][1])
