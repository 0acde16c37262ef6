"""The text-to-image head against diffusers itself: parity, log-probs, LoRA round trip."""
import torch

torch.set_num_threads(1)

import diffusers  # noqa: E402
import pytest  # noqa: E402

from flowrl.heads.base import check_head_contract  # noqa: E402
from flowrl.heads.t2i import build_t2i_head, family_class  # noqa: E402
from flowrl.mdp import sample_chain  # noqa: E402
from flowrl.samplers import DDIMSampler, EulerSampler, FlowSDESampler  # noqa: E402
from tests.t2i.conftest import FAMILIES, assert_rescoring_gives_ratio_one, head_config  # noqa: E402

PROMPTS = ["a red circle", "two blue squares left of a green triangle"]


def _gens(n, base=0):
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


def _ode_sampler(head):
    return DDIMSampler(head.alphas_cumprod, eta=0.0) if head.prediction == "epsilon" else EulerSampler()


def _pipeline_images(family, path, scale, latents=None, generators=None, lora=None):
    pipe = getattr(diffusers, family_class(family).pipeline_class).from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(lora)
    kw = {"eta": 0.0} if family == "sd" else {"max_sequence_length": 16}
    return pipe(PROMPTS, num_inference_steps=4, guidance_scale=scale, height=32, width=32, output_type="pt",
                latents=latents, generator=generators, **kw).images


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scale", [1.0, 4.5])
def test_parity_with_the_diffusers_pipeline(family, scale, tiny_pipelines):
    head = build_t2i_head(head_config(family, tiny_pipelines[family], guidance_scale=scale))
    cond = head.encode(PROMPTS)
    x0 = head.init_noise(cond, _gens(2))
    res = sample_chain(head.velocity, _ode_sampler(head), x0, cond, head.time_grid(4))
    ours = head.decode(res["states"][:, -1], cond)
    theirs = _pipeline_images(family, tiny_pipelines[family], scale, generators=_gens(2))
    assert ours.shape == theirs.shape == (2, 3, 32, 32)
    assert (ours - theirs).abs().max() <= 1e-4
    # the images depend on the prompt (the test would notice a dropped condition)
    other = head.decode(sample_chain(head.velocity, _ode_sampler(head), x0, head.encode(PROMPTS[::-1]),
                                     head.time_grid(4))["states"][:, -1], cond)
    assert (other - ours).abs().max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_rescoring_a_rollout_gives_ratio_one(family, tiny_pipelines):
    head = build_t2i_head(head_config(family, tiny_pipelines[family], guidance_scale=4.5))
    sampler = DDIMSampler(head.alphas_cumprod, eta=1.0) if family == "sd" else FlowSDESampler.flow_grpo(0.7)
    assert_rescoring_gives_ratio_one(head, sampler, PROMPTS)


@pytest.mark.parametrize("family", FAMILIES)
def test_head_contract(family, tiny_pipelines, tmp_path):
    head = build_t2i_head(head_config(family, tiny_pipelines[family]))
    check_head_contract(head, PROMPTS + ["a third prompt"], str(tmp_path / "saved"))
    # only the LoRA adapters train; text encoders and VAE are frozen and in eval mode
    names = [n for n, p in head.named_parameters() if p.requires_grad]
    assert names and all("lora" in n for n in names)
    assert all(not m.training for m in head.modules())


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_round_trip_into_plain_diffusers(family, tiny_pipelines, tmp_path):
    head = build_t2i_head(head_config(family, tiny_pipelines[family], guidance_scale=4.5))
    opt = torch.optim.Adam(head.trainable_parameters(), lr=1e-2)
    cond = head.encode(PROMPTS)
    for step in range(3):  # a few real optimizer steps on a regression loss
        x = head.init_noise(cond, _gens(2, 100 + step))
        t = torch.full((2,), 0.5)
        loss = (head.velocity(x, t, cond) - 1.0).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    head.save_pretrained(str(tmp_path / "lora"))
    x0 = head.init_noise(cond, _gens(2))
    ours = head.decode(sample_chain(head.velocity, _ode_sampler(head), x0, cond, head.time_grid(4))["states"][:, -1], cond)
    theirs = _pipeline_images(family, tiny_pipelines[family], 4.5, generators=_gens(2), lora=str(tmp_path / "lora"))
    base = _pipeline_images(family, tiny_pipelines[family], 4.5, generators=_gens(2))
    assert (ours - theirs).abs().max() <= 1e-4
    assert (ours - base).abs().max() > 1e-3  # the adapter really changed the images
    # the reference policy is the same weights with the adapter switched off
    with torch.no_grad():
        ref = head.reference_velocity(x0, torch.full((2,), 0.7), cond)
        pol = head.velocity(x0, torch.full((2,), 0.7), cond)
    assert (ref - pol).abs().max() > 1e-4


def test_prompt_embeddings_are_cached(tiny_pipelines):
    head = build_t2i_head(head_config("sd3", tiny_pipelines["sd3"], guidance_scale=4.5))
    calls = []
    original = head.encode_prompts
    head.encode_prompts = lambda prompts: calls.append(list(prompts)) or original(prompts)
    a = head.encode(PROMPTS)
    b = head.encode(PROMPTS + [PROMPTS[0]])
    assert calls == [PROMPTS, [""]]  # each prompt and the negative prompt encoded once
    assert torch.equal(b["prompt_embeds"][2], a["prompt_embeds"][0])
