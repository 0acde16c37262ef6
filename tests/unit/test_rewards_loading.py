"""Weight loading (local path or hub id, offline-safe, one-line errors) and the tensor
image preprocessing that follows each model's own processor."""
import pytest
import torch

from flowrl.registry import ConfigError
from rewards.images import ImageSpec, center_crop, finite_rows, from_pil, preprocess, to_pil
from rewards.loading import from_pretrained, load_into, load_state_dict, looks_local, offline, resolve_file
from tests.contracts.reward_fixtures import images, save_tiny_hf_processor

SOURCE = "download it from somewhere and pass its path"


def _one_line(err):
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def test_offline_flag_and_local_detection(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert not offline()
    assert looks_local("/abs/model.pt") and looks_local("./rel") and looks_local("head.pth")
    assert looks_local("sub/head.pth") and not looks_local("org/repo") and not looks_local("xswu/HPSv2/HPS_v2.pt")


def test_missing_local_file_names_the_file_and_the_source(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        resolve_file(str(tmp_path / "HPS_v2_compressed.pt"), "hpsv2.checkpoint", "HPS_v2_compressed.pt", SOURCE)
    msg = _one_line(err)
    assert msg.startswith("hpsv2.checkpoint: HPS_v2_compressed.pt not found at ") and SOURCE in msg


def test_uncached_hub_file_offline_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        resolve_file("no-such-org-x1/no-such-repo/weights.pt", "r.file", "weights.pt", SOURCE)
    msg = _one_line(err)
    assert "weights.pt" in msg and "HF_HUB_OFFLINE=1" in msg and SOURCE in msg


def test_from_pretrained_missing_folder_and_uncached_hub_id(tmp_path, monkeypatch):
    from transformers import CLIPModel

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError) as err:
        from_pretrained(CLIPModel.from_pretrained, str(tmp_path / "gone"), "clip.path", "CLIP model", SOURCE)
    assert "gone" in _one_line(err)
    with pytest.raises(FileNotFoundError) as err:
        from_pretrained(CLIPModel.from_pretrained, "no-such-org-x1/no-such-model", "clip.path", "CLIP model", SOURCE)
    msg = _one_line(err)
    assert "no-such-org-x1/no-such-model" in msg and "HF_HUB_OFFLINE=1" in msg
    (tmp_path / "empty").mkdir()  # a folder without config.json
    with pytest.raises(FileNotFoundError) as err:
        from_pretrained(CLIPModel.from_pretrained, str(tmp_path / "empty"), "clip.path", "CLIP model", SOURCE)
    assert "empty" in _one_line(err)


def test_state_dict_unwrapping_and_no_unpickling(tmp_path):
    lin = torch.nn.Linear(2, 3)
    torch.save({"state_dict": {f"module.{k}": v for k, v in lin.state_dict().items()}, "epoch": 3}, tmp_path / "a.pt")
    sd = load_state_dict(str(tmp_path / "a.pt"), "k")
    assert set(sd) == {"weight", "bias"}
    from safetensors.torch import save_file

    save_file(lin.state_dict(), str(tmp_path / "b.safetensors"))
    assert torch.equal(load_state_dict(str(tmp_path / "b.safetensors"), "k")["weight"], lin.weight.detach())
    torch.save({"obj": lin}, tmp_path / "pickled.pt")  # a pickled module: refused (weights_only)
    with pytest.raises(ConfigError) as err:
        load_state_dict(str(tmp_path / "pickled.pt"), "r.head_path")
    assert _one_line(err).startswith("r.head_path: ")


def test_load_into_reports_mismatch_in_one_line():
    with pytest.raises(ConfigError) as err:
        load_into(torch.nn.Linear(2, 3), {"weight": torch.zeros(3, 2), "extra": torch.zeros(1)}, "r.k", "f.pt")
    msg = _one_line(err)
    assert "1 missing" in msg and "1 unexpected" in msg


# --------------------------------------------------------------------------- preprocessing
def test_finite_rows_and_pil_round_trip():
    x = images(3, 8)
    assert torch.equal(from_pil(to_pil(x)), x)
    x[1, 0, 0, 0] = float("nan")
    assert finite_rows(x).tolist() == [True, False, True]


def test_center_crop_and_shortest_edge_resize_shapes():
    spec = ImageSpec(size=16, crop=(16, 16), mean=(0, 0, 0), std=(1, 1, 1))
    assert preprocess(torch.rand(2, 3, 20, 40), spec).shape == (2, 3, 16, 16)
    assert center_crop(torch.rand(1, 3, 4, 4), (6, 6)).shape == (1, 3, 6, 6)  # pads when smaller
    squash = ImageSpec(size=(8, 12), crop=None, mean=(0, 0, 0), std=(1, 1, 1))
    assert preprocess(torch.rand(1, 3, 20, 40), squash).shape == (1, 3, 8, 12)


@pytest.fixture(scope="module")
def hf_processor(tmp_path_factory):
    from transformers import AutoProcessor

    folder = save_tiny_hf_processor(tmp_path_factory.mktemp("proc"))
    return AutoProcessor.from_pretrained(str(folder), local_files_only=True)


def test_preprocess_matches_the_models_own_processor(hf_processor):
    from rewards.clip import spec_from_hf_processor

    spec = spec_from_hf_processor(hf_processor.image_processor)
    assert spec.size == 32 and spec.crop == (32, 32) and spec.interpolation == "bicubic"
    # at the model's resolution the tensor path equals the processor exactly
    x = images(4, 32)
    ref = hf_processor(images=to_pil(x), return_tensors="pt")["pixel_values"]
    assert torch.allclose(preprocess(x, spec), ref, atol=1e-5)
    # resizing (antialiased bicubic on tensors vs the processor's own resize) stays close
    big = torch.nn.functional.interpolate(images(4, 16), size=(48, 64), mode="bilinear")
    big = (big * 255).round() / 255
    ref = hf_processor(images=to_pil(big), return_tensors="pt")["pixel_values"]
    assert (preprocess(big, spec) - ref).abs().mean() < 0.03


def test_open_clip_tag_offline_never_downloads(monkeypatch):
    import rewards  # noqa: F401
    from rewards.base import REWARDS, build_reward

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = REWARDS.get("clip").config_cls(backend="open_clip", model_name="ViT-B-32", pretrained="laion2b_s34b_b79k")
    with pytest.raises(FileNotFoundError) as err:
        build_reward(cfg)
    msg = _one_line(err)
    assert msg.startswith("clip.pretrained: ") and "laion2b_s34b_b79k" in msg and "HF_HUB_OFFLINE=1" in msg
