"""The shapes-world pretraining and evaluation scripts run (tiny settings), and the
constructed pixel-space autoencoder they save is an exact identity."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.integration
ENV = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}


def _run(*args):
    res = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env=ENV)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def test_pretrain_and_evaluate_scripts(tmp_path):
    model = tmp_path / "model"
    _run("examples/shapes/pretrain.py", "--output-dir", model, "--steps", "3", "--scenes-per-prompt", "2",
         "--eval-every", "0", "--eval-per-category", "1", "--eval-steps", "2", "--eval-guidance", "1", "--channels", "8", "8",
         "--attn", "0", "1", "--groups", "4", "--head-dim", "8", "--text-dim", "16", "--threads", "1", "--ema", "0.9",
         "--shift", "2")
    _run("examples/shapes/evaluate.py", "--model", model, "--per-category", "1", "--num-steps", "2",
         "--out", tmp_path / "eval.json", "--threads", "1")
    metrics = json.loads((tmp_path / "eval.json").read_text())
    assert "overall" in json.dumps(metrics)

    # the saved pipeline loads through the t2i head, and its VAE is an exact identity
    from flowrl.heads.t2i import T2IHeadConfig, build_t2i_head
    from rewards.shapes import world as W

    head = build_t2i_head(T2IHeadConfig(family="sd", path=str(model), resolution=32, guidance_scale=1.0))
    assert head.prediction == "velocity"  # the flow scheduler in the folder makes the UNet a velocity model
    scenes = [W.random_scene(np.random.default_rng(i)) for i in range(4)]
    images = W.render_batch(scenes)
    vae = head.pipe.vae
    with torch.no_grad():
        latents = vae.encode(images * 2 - 1).latent_dist.mode()
        latents = latents * vae.config.scaling_factor  # the mean shift lives in the VAE's biases
    back = head.decode(latents, {})
    assert (back - images).abs().max() <= 1 / 255
    # --shift reaches the saved scheduler, which the head's time grid reads
    assert head.pipe.scheduler.config.shift == 2.0


def test_caption_noise_gives_near_misses_and_never_a_held_out_prompt():
    """--caption-noise swaps about that share of captions for a prompt of the same category that
    the image does not satisfy (checked by the strict verifier on the ground-truth render), and
    never writes a held-out prompt; empty (CFG) captions stay empty."""
    sys.path.insert(0, str(ROOT / "examples" / "shapes"))
    try:
        from pretrain import noisy_captions
    finally:
        sys.path.pop(0)
    from rewards.shapes.prompts import is_held_out, parse_prompt, sample_scene, split_prompts
    from rewards.shapes.verifier import detect, satisfies
    from rewards.shapes.world import render

    items = split_prompts(0)["pretrain"] * 4
    caps = [it["prompt"] for it in items]
    caps[0] = ""
    rng = np.random.default_rng(0)
    out = noisy_captions(caps, items, 0.3, rng)
    changed = [k for k, (a, b) in enumerate(zip(caps, out)) if a != b]
    assert out[0] == ""
    assert 0.2 * len(caps) < len(changed) < 0.4 * len(caps)
    assert noisy_captions(caps, items, 0.0, rng) == caps
    for k in changed:
        wrong = parse_prompt(out[k])
        assert wrong is not None and not is_held_out(wrong)
        assert wrong["category"] == items[k]["category"]
        image = render(sample_scene(items[k], np.random.default_rng(k)))
        found = detect(image)
        assert satisfies(found, items[k]) and not satisfies(found, wrong), (caps[k], out[k])
