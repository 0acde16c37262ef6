"""The committed shapes-world model loads offline through the t2i head and reproduces its
stored seeded samples (examples/shapes/reference_samples.png); the committed ShapesCLIP
loads through the CLIP reward and reproduces its stored scores; examples/shapes/pretrain.py
runs end to end on a tiny budget."""
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from examples.shapes.evaluate import REFERENCE_PNG, reference_samples
from tests.conftest import ROOT

MODEL = os.path.join(ROOT, "examples", "shapes", "model")


def test_committed_model_reproduces_its_stored_samples():
    torch.set_num_threads(1)
    ours = reference_samples(MODEL).numpy().astype(np.int16)  # [6, 32, 32, 3], one per category
    stored = np.asarray(Image.open(REFERENCE_PNG).convert("RGB")).astype(np.int16)
    stored = np.stack(np.split(stored, ours.shape[0], axis=1))  # tiles side by side
    assert ours.shape == stored.shape
    # at most one 8-bit level (float rounding at a level boundary); the images are not blank
    assert np.abs(ours - stored).max() <= 1
    assert stored.std() > 10


def test_committed_model_is_a_velocity_unet_within_the_size_budget():
    from examples.shapes.evaluate import load_head

    head = load_head(MODEL)
    assert head.prediction == "velocity" and type(head.pipe).__name__ == "StableDiffusionPipeline"
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(MODEL) for f in fs)
    assert size <= 25 * 2 ** 20


CLIP = os.path.join(ROOT, "examples", "shapes", "clip")


def test_committed_shapes_clip_loads_through_the_clip_reward_and_reproduces_its_stored_scores():
    from examples.shapes.train_clip import reference_scores

    torch.set_num_threads(1)
    with open(os.path.join(CLIP, "reference_scores.json")) as fh:
        stored = json.load(fh)
    ours = reference_scores(CLIP)
    assert ours["prompts"] == stored["prompts"]
    np.testing.assert_allclose(ours["matched"], stored["matched"], atol=1e-3)
    np.testing.assert_allclose(ours["mismatched"], stored["mismatched"], atol=1e-3)
    # it separates a render's own prompt from another category's
    assert all(m > w for m, w in zip(stored["matched"], stored["mismatched"]))
    size = sum(os.path.getsize(os.path.join(CLIP, f)) for f in os.listdir(CLIP))
    assert size <= 25 * 2 ** 20


def test_train_clip_script_writes_a_clip_the_reward_loads_and_replaces_it_whole(tmp_path):
    """Two steps of examples/shapes/train_clip.py: a real run, small; a second run replaces the first."""
    from examples.shapes.train_clip import main, reference_scores

    out = tmp_path / "clip"
    args = ["--output-dir", str(out), "--steps", "2", "--warmup", "1", "--scenes-per-prompt", "2",
            "--eval-per-prompt", "1", "--batch-size", "16", "--threads", "1"]
    main(args)
    first = (out / "open_clip_model.safetensors").read_bytes()
    scores = reference_scores(str(out))  # through the CLIP reward's normal open_clip loader
    assert len(scores["matched"]) == len(scores["mismatched"]) > 0
    assert 0.0 <= json.loads((out / "retrieval.json").read_text())["heldout"]["overall"] <= 1.0
    main(args + ["--seed", "1"])
    assert (out / "open_clip_model.safetensors").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip"]  # no temporary or old folder left


def test_pretrain_script_writes_a_pipeline_the_head_loads_and_replaces_it_whole(tmp_path):
    """Two steps on two scenes per prompt: a real run of examples/shapes/pretrain.py, small."""
    from examples.shapes.evaluate import load_head
    from examples.shapes.pretrain import main

    out = tmp_path / "model"
    args = ["--output-dir", str(out), "--steps", "2", "--scenes-per-prompt", "2", "--warmup", "1",
            "--eval-every", "0", "--eval-per-category", "1", "--eval-steps", "2", "--eval-guidance", "1"]
    main(args)
    info = json.loads((tmp_path / "model_log" / "pretrain.json").read_text())
    assert info["parameters"]["unet"] > 0 and info["args"]["steps"] == 2
    curve = [json.loads(line) for line in (tmp_path / "model_log" / "curve.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [2] and 0.0 <= curve[0]["heldout_cfg1"]["overall"] <= 1.0
    head = load_head(str(out))
    assert head.prediction == "velocity"
    first = (out / "unet" / "diffusion_pytorch_model.safetensors").read_bytes()
    main(args + ["--seed", "1"])  # a second run into the same folder replaces it, leaving no temporary
    assert (out / "unet" / "diffusion_pytorch_model.safetensors").read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model_log"]


@pytest.mark.parametrize("layout", [[], ["--channels-last"]])
def test_pretrain_script_is_bitwise_reproducible_on_two_threads(tmp_path, layout):
    """The same command twice on 2 threads gives identical weights. (Advanced indexing's backward with
    repeated indices accumulated racily on 2 threads, so the text encoder's gradients differed from step 1.)"""
    from examples.shapes.pretrain import main

    blobs = []
    for run in ("a", "b"):
        main(["--output-dir", str(tmp_path / run), "--steps", "3", "--scenes-per-prompt", "2", "--warmup", "1",
              "--eval-every", "0", "--eval-per-category", "1", "--eval-steps", "1", "--eval-guidance", "1",
              "--threads", "2", "--ema", "0", *layout])
        blobs.append([(tmp_path / run / c / f).read_bytes() for c, f in
                      (("unet", "diffusion_pytorch_model.safetensors"), ("text_encoder", "model.safetensors"))])
    assert blobs[0] == blobs[1]
    assert torch.get_num_threads() == 1 and not torch.are_deterministic_algorithms_enabled()  # restored


def test_pretrain_unet_options_place_cross_attention_per_level_and_bad_flags_exit_2():
    """--attn marks the down path, --up-attn the up path, --only-cross drops a level's self-attention."""
    from examples.shapes.pretrain import make_unet, parse_args

    def blocks(*flags):
        unet = make_unet(parse_args(["--output-dir", "unused", *flags]))
        return unet.config.down_block_types, unet.config.up_block_types, unet

    down, up, _ = blocks()  # the committed model: cross-attention at 16x16 and 8x8 in both paths
    assert down == ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    assert up == ("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D")
    down, up, _ = blocks("--attn", "0", "0", "1")  # the model committed before 2026-12-06
    assert down == ("DownBlock2D", "DownBlock2D", "CrossAttnDownBlock2D")
    assert up == ("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D")
    down, up, unet = blocks("--attn", "0", "1", "1", "--up-attn", "0", "0", "1", "--only-cross", "0", "1", "0")
    assert down == ("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D")
    assert up == ("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D")
    only = [b.only_cross_attention for a in unet.down_blocks[1:] for t in a.attentions
            for b in t.transformer_blocks]
    assert only == [True, False]  # 16x16 attends to the text only; 8x8 keeps its self-attention
    with pytest.raises(SystemExit) as err:
        parse_args(["--output-dir", "unused", "--up-attn", "0", "1"])
    assert err.value.code == 2
    with pytest.raises(SystemExit) as err:  # it times the steps after 3 warm-up steps
        parse_args(["--bench", "3"])
    assert err.value.code == 2


def test_pretrain_script_refuses_a_run_without_an_output_folder(capsys):
    from examples.shapes.pretrain import main

    with pytest.raises(SystemExit) as err:
        main(["--steps", "2"])
    assert err.value.code == 2 and "--output-dir is required" in capsys.readouterr().err
