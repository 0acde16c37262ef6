"""The t2i recipe script, full fine-tuning, and prompt-file sources."""
import json
import subprocess
import sys

import torch

torch.set_num_threads(1)

import diffusers  # noqa: E402
import pytest  # noqa: E402

import flowrl.builtins  # noqa: E402,F401
from flowrl.config import load_config  # noqa: E402
from flowrl.heads.t2i.prompts import Prompts, PromptsConfig, read_prompts  # noqa: E402
from flowrl.registry import ConfigError  # noqa: E402
from flowrl.trainer import Trainer  # noqa: E402
from tests.conftest import ROOT, run_cli  # noqa: E402
from tests.t2i.test_t2i_training import tiny_overrides  # noqa: E402


def test_example_script_trains_and_saves_a_lora(tiny_pipelines, tmp_path):
    (tmp_path / "train.txt").write_text("a red circle\na blue square\n")
    (tmp_path / "eval.jsonl").write_text('{"prompt": "a green star", "tag": "x"}\n')
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, "examples/t2i_finetune.py", "--pipeline", tiny_pipelines["sd3"], "--family", "sd3",
         "--prompts", str(tmp_path / "train.txt"), "--eval-prompts", str(tmp_path / "eval.jsonl"),
         "--reward", "brightness=1.0", "--algorithm", "flow_grpo", "--steps", "2", "--output-dir", str(out),
         "--set", "head.resolution=32", "head.max_sequence_length=16", "head.lora_rank=4", "chain.num_steps=3",
         "algorithm.group_size=2", "train.prompts_per_step=2", "eval.num_items=1", "eval.samples_per_item=2",
         "train.progress=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "final" / "pytorch_lora_weights.safetensors").exists()
    assert "brightness" in json.loads((out / "report.json").read_text())["after"]


def test_full_fine_tuning_saves_a_loadable_pipeline(tiny_pipelines, tmp_path):
    cfg = load_config("configs/t2i/sd15_ddpo_aesthetic.yaml",
                      tiny_overrides(tiny_pipelines["sd"], tmp_path / "run") + ["head.lora_rank=0", "algorithm.group_size=2"])
    trainer = Trainer(cfg)
    trainer.train()
    trained = diffusers.StableDiffusionPipeline.from_pretrained(str(tmp_path / "run" / "final"), local_files_only=True)
    start = diffusers.StableDiffusionPipeline.from_pretrained(tiny_pipelines["sd"], local_files_only=True)
    ours = dict(trainer.head.denoiser.named_parameters())
    moved = 0
    for name, p in trained.unet.named_parameters():
        assert torch.equal(p, ours[name].detach()), name
        moved += int(not torch.equal(p, dict(start.unet.named_parameters())[name]))
    assert moved > 0
    with pytest.raises(NotImplementedError):  # no second full copy is kept for a reference policy
        trainer.head.reference_velocity(torch.zeros(1, 4, 4, 4), torch.ones(1), {})


def test_a_kl_term_with_full_fine_tuning_is_refused_at_start(tiny_pipelines, tmp_path):
    """Full fine-tuning keeps no reference copy, so a KL weight fails before any rollout, naming the key."""
    overrides = tiny_overrides(tiny_pipelines["sd"], tmp_path / "run") + ["head.lora_rank=0", "algorithm.group_size=2"]
    with pytest.raises(ConfigError, match="algorithm.kl_beta"):
        Trainer(load_config("configs/t2i/sd15_ddpo_aesthetic.yaml", overrides + ["algorithm.kl_beta=0.04"]))
    assert not (tmp_path / "run").exists()
    res = run_cli("train", "configs/t2i/shapes_vg_grpo.yaml", f"head.path={tiny_pipelines['sd']}", "head.lora_rank=0",
                  "algorithm.kl_beta=0.1", f"output_dir={tmp_path / 'vg'}")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "algorithm.kl_beta=0" in res.stderr and "head.lora_rank > 0" in res.stderr, res.stderr  # the head's hint
    Trainer(load_config("configs/t2i/sd15_ddpo_aesthetic.yaml", overrides))  # kl_beta 0 (the recipe's) builds


def test_prompt_sources(tmp_path):
    (tmp_path / "p.txt").write_text("one\n\n two \n")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a", "count": 2}\n{"prompt": "b"}\n')
    assert read_prompts(str(tmp_path / "p.txt"), "data.train") == ["one", "two"]
    assert read_prompts(str(tmp_path / "p.jsonl"), "data.train")[0] == {"prompt": "a", "count": 2}
    src = Prompts(PromptsConfig(train_prompts=["x", "y"], eval=str(tmp_path / "p.txt")))
    assert src.train_items() == ["x", "y"] and src.eval_items() == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"text": "no prompt key"}\n')
    with pytest.raises(ConfigError, match="line 1"):
        read_prompts(str(tmp_path / "bad.jsonl"), "data.train")
    with pytest.raises(ConfigError, match="not found"):
        read_prompts(str(tmp_path / "missing.txt"), "data.train")
    with pytest.raises(ValueError, match="data.eval"):
        PromptsConfig(train_prompts=["x"])


def test_sample_command_writes_images_and_a_grid(tiny_pipelines, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "s"
    res = run_cli("sample", "configs/t2i/sd35m_flow_grpo.yaml", *tiny_overrides(tiny_pipelines["sd3"], out))
    assert res.returncode == 0, res.stderr[-2000:]
    saved = load_file(str(out / "samples.safetensors"))
    assert saved["outputs"].shape == (4, 3, 32, 32) and saved["final"].shape == (4, 4, 32, 32)
    assert (out / "samples" / "sample-seed1234.png").exists()
