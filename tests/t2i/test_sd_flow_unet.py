"""A StableDiffusionPipeline whose UNet was trained with rectified flow (its folder names a
FlowMatchEulerDiscreteScheduler): the sd family predicts velocity, follows the scheduler's
shifted sigmas step for step, and trains with FDFO and the flow samplers."""
import types

import torch

torch.set_num_threads(1)

import diffusers  # noqa: E402
import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.config import load_config  # noqa: E402
from flowrl.heads.base import check_head_contract  # noqa: E402
from flowrl.heads.t2i import build_t2i_head  # noqa: E402
from flowrl.heads.t2i.tiny import build_tiny_sd  # noqa: E402
from flowrl.mdp import sample_chain  # noqa: E402
from flowrl.samplers import EulerSampler, FlowSDESampler  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402
from tests.t2i.conftest import assert_rescoring_gives_ratio_one, head_config  # noqa: E402
from tests.t2i.test_t2i_training import tiny_overrides  # noqa: E402

PROMPTS = ["a red circle", "two blue squares left of a green triangle"]


@pytest.fixture(scope="module")
def flow_unet(tmp_path_factory):
    return build_tiny_sd(str(tmp_path_factory.mktemp("sd_flow") / "pipe"), flow=True)


def _gens(n, base=0):
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


def _diffusers_images(path, scale, generators):
    """diffusers' own StableDiffusionPipeline loop with its own flow scheduler. The pipeline asks
    every scheduler for ``init_noise_sigma`` and ``scale_model_input``, which flow schedulers do not
    define; for a flow model they are 1 and the identity."""
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler.init_noise_sigma = 1.0
    pipe.scheduler.scale_model_input = types.MethodType(lambda self, x, t=None: x, pipe.scheduler)
    return pipe(PROMPTS, num_inference_steps=4, guidance_scale=scale, height=32, width=32, output_type="pt",
                generator=generators).images


@pytest.mark.parametrize("scale", [1.0, 4.5])
def test_flow_unet_matches_diffusers_scheduler_loop(flow_unet, scale):
    head = build_t2i_head(head_config("sd", flow_unet, guidance_scale=scale))
    assert head.prediction == "velocity" and not hasattr(head, "alphas_cumprod")
    sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(4)
    assert torch.allclose(head.time_grid(4), sched.sigmas.float())
    cond = head.encode(PROMPTS)
    res = sample_chain(head.velocity, EulerSampler(), head.init_noise(cond, _gens(2)), cond, head.time_grid(4))
    ours = head.decode(res["states"][:, -1], cond)
    theirs = _diffusers_images(flow_unet, scale, _gens(2))
    assert ours.shape == theirs.shape == (2, 3, 32, 32)
    assert (ours - theirs).abs().max() <= 1e-4


def test_flow_unet_rescoring_gives_ratio_one_and_passes_the_head_contract(flow_unet, tmp_path):
    head = build_t2i_head(head_config("sd", flow_unet, guidance_scale=4.5))
    sampler = FlowSDESampler.flow_grpo(0.7)
    assert_rescoring_gives_ratio_one(head, sampler, PROMPTS)
    check_head_contract(head, PROMPTS + ["a third prompt"], str(tmp_path / "saved"))


def test_fdfo_trains_a_flow_unet(flow_unet, tmp_path):
    out = tmp_path / "run"
    cfg = load_config("configs/t2i/sd35m_fdfo.yaml", tiny_overrides(flow_unet, out) + ["head.family=sd"])
    report = Trainer(cfg).train()
    assert set(report) == {"before", "after"}
    assert (out / "final" / "pytorch_lora_weights.safetensors").exists()
    pipe = diffusers.StableDiffusionPipeline.from_pretrained(flow_unet, local_files_only=True)
    pipe.load_lora_weights(str(out / "final"))  # plain diffusers reads the trained LoRA


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_channels_last_gives_the_same_velocity_and_saves_the_usual_layout(flow_unet, lora_rank, tmp_path):
    targets = ["to_q", "to_v", "conv1"]  # a LoRA on a convolution has 4-D (channels-last) factors
    plain = build_t2i_head(head_config("sd", flow_unet, lora_rank=lora_rank, lora_targets=targets))
    fast = build_t2i_head(head_config("sd", flow_unet, lora_rank=lora_rank, lora_targets=targets, channels_last=True))
    convs = [p for p in fast.denoiser.parameters() if p.ndim == 4]
    assert convs and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    assert any(not p.is_contiguous() for p in convs)  # 3x3 kernels (1x1 ones are alike in both layouts)
    cond = plain.encode(PROMPTS)
    x = plain.init_noise(cond, _gens(2))
    t = torch.tensor([0.9, 0.3])
    v_plain, v_fast = plain.velocity(x, t, cond), fast.velocity(x, t, cond)
    assert (v_plain - v_fast).abs().max() <= 1e-4 * v_plain.abs().max()
    check_head_contract(fast, PROMPTS + ["a third prompt"], str(tmp_path / "saved"))
    # the saved folder loads in plain diffusers; the live weights stay channels-last
    assert all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)
    if lora_rank == 0:
        unet = diffusers.UNet2DConditionModel.from_pretrained(str(tmp_path / "saved"), subfolder="unet")
        for (name, saved), live in zip(unet.named_parameters(), fast.denoiser.parameters()):
            assert torch.equal(saved, live), name
    else:
        pipe = diffusers.StableDiffusionPipeline.from_pretrained(flow_unet, local_files_only=True)
        pipe.load_lora_weights(str(tmp_path / "saved"))


def test_freeze_modules_trains_only_the_rest(flow_unet, tmp_path):
    out = tmp_path / "run"
    frozen = ["down_blocks", "mid_block"]
    cfg = load_config("configs/t2i/sd35m_fdfo.yaml", tiny_overrides(flow_unet, out) + [
        "head.family=sd", "head.lora_rank=0", f"head.freeze_modules=[{', '.join(frozen)}]", "optim.lr=1e-3"])
    trainer = Trainer(cfg)
    names = list(trainer.named_trainable)
    assert names and not any(n.startswith(("denoiser.down_blocks.", "denoiser.mid_block.")) for n in names)
    assert any(n.startswith("denoiser.up_blocks.") for n in names)
    trainer.train()
    start = diffusers.UNet2DConditionModel.from_pretrained(flow_unet, subfolder="unet")
    after = dict(diffusers.UNet2DConditionModel.from_pretrained(str(out / "final"), subfolder="unet").named_parameters())
    moved = {n for n, p in start.named_parameters() if not torch.equal(p, after[n])}
    assert moved and all(n.startswith(("up_blocks.", "conv_out", "conv_norm_out", "conv_in", "time_embedding"))
                         for n in moved), sorted(moved)[:5]


def test_freeze_modules_refuses_unknown_names_and_a_lora(flow_unet):
    from flowrl.registry import ConfigError

    with pytest.raises(ConfigError, match="no submodule 'down_block'.*top-level ones: .*down_blocks"):
        build_t2i_head(head_config("sd", flow_unet, lora_rank=0, freeze_modules=["down_block"]))
    with pytest.raises(ValueError, match="full fine-tuning"):
        head_config("sd", flow_unet, lora_rank=4, freeze_modules=["down_blocks"])
