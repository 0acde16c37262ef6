"""Reward models against numeric oracles, on tiny random models with the real architectures
loaded through the real loaders (CLIP both backends, PickScore, HPSv2, aesthetic, JPEG)."""
import pytest
import torch
import torch.nn.functional as F

import rewards  # noqa: F401
from rewards.base import build_reward
from rewards.images import prompts_of, to_pil
from tests.contracts import reward_fixtures as rf

B32 = rf.images(4, rf.IMAGE_SIZE)  # at the tiny models' resolution: the processor does not resize
BATCH = rf.prompt_batch(4)
PROMPTS = prompts_of(BATCH)


def _cos(a, b):
    return (F.normalize(a, dim=-1) * F.normalize(b, dim=-1)).sum(-1)


def _hf_oracle_cos(folder, processor_folder=None):
    """cos(image, prompt) from the model's own processor and get_*_features."""
    from transformers import AutoProcessor, CLIPModel

    model = CLIPModel.from_pretrained(str(folder), local_files_only=True).eval()
    proc = AutoProcessor.from_pretrained(str(processor_folder or folder), local_files_only=True)
    px = proc(images=to_pil(B32), return_tensors="pt")["pixel_values"]
    tok = proc.tokenizer(PROMPTS, padding="max_length", max_length=77, truncation=True, return_tensors="pt")
    with torch.no_grad():
        img = model.get_image_features(pixel_values=px)
        txt = model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
    img, txt = (o if isinstance(o, torch.Tensor) else o.pooler_output for o in (img, txt))
    return _cos(img, txt), model


@pytest.mark.parametrize("seed", [5, 1])  # seed 1 has negative cosines: max(cos, 0) clamps them
def test_clip_score_transformers_equals_hand_computation(tmp_path, seed):
    folder = rf.save_tiny_hf_clip(tmp_path / "clip", seed=seed)
    cos, _ = _hf_oracle_cos(folder)
    assert bool((cos < 0).any()) if seed == 1 else bool((cos > 0).all())
    reward = build_reward(rf._cfg("clip", path=str(folder), scale=100.0))
    out = reward(B32, BATCH)
    assert torch.allclose(out.score, 100.0 * cos.clamp(min=0), atol=1e-4)
    half = build_reward(rf._cfg("clip", path=str(folder), scale=2.5))(B32, BATCH)
    assert torch.allclose(half.score, 2.5 * cos.clamp(min=0), atol=1e-5)


def test_clip_tokenizer_is_the_real_clip_bpe(tmp_path):
    from open_clip.tokenizer import SimpleTokenizer
    from transformers import AutoProcessor

    folder = rf.save_tiny_hf_processor(tmp_path / "p")
    hf = AutoProcessor.from_pretrained(str(folder), local_files_only=True).tokenizer
    oc = SimpleTokenizer()
    for text in PROMPTS + ["Hello, World! 123 naïve café"]:
        assert hf(text)["input_ids"] == [49406] + oc.encode(text) + [49407]


def test_clip_score_open_clip_equals_hand_computation(tmp_path):
    import open_clip

    case = rf.make_clip__open_clip(tmp_path)
    c = case.config
    model, _, val = open_clip.create_model_and_transforms(c.model_name, pretrained=c.pretrained)
    model.eval()
    px = torch.stack([val(im) for im in to_pil(B32)])
    with torch.no_grad():
        cos = _cos(model.encode_image(px), model.encode_text(open_clip.get_tokenizer(c.model_name)(PROMPTS)))
    out = build_reward(c)(B32, BATCH)
    assert torch.allclose(out.score, 100.0 * cos.clamp(min=0), atol=1e-4)


def test_pickscore_equals_logit_scale_exp_times_cos(tmp_path):
    case = rf.make_pickscore(tmp_path)
    cos, model = _hf_oracle_cos(case.config.path, case.config.processor_path)
    out = build_reward(case.config)(B32, BATCH)
    expected = model.logit_scale.exp().detach() * cos
    assert torch.allclose(out.score, expected, atol=1e-4)
    assert float(model.logit_scale.detach().exp()) == pytest.approx(100.0, rel=1e-3)  # the fixture's scale


def test_hpsv2_loads_the_checkpoint_and_scores_the_raw_cosine(tmp_path):
    import open_clip

    case = rf.make_hpsv2(tmp_path)
    reward = build_reward(case.config)
    state = torch.load(case.config.checkpoint, weights_only=True)["state_dict"]
    for k, v in reward.encoder.model.state_dict().items():
        assert torch.equal(v, state[k]), k
    model = open_clip.create_model(case.config.model_name)
    model.load_state_dict(state)
    model.eval()
    _, _, val = open_clip.create_model_and_transforms(case.config.model_name)
    px = torch.stack([val(im) for im in to_pil(B32)])
    with torch.no_grad():
        img = model.encode_image(px, normalize=True)
        txt = model.encode_text(open_clip.get_tokenizer(case.config.model_name)(PROMPTS), normalize=True)
    assert torch.allclose(reward(B32, BATCH).score, (img * txt).sum(-1), atol=1e-5)


def test_hpsv2_rejects_a_checkpoint_of_another_architecture(tmp_path):
    from flowrl.registry import ConfigError

    case = rf.make_hpsv2(tmp_path)
    torch.save({"state_dict": {"visual.proj": torch.zeros(2)}}, tmp_path / "wrong.pt")
    with pytest.raises(ConfigError, match="does not match"):
        build_reward(rf._cfg("hpsv2", checkpoint=str(tmp_path / "wrong.pt"), model_name=case.config.model_name,
                             model_config=case.config.model_config))


def test_aesthetic_is_the_mlp_on_the_normalised_clip_embedding(tmp_path):
    from rewards.aesthetic import AestheticHead

    case = rf.make_aesthetic(tmp_path)
    head_state = torch.load(case.config.head_path, weights_only=True)
    assert set(head_state) == {f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias")}
    assert [tuple(head_state[f"layers.{i}.weight"].shape) for i in (0, 2, 4, 6, 7)] == \
        [(1024, 16), (128, 1024), (64, 128), (16, 64), (1, 16)]
    from transformers import AutoProcessor, CLIPModel

    model = CLIPModel.from_pretrained(case.config.clip_path, local_files_only=True).eval()
    px = AutoProcessor.from_pretrained(case.config.clip_path, local_files_only=True)(
        images=to_pil(B32), return_tensors="pt")["pixel_values"]
    head = AestheticHead(16).eval()
    head.load_state_dict(head_state)
    with torch.no_grad():
        emb = model.get_image_features(pixel_values=px)
        emb = emb if isinstance(emb, torch.Tensor) else emb.pooler_output
        expected = head(F.normalize(emb, dim=-1))
    assert torch.allclose(build_reward(case.config)(B32, BATCH).score, expected, atol=1e-5)


def test_jpeg_scores_order_images_by_encoded_size():
    flat = torch.full((1, 3, 64, 64), 0.5)
    smooth = torch.linspace(0, 1, 64).view(1, 1, 1, 64).expand(1, 3, 64, 64)
    noise = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    x = torch.cat([noise, flat, smooth])
    comp = build_reward(rf._cfg("jpeg_compressibility"))(x, ["a"] * 3)
    incomp = build_reward(rf._cfg("jpeg_incompressibility"))(x, ["a"] * 3)
    assert comp.score.argsort().tolist() == [0, 2, 1]  # noise < smooth < flat (most compressible)
    assert torch.equal(incomp.score, -comp.score)
    import io

    buf = io.BytesIO()
    to_pil(noise)[0].save(buf, format="JPEG", quality=95)
    assert float(incomp.score[0]) == pytest.approx(buf.tell() / 1000.0)


def test_image_rewards_mark_nan_images_invalid(tmp_path):
    x = rf.images(3)
    x[1, 0, 3, 3] = float("nan")
    for case in (rf.make_clip(tmp_path / "c"), rf.make_jpeg_compressibility(tmp_path / "j")):
        out = build_reward(case.config)(x, rf.prompt_batch(3))
        assert out.valid.tolist() == [True, False, True]


def test_reduced_precision_and_offload_give_close_scores(tmp_path):
    case = rf.make_clip(tmp_path)
    ref = build_reward(case.config)(B32, BATCH).score
    bf16 = build_reward(rf._cfg("clip", path=case.config.path, dtype="bfloat16"))
    assert next(bf16.encoder.parameters()).dtype == torch.bfloat16
    out = bf16(B32, BATCH)
    assert out.score.dtype == torch.float32 and bool(out.valid.all())
    assert (out.score - ref).abs().max() < 5.0  # 100 * cos; bf16 keeps ~3 significant digits
    off = build_reward(rf._cfg("clip", path=case.config.path, offload=True))
    assert torch.allclose(off(B32, BATCH).score, ref)


def test_unknown_backend_and_architecture_are_config_errors(tmp_path):
    from flowrl.registry import ConfigError

    with pytest.raises(ConfigError, match="clip.backend"):
        rf._cfg("clip", backend="jax")
    with pytest.raises(ConfigError, match="clip.model_name"):
        build_reward(rf._cfg("clip", backend="open_clip", model_name="ViT-Nope", pretrained=str(tmp_path / "x.bin")))
