"""The committed shapes-world model loads offline through the t2i head and reproduces its
stored seeded samples (examples/shapes/reference_samples.png); the committed ShapesCLIP
loads through the CLIP reward and reproduces its stored scores."""
import os

import numpy as np
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
    import json

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
