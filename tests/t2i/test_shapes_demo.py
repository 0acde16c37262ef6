"""The demo recipe on the committed shapes model: a short (about a minute on one thread) FDFO
run with the demo's head and step size (full fine-tuning, lr 2e-4) and the ShapesCLIP
reward raises that reward on its training prompts.

The evaluation here is on the training prompts themselves (deterministic ODE samples from
fixed seeds), because the claim is "the training reward rises"; held-out accuracy is what
`make demo` and `make bench-shapes` measure.
"""
import os

import torch
import yaml

import flowrl.builtins  # noqa: F401
from examples.shapes.train_clip import reward_config
from flowrl.config import load_config
from flowrl.trainer import Trainer
from tests.conftest import ROOT

CLIP = os.path.join(ROOT, "examples", "shapes", "clip")
# RL-split prompts of the categories the model does worst (counting, position, colour attribution)
PROMPTS = ["three squares", "four triangles", "a square below a triangle", "a yellow circle and a blue diamond"]


def test_a_short_fdfo_run_with_the_demo_recipe_raises_the_training_reward(tmp_path):
    torch.set_num_threads(1)
    with open(os.path.join(ROOT, "configs", "t2i", "shapes_fdfo.yaml")) as fh:
        raw = yaml.safe_load(fh)
    # 4 x 16 prompts: +10.1 CLIP points (seed 0; with 10-step chains +10.5 to +14.7 over seeds 0-3)
    raw.update(output_dir=str(tmp_path / "run"), max_steps=4)
    raw["head"]["path"] = os.path.join(ROOT, "examples", "shapes", "model")
    raw["sampler"] = {"name": "churn", "gamma": 0.0025}
    clip = reward_config(CLIP)  # the committed ShapesCLIP through the clip reward
    raw["rewards"] = [{k: getattr(clip, k) for k in ("name", "backend", "model_name", "model_config", "pretrained")}]
    raw["data"] = {"name": "prompts", "train_prompts": PROMPTS, "eval_prompts": PROMPTS}
    raw["eval"] = {"num_items": 4, "samples_per_item": 4, "num_steps": 10}
    raw["train"] = {"prompts_per_step": 16, "progress": False, "tensorboard": False, "curves": False}
    path = tmp_path / "fdfo.yaml"
    path.write_text(yaml.safe_dump(raw))
    report = Trainer(load_config(str(path))).train()
    before, after = report["before"]["clip"], report["after"]["clip"]
    print(f"clip on the training prompts: {before:.2f} -> {after:.2f}")
    # CLIP score points (100 x cosine); one step moved it by -2.2, so +5 is more than noise
    assert after > before + 5.0, (before, after)


def test_the_demo_config_trains_bitwise_alike_twice_on_two_threads(tmp_path):
    """`make demo` runs on 2 threads; two short runs of its config must save identical weights
    (a racy multi-threaded backward, like advanced indexing's, would break this)."""
    with open(os.path.join(ROOT, "configs", "t2i", "shapes_fdfo.yaml")) as fh:
        raw = yaml.safe_load(fh)
    raw.update(max_steps=2)
    raw["head"]["path"] = os.path.join(ROOT, "examples", "shapes", "model")
    raw["data"].update(eval_per_category=1)
    raw["eval"].update(num_items=2)
    raw["train"] = {"prompts_per_step": 8, "micro_batch_size": 8, "eval_every": 0, "progress": False,
                    "tensorboard": False, "curves": False}
    weights = []
    torch.set_num_threads(2)
    try:
        for run in ("a", "b"):
            raw["output_dir"] = str(tmp_path / run)
            path = tmp_path / f"{run}.yaml"
            path.write_text(yaml.safe_dump(raw))
            Trainer(load_config(str(path))).train()
            weights.append((tmp_path / run / "final" / "unet" / "diffusion_pytorch_model.safetensors").read_bytes())
    finally:
        torch.set_num_threads(1)
    assert weights[0] == weights[1]
    base = os.path.join(ROOT, "examples", "shapes", "model", "unet", "diffusion_pytorch_model.safetensors")
    assert weights[0] != open(base, "rb").read()  # it trained
    # the demo also saves the change as a LoRA that plain diffusers puts on the committed model
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(raw["head"]["path"], local_files_only=True)
    pipe.load_lora_weights(str(tmp_path / "b" / "final" / "lora"))
