"""Every configs/t2i recipe runs two training iterations with tiny stand-in models."""
import glob
import json
import os

import torch

torch.set_num_threads(1)

import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.config import load_config  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402

# the shapes-world recipes run the committed shapes model (tests/t2i/test_shapes_demo.py) or a tiny SD3
# pipeline (tests/t2i/test_shapes_world_runs.py)
RECIPES = sorted(p for p in glob.glob("configs/t2i/*.yaml") if not os.path.basename(p).startswith("shapes_"))


def tiny_overrides(path, out, rewards="[{name: brightness, target: 1.0}]"):
    return [
        f"head.path={path}", "head.resolution=32", "head.dtype=float32", "head.max_sequence_length=16",
        "head.lora_rank=4", "head.lora_alpha=8",
        f"rewards={rewards}",
        "data.train=null", "data.eval=null",
        "data.train_prompts=[a red circle, two blue squares, a green triangle, one yellow star]",
        "data.eval_prompts=[a purple hexagon, an orange square]",
        "chain.num_steps=4", "eval.num_steps=4", "eval.num_items=2", "eval.samples_per_item=2",
        "max_steps=2", "train.prompts_per_step=2", "train.micro_batch_size=4", "train.mixed_precision=fp32",
        "train.checkpoint_every=0", "train.eval_every=0", "train.progress=false", "train.tensorboard=false",
        f"output_dir={out}",
    ]


def tiny_rewards(rewards, tmp_path) -> str:
    """The recipe's own rewards with the same weights, pointed at tiny local models."""
    from flowrl.configlib import to_dict
    from tests.contracts.reward_fixtures import fixtures

    out = []
    for r in rewards:
        d = to_dict(fixtures()[r.name](tmp_path / f"reward_{r.name}").config)
        d.update(weight=r.weight, device="cpu", dtype="float32")
        out.append(d)
    return json.dumps(out)


def test_every_recipe_is_covered():
    assert {os.path.basename(p) for p in RECIPES} >= {
        "sd35m_fdfo.yaml", "sd35m_flow_grpo.yaml", "flux_dev_dance_grpo.yaml", "sd15_ddpo_aesthetic.yaml"}


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_validates_as_written(recipe):
    cfg = load_config(recipe)
    assert cfg.head.name == "t2i" and cfg.head.path and cfg.rewards


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_trains_two_steps_on_tiny_models(recipe, tiny_pipelines, tmp_path):
    cfg = load_config(recipe)
    extra = [] if cfg.algorithm.name == "fdfo" else ["algorithm.group_size=4"]
    rewards = tiny_rewards(cfg.rewards, tmp_path)
    cfg = load_config(recipe, tiny_overrides(tiny_pipelines[cfg.head.family], tmp_path / "run", rewards) + extra)
    report = Trainer(cfg).train()
    assert set(report) == {"before", "after"} and set(report["after"]) == {r.label or r.name for r in cfg.rewards}
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows and rows[-1]["iteration"] == 2
    assert (run / "final" / "pytorch_lora_weights.safetensors").exists()
    assert (run / "samples" / "before.png").exists() and (run / "samples" / "after.png").exists()
    assert (run / "curves.png").exists()
    # the trained LoRA moved the policy away from the starting point
    assert rows[-1]["grad_norm"] > 0
