"""Benchmark: flowrl's text-to-image head vs the bare diffusers calls (random weights).

    python tests/benchmarks/bench_t2i.py [--out outputs/bench_t2i.json] [--repeats 7]
    python tests/benchmarks/bench_t2i.py --size sd35m --device cuda --dtype bfloat16   # a GPU

Sizes: ``tiny`` (the default; CPU): a 4-layer SD3 transformer, 256 latent tokens, LoRA r8,
CFG 4.5, batch 4, 10 steps. ``sd35m``: a transformer with SD3.5-Medium's published config
(24 layers, dual attention in 0-12, 2.24B parameters) at 512 px (1024 latent tokens, 256 T5
tokens), LoRA r32/a64 as in the sd35m recipes, batch 4 (Flow-GRPO's micro-batch), CFG 4.5,
10 steps; its text encoders are one-layer stand-ins with the real output widths (CLIP-L 768,
CLIP-G 1280, T5 4096), so the memory figures are the transformer's, without T5-XXL.
Measures:
  rollout: flowrl's chain with per-step log-probs (Flow-GRPO SDE) vs the pipeline's own
           denoising loop (same steps, batch, CFG; prompt embeddings given, no VAE decode);
  train:   one Flow-GRPO loss forward + backward on a minibatch of transitions vs a bare
           transformer forward + backward (with CFG, MSE loss) on the same inputs;
           ``train_flowrl_gc`` repeats flowrl's with gradient checkpointing on (sd35m only);
  memory:  on CPU, peak resident memory of each variant in its own process; on a GPU, peak
           allocated GPU memory of each variant (torch.cuda.max_memory_allocated).
Times are medians of A/B-interleaved repeats in one process, so load on the machine hits
both sides alike. Prints a table and writes JSON. Not part of `make test`.
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

STEPS = 10
SIZES = {
    "tiny": dict(batch=4, resolution=32, lora_rank=8, lora_alpha=16, max_sequence_length=16),
    "sd35m": dict(batch=4, resolution=512, lora_rank=32, lora_alpha=64, max_sequence_length=256),
}


def build(directory: str, size: str = "tiny", device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
    """Save a random-weight StableDiffusion3Pipeline of ``size`` to ``directory``."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from flowrl.heads.t2i.tiny import _clip_text, _t5, _vae
    from flowrl.heads.t2i.tokenizers import build_clip_tokenizer

    torch.manual_seed(0)
    if size == "tiny":
        with torch.device(device):
            transformer = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=16, num_layers=4,
                                                attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
                                                caption_projection_dim=128, pooled_projection_dim=64, out_channels=16,
                                                pos_embed_max_size=32)
        vae = _vae(16, blocks=(8,))
        clip_l, clip_g = _clip_text(True), _clip_text(True)
        t5 = _t5()
    else:  # SD3.5-Medium's transformer config; text encoders: one-layer stand-ins of the real widths
        with torch.device(device):  # initialising 2.24B parameters on the CPU alone takes minutes
            transformer = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16, num_layers=24,
                                                attention_head_dim=64, num_attention_heads=24,
                                                joint_attention_dim=4096, caption_projection_dim=1536,
                                                pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=384,
                                                dual_attention_layers=tuple(range(13)), qk_norm="rms_norm")
        vae = _vae(16, blocks=(32, 32, 32, 32), shift_factor=0.0609, scaling_factor=1.5305,
                   use_quant_conv=False, use_post_quant_conv=False)  # 8x downsampling like SD3's VAE
        clip_l, clip_g, t5 = _clip_text(True, hidden=768), _clip_text(True, hidden=1280), _t5(d_model=4096)
    transformer = transformer.to(dtype).eval()
    tok = build_clip_tokenizer(os.path.join(directory, "_tok"), 2000)
    StableDiffusion3Pipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae,
                             text_encoder=clip_l, tokenizer=tok, text_encoder_2=clip_g, tokenizer_2=tok,
                             text_encoder_3=t5, tokenizer_3=tok).save_pretrained(directory)


def setup(path: str, size: str, device: str, dtype: str):
    from flowrl.heads.t2i import T2IHeadConfig, build_t2i_head

    s = SIZES[size]
    head = build_t2i_head(T2IHeadConfig(family="sd3", path=path, resolution=s["resolution"], guidance_scale=4.5,
                                        max_sequence_length=s["max_sequence_length"], lora_rank=s["lora_rank"],
                                        lora_alpha=s["lora_alpha"], dtype=dtype)).to(device)
    cond = head.encode([f"prompt {i}" for i in range(s["batch"])])
    x0 = head.init_noise(cond, [torch.Generator().manual_seed(i) for i in range(s["batch"])]).to(device)
    return head, cond, x0


def variants(path: str, size: str = "tiny", device: str = "cpu", dtype: str = "float32") -> dict:
    """The measured callables on one loaded head."""
    from flowrl.algorithms.base import Policy
    from flowrl.algorithms.grpo import GRPO, GRPOConfig
    from flowrl.mdp import sample_chain
    from flowrl.samplers import FlowSDESampler

    s = SIZES[size]
    batch, res = s["batch"], s["resolution"]
    head, cond, x0 = setup(path, size, device, dtype)
    sampler = FlowSDESampler.flow_grpo(0.7)
    times = head.time_grid(STEPS)
    gens = lambda: [torch.Generator().manual_seed(10 + i) for i in range(batch)]  # noqa: E731
    pipe = head.pipe
    on = {k: v.to(device) for k, v in cond.items()}
    embeds = torch.cat([on["neg_prompt_embeds"], on["prompt_embeds"]])
    pooled = torch.cat([on["neg_pooled"], on["pooled"]])

    def rollout_flowrl():
        with torch.no_grad():
            sample_chain(head.velocity, sampler, x0, cond, times, gens())

    def rollout_bare():
        pipe(prompt_embeds=on["prompt_embeds"], pooled_prompt_embeds=on["pooled"],
             negative_prompt_embeds=on["neg_prompt_embeds"], negative_pooled_prompt_embeds=on["neg_pooled"],
             latents=x0.clone().to(head.dtype), num_inference_steps=STEPS, guidance_scale=4.5, output_type="latent",
             height=res, width=res)

    with torch.no_grad():
        res_chain = sample_chain(head.velocity, sampler, x0, cond, times, gens())
    k = 3
    units = {"x": res_chain["states"][:, k], "x_next": res_chain["states"][:, k + 1],
             "t": times[k].expand(batch).to(device), "t_next": times[k + 1].expand(batch).to(device),
             "old_log_prob": res_chain["log_probs"][:, k], "adv": torch.randn(batch, device=device),
             "valid": torch.ones(batch, device=device), "step_weight": torch.ones(batch, device=device)}
    algo = GRPO(GRPOConfig(group_size=2, kl_beta=0.0))
    policy = Policy(head.velocity, head.reference_velocity, sampler)
    params = head.trainable_parameters()

    def train_flowrl():
        loss, _ = algo.loss(units, cond, policy)
        loss.mean().backward()
        for p in params:
            p.grad = None

    def train_bare():
        x = torch.cat([units["x"], units["x"]]).to(head.dtype)
        t = torch.cat([units["t"], units["t"]]) * 1000
        out = head.denoiser(hidden_states=x, timestep=t, encoder_hidden_states=embeds, pooled_projections=pooled,
                            return_dict=False)[0]
        u, c = out.chunk(2)
        (u + 4.5 * (c - u)).float().sub(units["x_next"]).pow(2).mean().backward()
        for p in params:
            p.grad = None

    fns = {"rollout_flowrl": rollout_flowrl, "rollout_bare": rollout_bare,
           "train_flowrl": train_flowrl, "train_bare": train_bare}
    if size != "tiny":
        def train_flowrl_gc():
            head.denoiser.enable_gradient_checkpointing()
            try:
                train_flowrl()
            finally:
                head.denoiser.disable_gradient_checkpointing()
        fns["train_flowrl_gc"] = train_flowrl_gc
    return fns


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_interleaved(path: str, repeats: int, size: str = "tiny", device: str = "cpu", dtype: str = "float32") -> dict:
    """Median seconds of each variant, run A/B interleaved so machine load hits all alike; on a
    GPU also each variant's peak allocated memory (MB)."""
    torch.set_num_threads(1)
    fns = variants(path, size, device, dtype)
    peaks = {}
    for k, fn in fns.items():  # warm-up; on a GPU, the peak memory of each variant alone
        if device.startswith("cuda"):
            _sync(device)
            torch.cuda.reset_peak_memory_stats()
        fn()
        if device.startswith("cuda"):
            _sync(device)
            peaks[k] = torch.cuda.max_memory_allocated() / 2 ** 20
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            samples[k].append(time.perf_counter() - t0)
    out = {k: {"median_s": statistics.median(v), "min_s": min(v)} for k, v in samples.items()}
    for k, mb in peaks.items():
        out[k]["peak_gpu_mb"] = mb
    return out


def peak_rss(mode: str, path: str, size: str = "tiny", dtype: str = "float32") -> float:
    """Peak resident MB of one variant run once in this (fresh) process."""
    torch.set_num_threads(1)
    variants(path, size, "cpu", dtype)[mode]()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="outputs/bench_t2i.json")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype")
    ap.add_argument("--mode", default=None)
    ap.add_argument("--path", default=None)
    args = ap.parse_args()
    if args.mode:  # child process: peak memory of one variant
        print(json.dumps({"peak_rss_mb": peak_rss(args.mode, args.path, args.size, args.dtype)}))
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no GPU")
    gpu = args.device.startswith("cuda")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build(tmp, args.size, args.device if gpu else "cpu", getattr(torch, args.dtype))
        print(f"built and saved the {args.size} pipeline in {time.perf_counter() - t0:.1f} s", flush=True)
        results = time_interleaved(tmp, args.repeats, args.size, args.device, args.dtype)
        if not gpu:
            for mode in results:
                out = subprocess.run([sys.executable, __file__, "--mode", mode, "--path", tmp,
                                      "--size", args.size, "--dtype", args.dtype],
                                     capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
                if out.returncode != 0:
                    raise SystemExit(out.stderr[-2000:])
                results[mode].update(json.loads(out.stdout.strip().splitlines()[-1]))
    mem = "peak_gpu_mb" if gpu else "peak_rss_mb"
    ratios = {
        "rollout_time_ratio": results["rollout_flowrl"]["median_s"] / results["rollout_bare"]["median_s"],
        "train_time_ratio": results["train_flowrl"]["median_s"] / results["train_bare"]["median_s"],
        f"rollout_{mem}_ratio": results["rollout_flowrl"][mem] / results["rollout_bare"][mem],
        f"train_{mem}_ratio": results["train_flowrl"][mem] / results["train_bare"][mem],
    }
    where = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"size {args.size}, {args.dtype} weights, device {where}, batch {SIZES[args.size]['batch']}, {STEPS} steps")
    for mode, r in results.items():
        print(f"{mode:<16} median {r['median_s'] * 1000:8.1f} ms   min {r['min_s'] * 1000:8.1f} ms   "
              f"peak {'GPU' if gpu else 'RSS'} {r[mem]:7.0f} MB")
    for k, v in ratios.items():
        print(f"{k:<28} {v:.3f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"results": results, "ratios": ratios, "steps": STEPS, "size": args.size, "dtype": args.dtype,
                   "device": where, **SIZES[args.size]}, fh, indent=2)


if __name__ == "__main__":
    main()
