"""VLM yes/no judge on a tiny random Qwen2.5-VL saved to disk and loaded back by the loader."""
import dataclasses
import math

import pytest
import torch
from PIL import Image

from flowrl.registry import ConfigError
from rewards.base import build_reward
from rewards.images import prompts_of
from rewards.vlm import DEFAULT_QUESTION, VLMYesNoConfig, chat_messages, limit_pixels, yes_no_score
from tests.contracts.reward_fixtures import images, prompt_batch, save_tiny_qwen2_5_vl, tiny_qwen2_tokenizer

LLAVA_TEMPLATE = (  # LLaVA-1.5's "USER: <image>\n... ASSISTANT:" layout
    "{% for m in messages %}{{ m['role'].upper() }}: {% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{{ '\\n' }}{% elif c['type'] == 'text' %}"
    "{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{{ ' ' }}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}")


def save_tiny_llava(folder):
    """Another image-text-to-text class: a random tiny LlavaForConditionalGeneration (CLIP vision
    tower 16 x 16 / patch 8, Llama text model) + LlavaProcessor, saved with save_pretrained."""
    from transformers import CLIPImageProcessor, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    tok = tiny_qwen2_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.chat_template = LLAVA_TEMPLATE
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}),
        tokenizer=tok, patch_size=8, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template=LLAVA_TEMPLATE)
    config = LlavaConfig(
        vision_config=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=16, patch_size=8),
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                         pad_token_id=tok.pad_token_id),
        image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_layer=-1)
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).eval().save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(save_tiny_qwen2_5_vl(tmp_path_factory.mktemp("vlm") / "qwen2_5_vl"))


@pytest.fixture(scope="module")
def judge(folder):
    return build_reward(VLMYesNoConfig(path=folder, batch_size=4))


QWEN_CHAT = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
             'Does this image match the caption "{prompt}"? Answer Yes or No.<|im_end|>\n<|im_start|>assistant\n')
LLAVA_CHAT = 'USER: <image>\nDoes this image match the caption "{prompt}"? Answer Yes or No. ASSISTANT:'


def hand_score(judge, image: torch.Tensor, prompt: str, chat: str = QWEN_CHAT) -> float:
    """The oracle: the chat text written out by hand, one unpadded sample, a full forward pass."""
    text = chat.replace("{prompt}", prompt)
    pil = Image.fromarray((image.permute(1, 2, 0).numpy() * 255).round().astype("uint8"))
    inputs = judge.processor(text=[text], images=[pil], return_tensors="pt")
    logits = judge.model(**inputs).logits[0, -1]
    tok = judge.processor.tokenizer
    yes, no = tok.convert_tokens_to_ids("Yes"), tok.convert_tokens_to_ids("No")
    return 100.0 / (1.0 + math.exp(-(float(logits[yes]) - float(logits[no]))))


def test_score_equals_formula_on_the_models_own_logits(judge):
    x, batch = images(6), prompt_batch(6)  # prompts of different lengths: the batch is left-padded
    out = judge(x, batch)
    assert out.score.shape == (6,) and out.score.dtype == torch.float32 and bool(out.valid.all())
    with torch.no_grad():
        want = torch.tensor([hand_score(judge, x[i], p) for i, p in enumerate(prompts_of(batch))])
    assert torch.allclose(out.score, want, atol=1e-4), (out.score, want)
    assert float(out.score.std()) > 1.0  # the tiny model is not flat: the check has teeth


def test_another_chat_model_class_llava(tmp_path):
    path = save_tiny_llava(tmp_path / "llava")
    judge = build_reward(VLMYesNoConfig(path=path, batch_size=4))
    assert type(judge.model).__name__ == "LlavaForConditionalGeneration"
    x, batch = images(6), prompt_batch(6)
    out = judge(x, batch)
    with torch.no_grad():
        want = torch.tensor([hand_score(judge, x[i], p, LLAVA_CHAT) for i, p in enumerate(prompts_of(batch))])
    assert torch.allclose(out.score, want, atol=1e-4) and float(out.score.std()) > 1.0
    one_by_one = build_reward(VLMYesNoConfig(path=path, batch_size=1))(x, batch).score
    assert torch.allclose(out.score, one_by_one, atol=1e-4)


def test_batch_invariance_and_determinism(folder, judge):
    x, batch = images(6), prompt_batch(6)
    batched = judge(x, batch).score
    one_by_one = build_reward(VLMYesNoConfig(path=folder, batch_size=1))(x, batch).score
    assert torch.allclose(batched, one_by_one, atol=1e-4)
    assert torch.allclose(judge(x[2:5], batch[2:5]).score, batched[2:5], atol=1e-4)
    assert torch.equal(judge(x, batch).score, batched)


def test_swapping_yes_and_no_mirrors_the_score(folder, judge):
    x, batch = images(3), prompt_batch(3)
    swapped = build_reward(VLMYesNoConfig(path=folder, yes_token="No", no_token="Yes"))(x, batch).score
    assert torch.allclose(swapped, 100.0 - judge(x, batch).score, atol=1e-4)


def test_question_and_max_pixels_are_used(folder, judge):
    x, batch = images(2, size=64), prompt_batch(2)
    asked = build_reward(VLMYesNoConfig(path=folder, question="Is {prompt} shown? Answer Yes or No."))(x, batch).score
    assert not torch.allclose(asked, judge(x, batch).score, atol=1e-3)
    small = build_reward(VLMYesNoConfig(path=folder, max_pixels=28 * 28))
    pre = torch.nn.functional.interpolate(x, size=(28, 28), mode="bicubic", antialias=True).clamp(0, 1)
    limited = small(x, batch).score
    assert float((limited - judge(x, batch).score).abs().max()) > 1.0  # 64 x 64 -> 28 x 28 changes the input
    # the same downscale done before the call gives nearly the same score (PIL vs torch resampling)
    assert torch.allclose(limited, judge(pre, batch).score, atol=1.0)


def test_multi_token_answer_is_a_clear_error(folder):
    with pytest.raises(ConfigError, match=r"yes_token: 'Yes please' is \d+ tokens .*single token"):
        build_reward(VLMYesNoConfig(path=folder, yes_token="Yes please"))


def test_missing_folder_and_uncached_hub_id_are_one_line_errors(tmp_path):
    absent = tmp_path / "absent" / "Qwen2.5-VL-7B-Instruct"
    with pytest.raises(FileNotFoundError) as e:
        build_reward(VLMYesNoConfig(path=str(absent)))
    msg = str(e.value)
    assert "\n" not in msg and str(absent) in msg and "huggingface-cli download" in msg
    with pytest.raises(FileNotFoundError) as e:  # HF_HUB_OFFLINE=1 (conftest): cache only, no network
        build_reward(VLMYesNoConfig(path="flowrl-tests/no-such-vlm"))
    assert "\n" not in str(e.value) and "flowrl-tests/no-such-vlm" in str(e.value)


def test_config_validation():
    with pytest.raises(ConfigError, match="batch_size"):
        VLMYesNoConfig(path="x", batch_size=0)
    with pytest.raises(ConfigError, match="max_pixels"):
        VLMYesNoConfig(path="x", max_pixels=0)
    with pytest.raises(ConfigError, match="yes_token"):
        VLMYesNoConfig(path="x", yes_token="No")
    fields = dataclasses.fields(VLMYesNoConfig)
    assert all(f.metadata.get("help") for f in fields)


def test_pure_helpers():
    logits = torch.zeros(2, 5)
    logits[1, 3] = math.log(3.0)  # yes = 3, no = 4: sigmoid(log 3) = 0.75
    assert torch.allclose(yes_no_score(logits, 3, 4), torch.tensor([50.0, 75.0]))
    msgs = chat_messages(DEFAULT_QUESTION, "a cat")
    assert msgs[0]["content"][0] == {"type": "image"}
    assert msgs[0]["content"][1]["text"] == 'Does this image match the caption "a cat"? Answer Yes or No.'
    assert chat_messages("{x} {prompt}", "p")[0]["content"][1]["text"] == "{x} p"  # only {prompt} is filled
    im = Image.new("RGB", (64, 32))
    assert limit_pixels(im, None) is im and limit_pixels(im, 4096) is im
    w, h = limit_pixels(im, 512).size
    assert w * h <= 512 and abs(w / h - 2.0) < 0.1
