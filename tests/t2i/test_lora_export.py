"""A full fine-tune saved as a LoRA (``head.export_lora_rank``): the factors are the truncated
SVD of each weight's change, and plain diffusers' ``load_lora_weights`` on the base pipeline
gives back the fine-tuned denoiser."""
import json

import torch

torch.set_num_threads(1)

import diffusers  # noqa: E402
import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.config import load_config  # noqa: E402
from flowrl.heads.t2i import build_t2i_head  # noqa: E402
from flowrl.heads.t2i.lora_export import lowrank_factors  # noqa: E402
from flowrl.heads.t2i.tiny import build_tiny_sd  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402
from tests.t2i.conftest import head_config  # noqa: E402
from tests.t2i.test_t2i_training import tiny_overrides  # noqa: E402


@pytest.fixture(scope="module")
def flow_unet(tmp_path_factory):
    return build_tiny_sd(str(tmp_path_factory.mktemp("sd_flow_export") / "pipe"), flow=True)


@pytest.mark.parametrize("shape", [(6, 5), (6, 4, 3, 3)])
def test_lowrank_factors_are_the_truncated_svd(shape):
    g = torch.Generator().manual_seed(0)
    flat = (shape[0], int(torch.tensor(shape[1:]).prod()))
    low = torch.randn(flat[0], 2, generator=g) @ torch.randn(2, flat[1], generator=g)  # rank 2
    a, b = lowrank_factors(low.reshape(shape), 2)
    assert a.shape == (2, *shape[1:]) and b.shape == ((shape[0], 2, 1, 1) if len(shape) == 4 else (shape[0], 2))
    assert torch.allclose(b.reshape(flat[0], 2) @ a.reshape(2, -1), low, atol=1e-5)
    full = torch.randn(*shape, generator=g)
    s = torch.linalg.svdvals(full.reshape(flat))
    a, b = lowrank_factors(full, 1)
    err = (b.reshape(flat[0], 1) @ a.reshape(1, -1) - full.reshape(flat)).square().sum()
    assert torch.allclose(err, s[1:].square().sum(), rtol=1e-4)  # Eckart-Young: the rest of the spectrum
    a, b = lowrank_factors(full, 8)  # more than the matrix's rank: exact, the extra factors zero
    assert torch.allclose(b.reshape(flat[0], 8) @ a.reshape(8, -1), full.reshape(flat), atol=1e-5)
    assert not a.reshape(8, -1)[min(flat):].any() and not b.reshape(flat[0], 8)[:, min(flat):].any()


def _velocity(unet, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, emb = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 77, unet.config.cross_attention_dim, generator=g)
    with torch.no_grad():
        return unet(x, torch.tensor([900.0, 300.0]), encoder_hidden_states=emb).sample


def test_exported_lora_puts_the_fine_tune_back_on_the_base_pipeline(flow_unet, tmp_path):
    head = build_t2i_head(head_config("sd", flow_unet, lora_rank=0, export_lora_rank=64, channels_last=True))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a fine-tune that moved every weight matrix, and nothing else
        for p in head.denoiser.parameters():
            if p.dim() in (2, 4):
                p.add_(0.05 * torch.randn(p.shape, generator=g) * p.abs().mean())
    head.save_pretrained(str(tmp_path / "final"))
    info = json.loads((tmp_path / "final" / "lora" / "lora_export.json").read_text())
    assert info["rank"] == 64 and info["modules"] > 20 and info["change_kept"] == pytest.approx(1.0, abs=1e-5)
    tuned = diffusers.UNet2DConditionModel.from_pretrained(str(tmp_path / "final"), subfolder="unet").eval()
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(flow_unet, local_files_only=True)
    v_base = _velocity(pipe.unet.eval())
    pipe.load_lora_weights(str(tmp_path / "final" / "lora"))
    v_lora, v_tuned = _velocity(pipe.unet), _velocity(tuned)
    assert (v_tuned - v_base).abs().max() > 1e-2  # the fine-tune changed the output ...
    assert (v_lora - v_tuned).abs().max() <= 1e-4 * v_tuned.abs().max()  # ... and the LoRA carries all of it
    head.config.export_lora_rank = 1  # a low rank keeps part of the change
    head.save_pretrained(str(tmp_path / "low"))
    assert 0 < json.loads((tmp_path / "low" / "lora" / "lora_export.json").read_text())["change_kept"] < 0.9


def test_a_trained_run_exports_its_lora_and_a_lora_run_saves_only_its_own(flow_unet, tmp_path):
    out = tmp_path / "run"
    cfg = load_config("configs/t2i/sd35m_fdfo.yaml", tiny_overrides(flow_unet, out) + [
        "head.family=sd", "head.lora_rank=0", "head.export_lora_rank=4", "optim.lr=1e-3"])
    Trainer(cfg).train()
    info = json.loads((out / "final" / "lora" / "lora_export.json").read_text())
    assert info["rank"] == 4 and 0 < info["change_kept"] <= 1
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(flow_unet, local_files_only=True)
    pipe.load_lora_weights(str(out / "final" / "lora"))
    for bad, needle in ((["head.train_text_encoder=true"], "train_text_encoder=false"), (["head.export_lora_rank=-1"], ">= 0")):
        with pytest.raises(Exception, match=needle):
            load_config("configs/t2i/sd35m_fdfo.yaml", tiny_overrides(flow_unet, out) + [
                "head.family=sd", "head.lora_rank=0", "head.export_lora_rank=4", *bad])
    # a LoRA run (the demo's config overridden to a LoRA, say) writes its LoRA in final/, no final/lora
    lora_run = tmp_path / "lora_run"
    cfg = load_config("configs/t2i/sd35m_fdfo.yaml", tiny_overrides(flow_unet, lora_run) + [
        "head.family=sd", "head.export_lora_rank=4", "max_steps=1"])
    Trainer(cfg).train()
    assert (lora_run / "final" / "pytorch_lora_weights.safetensors").exists()
    assert not (lora_run / "final" / "lora").exists()
