"""Benchmark: flowrl's text-to-image head vs the bare diffusers calls (CPU, random weights).

    python tests/benchmarks/bench_t2i.py [--out outputs/bench_t2i.json] [--repeats 5]

Measures, on a small random SD3 transformer (4 layers, 256 latent tokens, LoRA r8):
  rollout: flowrl's chain with per-step log-probs (Flow-GRPO SDE, CFG 4.5) vs the pipeline's
           own denoising loop (same steps, batch, CFG; prompt embeddings given, no VAE decode);
  train:   one Flow-GRPO loss forward + backward on a minibatch of transitions vs a bare
           transformer forward + backward (with CFG, MSE loss) on the same inputs;
  memory:  peak resident memory of each variant, each in its own process.
Times are medians of A/B-interleaved repeats in one process, so load on the machine hits
both sides alike.
Prints a table and writes JSON. Not part of `make test`.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

STEPS, BATCH = 10, 4


def build(directory: str) -> None:
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from flowrl.heads.t2i.tiny import _clip_text, _t5
    from flowrl.heads.t2i.tokenizers import build_clip_tokenizer

    torch.manual_seed(0)
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, num_layers=4, attention_head_dim=32,
                                        num_attention_heads=4, joint_attention_dim=64, caption_projection_dim=128,
                                        pooled_projection_dim=64, out_channels=16, pos_embed_max_size=32).eval()
    vae = AutoencoderKL(block_out_channels=(8,), layers_per_block=1, latent_channels=16, norm_num_groups=4,
                        down_block_types=("DownEncoderBlock2D",), up_block_types=("UpDecoderBlock2D",)).eval()
    tok = build_clip_tokenizer(os.path.join(directory, "_tok"), 2000)
    StableDiffusion3Pipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
                             text_encoder=_clip_text(True), tokenizer=tok, text_encoder_2=_clip_text(True),
                             tokenizer_2=tok, text_encoder_3=_t5(), tokenizer_3=tok).save_pretrained(directory)


def setup(path: str):
    from flowrl.heads.t2i import T2IHeadConfig, build_t2i_head

    head = build_t2i_head(T2IHeadConfig(family="sd3", path=path, resolution=32, guidance_scale=4.5,
                                        max_sequence_length=16, lora_rank=8, lora_alpha=16))
    cond = head.encode([f"prompt {i}" for i in range(BATCH)])
    x0 = head.init_noise(cond, [torch.Generator().manual_seed(i) for i in range(BATCH)])
    return head, cond, x0


def variants(path: str) -> dict:
    """The four measured callables on one loaded head."""
    from flowrl.algorithms.base import Policy
    from flowrl.algorithms.grpo import GRPO, GRPOConfig
    from flowrl.mdp import sample_chain
    from flowrl.samplers import FlowSDESampler

    head, cond, x0 = setup(path)
    sampler = FlowSDESampler.flow_grpo(0.7)
    times = head.time_grid(STEPS)
    gens = lambda: [torch.Generator().manual_seed(10 + i) for i in range(BATCH)]  # noqa: E731
    pipe = head.pipe
    embeds = torch.cat([cond["neg_prompt_embeds"], cond["prompt_embeds"]])
    pooled = torch.cat([cond["neg_pooled"], cond["pooled"]])

    def rollout_flowrl():
        with torch.no_grad():
            sample_chain(head.velocity, sampler, x0, cond, times, gens())

    def rollout_bare():
        pipe(prompt_embeds=cond["prompt_embeds"], pooled_prompt_embeds=cond["pooled"],
             negative_prompt_embeds=cond["neg_prompt_embeds"], negative_pooled_prompt_embeds=cond["neg_pooled"],
             latents=x0.clone(), num_inference_steps=STEPS, guidance_scale=4.5, output_type="latent", height=32, width=32)

    res = sample_chain(head.velocity, sampler, x0, cond, times, gens())
    k = 3
    units = {"x": res["states"][:, k], "x_next": res["states"][:, k + 1], "t": times[k].expand(BATCH),
             "t_next": times[k + 1].expand(BATCH), "old_log_prob": res["log_probs"][:, k],
             "adv": torch.randn(BATCH), "valid": torch.ones(BATCH), "step_weight": torch.ones(BATCH)}
    algo = GRPO(GRPOConfig(group_size=2, kl_beta=0.0))
    policy = Policy(head.velocity, head.reference_velocity, sampler)
    params = head.trainable_parameters()

    def train_flowrl():
        loss, _ = algo.loss(units, cond, policy)
        loss.mean().backward()
        for p in params:
            p.grad = None

    def train_bare():
        x = torch.cat([units["x"], units["x"]])
        t = torch.cat([units["t"], units["t"]]) * 1000
        out = head.denoiser(hidden_states=x, timestep=t, encoder_hidden_states=embeds, pooled_projections=pooled,
                            return_dict=False)[0]
        u, c = out.chunk(2)
        (u + 4.5 * (c - u)).float().sub(units["x_next"]).pow(2).mean().backward()
        for p in params:
            p.grad = None

    return {"rollout_flowrl": rollout_flowrl, "rollout_bare": rollout_bare,
            "train_flowrl": train_flowrl, "train_bare": train_bare}


def time_interleaved(path: str, repeats: int) -> dict:
    """Median seconds of each variant, run A/B interleaved so machine load hits all alike."""
    torch.set_num_threads(1)
    fns = variants(path)
    for fn in fns.values():
        fn()  # warm-up
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t0)
    return {k: {"median_s": statistics.median(v), "min_s": min(v)} for k, v in samples.items()}


def peak_rss(mode: str, path: str) -> float:
    """Peak resident MB of one variant run once in this (fresh) process."""
    torch.set_num_threads(1)
    variants(path)[mode]()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="outputs/bench_t2i.json")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--mode", default=None)
    ap.add_argument("--path", default=None)
    args = ap.parse_args()
    if args.mode:  # child process: peak memory of one variant
        print(json.dumps({"peak_rss_mb": peak_rss(args.mode, args.path)}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        results = time_interleaved(tmp, args.repeats)
        for mode in results:
            out = subprocess.run([sys.executable, __file__, "--mode", mode, "--path", tmp],
                                 capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            if out.returncode != 0:
                raise SystemExit(out.stderr[-2000:])
            results[mode].update(json.loads(out.stdout.strip().splitlines()[-1]))
    ratios = {
        "rollout_time_ratio": results["rollout_flowrl"]["median_s"] / results["rollout_bare"]["median_s"],
        "train_time_ratio": results["train_flowrl"]["median_s"] / results["train_bare"]["median_s"],
        "rollout_peak_rss_ratio": results["rollout_flowrl"]["peak_rss_mb"] / results["rollout_bare"]["peak_rss_mb"],
        "train_peak_rss_ratio": results["train_flowrl"]["peak_rss_mb"] / results["train_bare"]["peak_rss_mb"],
    }
    for mode, r in results.items():
        print(f"{mode:<16} median {r['median_s'] * 1000:8.1f} ms   min {r['min_s'] * 1000:8.1f} ms   peak RSS {r['peak_rss_mb']:7.0f} MB")
    for k, v in ratios.items():
        print(f"{k:<24} {v:.3f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"results": results, "ratios": ratios, "steps": STEPS, "batch": BATCH}, fh, indent=2)


if __name__ == "__main__":
    main()
