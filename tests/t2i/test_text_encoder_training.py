"""``head.train_text_encoder``: the sd family trains its text encoder with the denoiser (a LoRA
of the same rank, or all weights with ``lora_rank=0``). It starts as the frozen head, the
gradient reaches it, plain diffusers reads what it saves, and FDFO moves it."""
import torch

torch.set_num_threads(1)

import diffusers  # noqa: E402
import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.config import load_config  # noqa: E402
from flowrl.heads.base import check_head_contract  # noqa: E402
from flowrl.heads.t2i import build_t2i_head  # noqa: E402
from flowrl.heads.t2i.tiny import build_tiny_sd  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402
from tests.t2i.conftest import head_config  # noqa: E402
from tests.t2i.test_t2i_training import tiny_overrides  # noqa: E402

PROMPTS = ["a red circle left of a blue square", "two green triangles", "a yellow star"]


@pytest.fixture(scope="module")
def flow_unet(tmp_path_factory):
    return build_tiny_sd(str(tmp_path_factory.mktemp("sd_flow_te") / "pipe"), flow=True)


def _inputs(head, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *head.latent_shape(), generator=g), torch.rand(n, generator=g)


def _text_params(head):
    return {n: p for n, p in head.named_parameters() if p.requires_grad and n.startswith("text_encoder.")}


@pytest.mark.parametrize("scale", [1.0, 4.5])
@pytest.mark.parametrize("rank", [4, 0])
def test_it_starts_as_the_frozen_head_and_passes_the_contract(flow_unet, tmp_path, scale, rank):
    frozen = build_t2i_head(head_config("sd", flow_unet, guidance_scale=scale, lora_rank=rank))
    head = build_t2i_head(head_config("sd", flow_unet, guidance_scale=scale, lora_rank=rank, train_text_encoder=True))
    cond = head.encode(PROMPTS)
    assert cond["input_ids"].dtype == torch.long and ("neg_input_ids" in cond) == (scale > 1)
    x, t = _inputs(head, len(PROMPTS))
    assert torch.allclose(head.velocity(x, t, cond), frozen.velocity(x, t, frozen.encode(PROMPTS)), atol=1e-6)
    text = _text_params(head)
    total = sum(p.numel() for p in head.pipe.text_encoder.parameters())
    if rank:
        assert text and all("lora_" in n for n in text)
    else:
        assert sum(p.numel() for p in text.values()) == total
    head.velocity(x, t, cond).pow(2).mean().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in text.values())
    check_head_contract(head, PROMPTS, str(tmp_path / "saved"))


def test_plain_diffusers_reads_the_text_encoder_lora(flow_unet, tmp_path):
    head = build_t2i_head(head_config("sd", flow_unet, train_text_encoder=True))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in head.trainable_parameters():  # the LoRA starts at zero; make it matter
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    head.save_pretrained(str(tmp_path / "lora"))
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(flow_unet, local_files_only=True)
    base, _ = pipe.encode_prompt(PROMPTS, "cpu", 1, False)
    pipe.load_lora_weights(str(tmp_path / "lora"))
    theirs, _ = pipe.encode_prompt(PROMPTS, "cpu", 1, False)
    ours = head.embed_tokens(head.encode(PROMPTS))["prompt_embeds"]
    assert (theirs - base).abs().max() > 1e-3  # the text encoder's LoRA was loaded, not dropped
    assert torch.allclose(theirs, ours.detach(), atol=1e-5)


def test_full_fine_tuning_saves_the_trained_text_encoder(flow_unet, tmp_path):
    head = build_t2i_head(head_config("sd", flow_unet, lora_rank=0, train_text_encoder=True))
    base = head.embed_tokens(head.encode(PROMPTS))["prompt_embeds"].detach()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in _text_params(head).values():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    head.save_pretrained(str(tmp_path / "full"))
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(tmp_path / "full"), local_files_only=True)
    theirs, _ = pipe.encode_prompt(PROMPTS, "cpu", 1, False)
    assert (theirs - base).abs().max() > 1e-3
    assert torch.allclose(theirs, head.embed_tokens(head.encode(PROMPTS))["prompt_embeds"].detach(), atol=1e-6)


def test_families_without_it_refuse_at_config_time():
    with pytest.raises(ValueError, match="train_text_encoder: the sd3 family"):
        head_config("sd3", "unused", train_text_encoder=True)


def test_fdfo_moves_the_text_encoder(flow_unet, tmp_path):
    out = tmp_path / "run"
    cfg = load_config("configs/t2i/sd35m_fdfo.yaml",
                      tiny_overrides(flow_unet, out) + ["head.family=sd", "head.train_text_encoder=true"])
    trainer = Trainer(cfg)
    start = {n: p.detach().clone() for n, p in _text_params(trainer.head).items()}
    trainer.train()
    moved = [n for n, p in _text_params(trainer.head).items() if not torch.equal(p, start[n])]
    assert any("lora_B" in n for n in moved)
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(flow_unet, local_files_only=True)
    pipe.load_lora_weights(str(out / "final"))
    theirs, _ = pipe.encode_prompt(PROMPTS, "cpu", 1, False)
    ours = trainer.head.embed_tokens(trainer.head.encode(PROMPTS))["prompt_embeds"]
    assert torch.allclose(theirs, ours.detach(), atol=1e-5)


def test_resume_restores_the_text_encoder_exactly(flow_unet, tmp_path):
    def run(out, steps, resume=False):
        cfg = load_config("configs/t2i/sd35m_fdfo.yaml", tiny_overrides(flow_unet, out) + [
            "head.family=sd", "head.train_text_encoder=true", "train.checkpoint_every=1", f"max_steps={steps}",
            f"resume={str(resume).lower()}"])
        trainer = Trainer(cfg)
        trainer.train()
        return _text_params(trainer.head)

    full = run(tmp_path / "full", 2)
    run(tmp_path / "part", 1)
    resumed = run(tmp_path / "part", 2, resume=True)
    assert set(full) == set(resumed)
    assert all(torch.equal(full[n], resumed[n]) for n in full)
