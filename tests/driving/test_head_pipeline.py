"""The driving head (flowrl Head contract), per-state candidate groups in the two-layer MDP,
the offline regression hook, and the CI-sized closed-loop pipeline (determinism)."""
import copy
import math
import json
import sys
from pathlib import Path

import pytest
import torch

import flowrl.builtins  # noqa: F401
from flowrl.heads.base import check_head_contract
from flowrl.mdp import ChainConfig, ClosedLoop, DenoisingChain
from flowrl.samplers import SamplerConfig, build_sampler
from planners.driving import DrivingEnv, DrivingEnvConfig, DrivingHead, DrivingHeadConfig
from planners.driving.data import DemoConfig
from planners.driving.model import PlannerConfig
from planners.driving.scenes import SCENE_KINDS, make_scenes
from planners.driving.sources import DrivingDemos, DrivingDemosConfig, DrivingScenes, DrivingScenesConfig

ROOT = Path(__file__).resolve().parents[2]
SMALL = PlannerConfig(d_model=32, heads=4, decoder_blocks=1, horizon=10)


def _head(perturb: bool = True) -> DrivingHead:
    head = DrivingHead(DrivingHeadConfig(planner=SMALL))
    if perturb:  # the output layer is zero-initialised (DiT): give it a gradient path
        with torch.no_grad():
            head.model.out.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
        head.reference = copy.deepcopy(head.model).requires_grad_(False)
    return head


def test_head_contract_and_round_trip(tmp_path):
    head = _head()
    scenes = make_scenes([1, 2, 3])
    check_head_contract(head, scenes, str(tmp_path / "h"))
    again = DrivingHead.from_pretrained(str(tmp_path / "h"))
    cond = head.encode(scenes)
    assert head.encode([scenes[0], scenes[1], scenes[2]])["agents"].equal(cond["agents"])
    x = head.init_noise(cond, [torch.Generator().manual_seed(i) for i in range(3)])
    t = torch.full((3,), 0.4)
    assert torch.allclose(head.velocity(x, t, cond), again.velocity(x, t, cond), atol=1e-6)
    assert torch.allclose(again.reference_velocity(x, t, cond), again.velocity(x, t, cond).detach(), atol=1e-5)
    # x is normalised; decode gives physical (accel, steer)
    assert torch.allclose(head.decode(torch.ones_like(x), cond)[..., 0], torch.full_like(x[..., 0], 3.0))
    assert head.event_ndim == 2 and x.shape[1:] == (cond["agent_valid"].shape[1], SMALL.horizon, 2)


def test_candidates_execute_the_best_and_group_per_state():
    env = DrivingEnv(DrivingEnvConfig(episode_steps=10, execute_steps=5, score_steps=5))
    head = _head()
    sampler = build_sampler(SamplerConfig(name="flow_sde", eta=1.0))
    chain = DenoisingChain(ChainConfig(num_steps=2))
    b, g, e = 2, 3, env.config.num_env_steps
    loop = ClosedLoop(head, sampler, chain, e, candidates_per_state=g)
    res = loop.rollout(env, [11, 12], [0, 0],
                       lambda k: [torch.Generator().manual_seed(100 * k + i) for i in range(b * g)])
    a = res.scores.shape[-1]
    assert res.states.shape[0] == b * e * g and res.log_probs.shape == (b * e * g, 2, a)
    assert res.episode.tolist() == [0] * (e * g) + [1] * (e * g)
    assert res.env_step.tolist()[: e * g] == [0, 0, 0, 1, 1, 1] and res.candidate.tolist()[:4] == [0, 1, 2, 0]
    # score_steps == execute_steps and the simulator is deterministic: what was executed is
    # exactly the best candidate, so the return is the sum of the per-state best scores
    sc = res.scores.view(b, e, g, a)
    ok = res.score_valid.view(b, e, g, a).float()
    mean = (sc * ok).sum(-1) / ok.sum(-1).clamp(min=1)
    best = sc.gather(2, mean.argmax(-1)[..., None, None].expand(b, e, 1, a))[:, :, 0]
    assert torch.allclose(res.returns, best.sum(1), atol=1e-4)
    assert res.final_state.episode.pos.shape[2] == env.config.episode_steps
    metrics = env.episode_metrics(res.final_state)  # {name: (mean, weight)}
    agents = float(res.final_state.episode.valid.sum())
    for k in ("collision_rate", "offroad_rate", "avg_speed", "progress", "ttc_unsafe_frac",
              "comfort_violation_frac", "route_completion", "ade"):
        mean, weight = metrics[k]
        assert math.isfinite(mean) and weight in (agents, agents * env.config.episode_steps)
    kinds = {SCENE_KINDS[int(k)] for k in res.final_state.scene.kind}
    assert {k.split("/")[1] for k in metrics if "/" in k} == kinds


def test_shared_init_noise_starts_every_candidate_of_a_state_alike(tmp_path):
    from flowrl.config import load_config
    from flowrl.trainer import Trainer

    # ClosedLoop: separate start generators, one seed per (episode, step) repeated over the group
    env = DrivingEnv(DrivingEnvConfig(episode_steps=10, execute_steps=5, score_steps=5))
    loop = ClosedLoop(_head(), build_sampler(SamplerConfig(name="flow_sde", eta=1.0)),
                      DenoisingChain(ChainConfig(num_steps=2)), env.config.num_env_steps, candidates_per_state=3)
    chains = lambda k: [torch.Generator().manual_seed(100 * k + i) for i in range(6)]  # noqa: E731
    starts = lambda k: [torch.Generator().manual_seed(7 + 10 * k + i // 3) for i in range(6)]  # noqa: E731
    shared, own = loop.rollout(env, [11, 12], [0, 0], chains, starts), loop.rollout(env, [11, 12], [0, 0], chains)
    x0, x1 = shared.states[:, 0].view(-1, 3, *shared.states.shape[2:]), shared.states[:, 1].view(-1, 3, *shared.states.shape[2:])
    assert torch.equal(x0[:, 0], x0[:, 1]) and torch.equal(x0[:, 0], x0[:, 2])  # one start per state
    assert not torch.equal(x1[:, 0], x1[:, 1])  # the step noise still differs
    assert not torch.equal(own.states[0, 0], own.states[1, 0])  # default: each chain's own start
    with pytest.raises(ValueError, match="make_init_generators gave 2"):
        loop.rollout(env, [11, 12], [0, 0], chains, lambda k: chains(k)[:2])
    # the trainer honours the algorithm's shared_init_noise in closed loop too
    for shared_init in (True, False):
        cfg = load_config(str(ROOT / "configs/driving/ci.yaml"),
                          [f"output_dir={tmp_path / str(shared_init)}", f"algorithm.shared_init_noise={shared_init}"])
        trainer = Trainer(cfg)
        traj = trainer.collect(0)[0]
        trainer.close()
        first = {}
        for gid, x in zip(traj.group_ids.tolist(), traj.states[:, 0]):
            first.setdefault(gid, []).append(x)
        alike = [all(torch.equal(xs[0], x) for x in xs[1:]) for xs in first.values()]
        assert all(alike) if shared_init else not any(alike)


def test_sources_are_disjoint_and_demos_train_offline(tmp_path):
    src = DrivingScenes(DrivingScenesConfig(num_train=16, num_eval=4))
    assert not set(src.train_items()) & set(src.eval_items())
    with pytest.raises(ValueError, match="overlap"):
        DrivingScenesConfig(first_seed=99_990, num_train=20)
    demos = DrivingDemos(DrivingDemosConfig(directory=str(tmp_path / "demos"), num_eval=4,
                                            demos=DemoConfig(num_scenes=2, episode_steps=20, horizon=10, stride=5)))
    items, x0, cols = demos.get(torch.arange(3))
    assert x0.shape[0] == 3 and x0.abs().max() < 10  # normalised controls
    assert not set(int(s) for s in demos.demos.t["seed"]) & set(demos.eval_items())
    # flow matching uses the head's regression hook (masked FM + reached-state loss)
    from flowrl.algorithms.base import Policy
    from flowrl.algorithms.flow_matching import FlowMatching, FlowMatchingConfig

    head = _head()
    algo = FlowMatching(FlowMatchingConfig())
    units = algo.make_offline_units(x0, cols)
    policy = Policy(velocity=head, reference_velocity=head.reference_velocity,
                    sampler=build_sampler(SamplerConfig(name="euler")), event_ndim=2)
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    per, _ = algo.loss(units, head.encode(items), policy, gens)
    head.config.state_weight = 0.0
    per_fm, _ = algo.loss(units, head.encode(items), policy, [torch.Generator().manual_seed(i) for i in range(3)])
    assert per.shape == (3,) and bool((per > per_fm).all())


def test_ci_config_runs_and_is_deterministic(tmp_path):
    from flowrl.config import load_config
    from flowrl.trainer import Trainer

    reports = []
    for run in ("a", "b"):
        cfg = load_config(str(ROOT / "configs/driving/ci.yaml"), [f"output_dir={tmp_path / run}", "max_steps=1"])
        trainer = Trainer(cfg)
        reports.append(trainer.train())
        trainer.close()
    assert reports[0] == reports[1]
    for k in ("return", "collision_rate", "offroad_rate", "avg_speed", "progress", "ttc_unsafe_frac", "ade"):
        assert k in reports[0]["after"]
    kinds = [k.split("/")[1] for k in reports[0]["after"] if k.startswith("collision_rate/")]
    assert kinds and set(kinds) <= set(SCENE_KINDS)  # the per-kind breakdown reaches report.json
    assert list((tmp_path / "a" / "rollouts").glob("after-*.gif"))
    rows = [json.loads(line) for line in open(tmp_path / "a" / "metrics.jsonl")]
    assert "adv/dropped_group_frac" in rows[-1] and "policy/kl_ref" in rows[-1] and "grad_norm" in rows[-1]


def test_eval_best_of_executes_the_best_of_the_policys_own_candidates(tmp_path):
    from flowrl.cli import main
    from flowrl.config import load_config
    from flowrl.trainer import Trainer

    # one replan per episode, scored over exactly the executed ticks: best-of-G includes the
    # plain evaluation's chunk (candidate 0 draws the same noise), so no episode can score lower
    one_chunk = ["env.episode_steps=5", "env.score_steps=5", "eval.num_items=4"]
    returns = {}
    for g in (1, 4):
        cfg = load_config(str(ROOT / "configs/driving/ci.yaml"), [f"output_dir={tmp_path / str(g)}", f"eval.best_of={g}"] + one_chunk)
        trainer = Trainer(cfg, for_eval=True)
        returns[g] = trainer._evaluate_closed_loop(cfg.eval.seed)["return"]
        trainer.close()
    assert returns[4] > returns[1]
    out = tmp_path / "toy"
    assert main(["train", str(ROOT / "configs/toy/fdfo.yaml"), f"output_dir={out}", "eval.best_of=2"]) == 2
    assert not out.exists()  # no environment scores candidates: a one-line config error before anything is written


def test_env_longer_than_the_chunk_is_a_config_error(tmp_path):
    from flowrl.cli import main

    out = tmp_path / "run"
    code = main(["train", str(ROOT / "configs/driving/ci.yaml"), f"output_dir={out}", "env.score_steps=21"])
    assert code == 2 and not out.exists()  # the 20-tick planner cannot be scored over 21 ticks


def test_example_smoke(tmp_path, monkeypatch, capsys):
    import runpy

    monkeypatch.setattr(sys, "argv", ["driving_post_training.py", "--steps", "1", "--tiny",
                                      "--output-dir", str(tmp_path / "out")])
    runpy.run_path(str(ROOT / "examples" / "driving_post_training.py"), run_name="__main__")
    torch.set_num_threads(1)
    assert "collision_rate" in capsys.readouterr().out and (tmp_path / "out" / "report.json").exists()


def test_progress_clip_caps_the_progress_reward():
    from planners.driving.metrics import RewardWeights, dense_reward_terms

    no = torch.zeros(1, 2, 3, dtype=torch.bool)
    prog, exp = torch.tensor([[8.0, 2.0]]), torch.tensor([[4.0, 4.0]])
    r15 = dense_reward_terms(no, no, prog, exp, weights=RewardWeights())
    r10 = dense_reward_terms(no, no, prog, exp, weights=RewardWeights(progress_clip=1.0))
    assert torch.allclose(r15, torch.tensor([[6.0, 2.0]])) and torch.allclose(r10, torch.tensor([[4.0, 2.0]]))
