"""Pretrain the tiny text-to-image model of the shapes world (issue 5's "pretrained model").

    .venv/bin/python examples/shapes/pretrain.py --output-dir examples/shapes/model --threads 2   # the committed model (63-104 min, README)
    .venv/bin/python examples/shapes/pretrain.py --output-dir /tmp/shapes_try --steps 150  # a quick try
    (--channels-last: 0.91x the time per step, but not bit for bit the committed model; README)

Result: a ``StableDiffusionPipeline`` folder (diffusers format, SD1.5-style) whose UNet is
trained with rectified flow, so its folder names a ``FlowMatchEulerDiscreteScheduler``; the
text-to-image head loads it with its normal path (``head: {name: t2i, family: sd, path: DIR,
resolution: 32}``) and, from that scheduler, treats it as a velocity model (flow samplers,
FDFO). Components:

- ``vae``: a pixel-space identity ``AutoencoderKL`` (one block of 12 channels, no
  downsampling, so ``vae_scale_factor`` = 1). Its weights are CONSTRUCTED, not trained:
  every residual branch is zeroed and the GroupNorm -> SiLU -> conv tail is made exact by
  carrying each colour channel as (K + x, -K - x, K - x, -K + x) with K = 1000, whose group
  mean is 0 and group std is K (up to 5e-4 of the [-1, 1] range), so decode(encode(x)) = x
  to about 0.1 of an 8-bit level. The "latents" are the 32 x 32 RGB pixels in [-1, 1] minus
  their training mean (baked into the conv biases, because SD1.x pipelines ignore
  ``shift_factor``) times ``scaling_factor`` (1 / std).
- ``unet``: a small ``UNet2DConditionModel`` (``--channels``, cross-attention at the levels
  ``--attn`` marks (``--up-attn`` for the up path, if it differs) and in the mid block),
  called as unet(x_t, 1000 t, text) -> eps - x0.
- ``text_encoder``: a small ``CLIPTextModel`` trained jointly with the UNet (its last hidden
  state is the cross-attention context), with a real CLIP BPE tokenizer built from
  open-clip-torch's shipped vocabulary (``flowrl.heads.t2i.tokenizers``; first 8000 merges,
  16 tokens per prompt).
- ``scheduler``: ``FlowMatchEulerDiscreteScheduler(shift=--shift)``. Plain diffusers'
  ``StableDiffusionPipeline.__call__`` asks every scheduler for ``init_noise_sigma`` and
  ``scale_model_input``, which flow schedulers lack; set them to 1.0 and the identity to
  sample it there (``tests/t2i/test_sd_flow_unet.py`` does exactly this).

Why a UNet: an SD3 transformer (patch 2, 4 layers, width 64 or 128) trained the same way
reached only 0.04 held-out ShapesEval after 3000-4000 steps: every object came out as a
round blob. The convolutional UNet draws corners and edges within 1000 steps.

Training data: renders of the PRETRAIN prompts of ``split_prompts(split_seed)`` only
(``--scenes-per-prompt`` random ground-truth scenes each, seeded); prompts are drawn half
uniformly over prompts and half uniformly over categories; ``--cfg-dropout`` of the
captions are replaced by the empty prompt (the negative prompt of CFG); ``--caption-noise``
(default 0.1, the committed model) replaces that share of the others by a near miss of the
same category (``noisy_captions``), as web captions' noise does. Loss: rectified
flow, x_t = (1 - t) x0 + t eps, target eps - x0, t uniform in [0, 1] (``--t-dist``) then
shifted by ``--shift`` like the scheduler. AdamW, linear warm-up then cosine decay, an EMA
of the weights (``--ema``; the curve and the saved pipeline use it); everything is seeded by
``--seed``: bit for bit reproducible on the same machine and torch version with the same thread count
(``torch.use_deterministic_algorithms`` is on; before 2026-12-07 two-thread runs were not, see FINDINGS).

A held-out learning curve (eval split, balanced per category, fixed seeds, Euler with the
scheduler's own sigmas, guidance 1 and 3) is written to ``OUTPUT_DIR_log/curve.jsonl``
unless ``--log-dir`` says otherwise, with sample grids.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from typing import Dict, List, Sequence

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from flowrl.trainer.checkpoint import replace_dir  # noqa: E402
from rewards.shapes.prompts import (  # noqa: E402
    CATEGORIES, MISMATCHES, is_held_out, mismatch, sample_scene, split_prompts, take_per_category)
from rewards.shapes.world import render  # noqa: E402

BIG = 1000.0        # K: carrier offset of the identity autoencoder
SILU_SHIFT = 20.0   # keeps SiLU in its linear range (error < 1e-7)
NUM_MERGES = 8000   # BPE merges kept (vocabulary 8514 tokens)
MAX_TOKENS = 16     # CLIP tokens per prompt (the longest shapes prompt has 10 with BOS/EOS)

# --------------------------------------------------------------------------- identity VAE
def _carrier(conv: torch.nn.Conv2d, channels: int) -> None:
    """conv: ``channels`` inputs -> 4 * channels outputs (K + x, -K - x, K - x, -K + x)."""
    w = torch.zeros_like(conv.weight)
    b = torch.zeros_like(conv.bias)
    for i in range(channels):
        for j, (s, sg) in enumerate(((1, 1), (-1, 1), (1, -1), (-1, -1))):
            w[4 * i + j, i, 1, 1] = s * sg
            b[4 * i + j] = s * BIG
    conv.weight.data.copy_(w)
    conv.bias.data.copy_(b)


def _tail(norm: torch.nn.GroupNorm, conv: torch.nn.Conv2d, channels: int, extra_bias: Sequence[float] = ()) -> None:
    """GroupNorm (one group per colour) + SiLU + conv -> x exactly (see the module docstring)."""
    gamma = torch.zeros_like(norm.weight)
    beta = torch.zeros_like(norm.bias)
    w = torch.zeros_like(conv.weight)
    b = torch.zeros_like(conv.bias)
    for i in range(channels):
        for j, (s, sg) in enumerate(((1, 1), (-1, 1), (1, -1), (-1, -1))):
            gamma[4 * i + j] = s * BIG           # s K (s (K + sg x)) / K = K + sg x
            beta[4 * i + j] = -BIG + SILU_SHIFT  # -> sg x + SILU_SHIFT (SiLU ~ identity there)
            w[i, 4 * i + j, 1, 1] = sg / 4.0     # mean of sg (sg x + c) = x
    for k, v in enumerate(extra_bias):
        b[channels + k] = v
    norm.weight.data.copy_(gamma)
    norm.bias.data.copy_(beta)
    conv.weight.data.copy_(w)
    conv.bias.data.copy_(b)


def identity_autoencoder(shift_factor: float, scaling_factor: float):
    """An ``AutoencoderKL`` whose encode (mean) and decode are the identity on [B, 3, H, W]."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",),
                        up_block_types=("UpDecoderBlock2D",), block_out_channels=(12,), layers_per_block=1,
                        latent_channels=3, norm_num_groups=3, sample_size=32, scaling_factor=scaling_factor,
                        shift_factor=shift_factor, force_upcast=False, use_quant_conv=False,
                        use_post_quant_conv=False, mid_block_add_attention=False)
    with torch.no_grad():
        for p in vae.parameters():
            p.zero_()
        for m in vae.modules():  # residual branches off: every ResnetBlock2D is the identity
            if m.__class__.__name__ == "ResnetBlock2D":
                for norm in (m.norm1, m.norm2):
                    norm.weight.fill_(1.0)
        enc, dec = vae.encoder, vae.decoder
        _carrier(enc.conv_in, 3)
        _tail(enc.conv_norm_out, enc.conv_out, 3, extra_bias=(-30.0,) * 3)  # logvar -30: std 3e-7
        _carrier(dec.conv_in, 3)
        _tail(dec.conv_norm_out, dec.conv_out, 3)
    return vae.eval()


# --------------------------------------------------------------------------- data
def render_dataset(items: Sequence[Dict], per_prompt: int, seed: int) -> np.ndarray:
    """uint8 [len(items), per_prompt, 32, 32, 3] of ground-truth scenes (seeded per prompt)."""
    out = np.empty((len(items), per_prompt, 32, 32, 3), dtype=np.uint8)
    for i, it in enumerate(items):
        g = np.random.default_rng([seed, i])
        for j in range(per_prompt):
            out[i, j] = render(sample_scene(it, g))
    return out


def noisy_captions(caps: List[str], items: Sequence[Dict], p: float, rng: np.random.Generator) -> List[str]:
    """Replace a share ``p`` of the non-empty captions by a near-miss prompt of the image's item
    (``mismatch``: wrong shape / colour / count, swapped relation or binding), so the caption
    no longer describes its image. Near misses that are held-out prompts are redrawn (up to 8
    tries, then the true caption stays), so no held-out prompt is ever a caption."""
    out = list(caps)
    for k, (c, it, u) in enumerate(zip(caps, items, rng.random(len(caps)))):
        if c and u < p:
            kinds = MISMATCHES[it["category"]]
            for _ in range(8):
                wrong = mismatch(it, kinds[int(rng.integers(len(kinds)))], rng)
                if not is_held_out(wrong):
                    out[k] = wrong["prompt"]
                    break
    return out


def eval_set(split_seed: int, per_category: int):
    """Balanced held-out set: ``per_category`` (item, seed) pairs per category, prompts cycled."""
    ev = split_prompts(split_seed)["eval"]
    items, seeds = [], []
    for cat in CATEGORIES:
        pool = [it for it in ev if it["category"] == cat]
        pick = take_per_category(pool, per_category, seed=0)
        for j in range(per_category):
            items.append(pick[j % len(pick)])
            seeds.append(len(seeds))
    return items, seeds


# --------------------------------------------------------------------------- pipeline
def shifted_identity_vae(shift: float, scale: float):
    """Identity VAE whose encode subtracts ``shift`` and decode adds it back (SD1.x convention:
    latents = encode(x) * scaling_factor, image = decode(latents / scaling_factor))."""
    vae = identity_autoencoder(0.0, scale)
    with torch.no_grad():
        vae.encoder.conv_out.bias[:3] -= shift
        vae.decoder.conv_out.bias[:3] += shift
    return vae


def clip_text_model(hidden: int, layers: int, heads: int, seed: int, vocab: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, max_position_embeddings=MAX_TOKENS, projection_dim=hidden,
                         bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    torch.manual_seed(seed)
    return CLIPTextModel(cfg)


def make_unet(args):
    from diffusers import UNet2DConditionModel

    ch = tuple(args.channels)
    attn = tuple(args.attn)  # 1 = cross-attention at that level
    up_attn = attn if args.up_attn is None else tuple(args.up_attn)
    only_cross = tuple(bool(o) for o in (args.only_cross or [0] * len(ch)))
    assert len(attn) == len(ch) == len(up_attn) == len(only_cross)
    down = tuple("CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn)
    up = tuple("CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(up_attn))
    torch.manual_seed(args.seed)
    return UNet2DConditionModel(
        sample_size=32, in_channels=3, out_channels=3, down_block_types=down, up_block_types=up,
        mid_block_type="UNetMidBlock2DCrossAttn", block_out_channels=ch, layers_per_block=args.layers_per_block,
        norm_num_groups=args.groups, cross_attention_dim=args.text_dim, only_cross_attention=only_cross,
        attention_head_dim=[max(1, c // args.head_dim) for c in ch],  # diffusers' legacy name: number of heads
        flip_sin_to_cos=True, freq_shift=0)


def build_pipeline(args, tok_dir: str, shift: float, scale: float):
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusionPipeline

    from flowrl.heads.t2i.tokenizers import build_clip_tokenizer

    tok = build_clip_tokenizer(tok_dir, NUM_MERGES, model_max_length=MAX_TOKENS)
    te = clip_text_model(args.text_dim, args.text_layers, args.text_heads, args.seed + 1, len(tok))
    return StableDiffusionPipeline(vae=shifted_identity_vae(shift, scale), text_encoder=te, tokenizer=tok,
                                   unet=make_unet(args), scheduler=FlowMatchEulerDiscreteScheduler(shift=args.shift),
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)


def encode(pipe, prompts: List[str]) -> torch.Tensor:
    """[n, 16, d] through the pipeline's own encode_prompt (differentiable)."""
    return pipe.encode_prompt(prompts, device="cpu", num_images_per_prompt=1, do_classifier_free_guidance=False)[0]


def velocity(pipe, x, t, emb):
    return pipe.unet(x, t * pipe.scheduler.config.num_train_timesteps, encoder_hidden_states=emb).sample


def to_latent(pipe, images01: torch.Tensor) -> torch.Tensor:
    return pipe.vae.encode(images01 * 2 - 1).latent_dist.mean * pipe.vae.config.scaling_factor


def from_latent(pipe, x: torch.Tensor) -> torch.Tensor:
    return (pipe.vae.decode(x / pipe.vae.config.scaling_factor, return_dict=False)[0] / 2 + 0.5).clamp(0, 1)


@torch.no_grad()
def sample(pipe, prompts: List[str], seeds: Sequence[int], steps: int, guidance: float = 1.0, batch: int = 64):
    """Euler ODE on the scheduler's sigma grid (same noise seeds as pretrain.py) -> [n, 3, 32, 32] in [0, 1]."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from flowrl import rng

    sched = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(steps, device="cpu")
    sigmas = sched.sigmas.float()
    neg = encode(pipe, [""]) if guidance > 1 else None
    out = []
    for s in range(0, len(prompts), batch):
        ps = prompts[s:s + batch]
        e = encode(pipe, ps)
        if neg is not None:
            e = torch.cat([neg.expand(len(ps), -1, -1), e])
        x = torch.stack([torch.randn((3, 32, 32), generator=rng.generator(0, rng.STREAM_EVAL, sd, 0, 0))
                         for sd in seeds[s:s + batch]])
        for k in range(steps):
            t, tn = sigmas[k], sigmas[k + 1]
            tt = t.expand(len(ps))
            if neg is not None:
                vu, vc = velocity(pipe, torch.cat([x, x]), torch.cat([tt, tt]), e).chunk(2)
                v = vu + guidance * (vc - vu)
            else:
                v = velocity(pipe, x, tt, e)
            x = x + (tn - t) * v
        out.append(from_latent(pipe, x))
    return torch.cat(out)


def set_mode(pipe, train: bool) -> None:
    pipe.unet.train(train)
    pipe.text_encoder.train(train)


def measure(pipe, items, seeds, steps: int, guidance: float):
    from rewards.shapes.verifier import evaluate

    set_mode(pipe, False)
    imgs = sample(pipe, [it["prompt"] for it in items], seeds, steps, guidance)
    set_mode(pipe, True)
    return {k: round(v, 4) for k, v in evaluate(imgs, items).items()}, imgs


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-dir", default="", help="pipeline folder (required unless --bench)")
    ap.add_argument("--log-dir", default="", help="log.txt and curve.jsonl (default: OUTPUT_DIR_log, or "
                                                   "outputs/pretrain_bench_log with --bench)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the rendered scenes, the weights and the training order")
    ap.add_argument("--split-seed", type=int, default=0,
                    help="seed of the pretrain / RL / held-out prompt split (rewards.shapes.prompts)")
    ap.add_argument("--scenes-per-prompt", type=int, default=256,
                    help="rendered scenes per pretraining prompt")
    ap.add_argument("--steps", type=int, default=3000,
                    help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=64,
                    help="images per step")
    ap.add_argument("--lr", type=float, default=2e-3,
                    help="peak AdamW learning rate (cosine decay after the warmup)")
    ap.add_argument("--warmup", type=int, default=100,
                    help="linear warmup steps")
    ap.add_argument("--weight-decay", type=float, default=0.01,
                    help="AdamW weight decay")
    ap.add_argument("--cfg-dropout", type=float, default=0.1,
                    help="share of captions replaced by the empty prompt (for classifier-free guidance)")
    ap.add_argument("--caption-noise", type=float, default=0.1,
                    help="share of captions replaced by a near-miss prompt of the same category "
                         "(rewards.shapes.prompts.mismatch; never a held-out prompt), like web captions' noise")
    ap.add_argument("--t-dist", choices=["uniform", "logit_normal"], default="uniform",
                    help="distribution of training times before the shift")
    ap.add_argument("--shift", type=float, default=3.0, help="scheduler shift S; training t -> S t / (1 + (S-1) t)")
    ap.add_argument("--ema", type=float, default=0.999,
                    help="EMA decay of the saved weights (0 = save the raw weights)")
    ap.add_argument("--channels", type=int, nargs="+", default=[32, 64, 64],
                    help="UNet channels per resolution level (32x32, 16x16, 8x8)")
    ap.add_argument("--attn", type=int, nargs="+", default=[0, 1, 1],
                    help="cross-attention per level (0/1) at 32x32, 16x16, 8x8; 0 0 1 was the model before 2026-12-06")
    ap.add_argument("--up-attn", type=int, nargs="+", default=None,
                    help="cross-attention per level in the up path (default: as --attn)")
    ap.add_argument("--only-cross", type=int, nargs="+", default=None,
                    help="per level (0/1): its transformer blocks attend to the text twice, no self-attention "
                         "(default: all 0)")
    ap.add_argument("--layers-per-block", type=int, default=1,
                    help="ResNet layers per UNet block")
    ap.add_argument("--groups", type=int, default=8, help="GroupNorm groups")
    ap.add_argument("--head-dim", type=int, default=16, help="channels per attention head")
    ap.add_argument("--text-dim", type=int, default=64,
                    help="text encoder width (= the UNet's cross-attention dim)")
    ap.add_argument("--text-layers", type=int, default=2,
                    help="text encoder layers")
    ap.add_argument("--text-heads", type=int, default=2,
                    help="text encoder attention heads")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="held-out evaluation every N steps (0 = only at the end; each costs about 40 s, "
                         "which the default run's 60-minute budget has no room for)")
    ap.add_argument("--eval-per-category", type=int, default=16,
                    help="held-out images per category in each evaluation")
    ap.add_argument("--eval-steps", type=int, default=20,
                    help="Euler steps of the evaluation sampler")
    ap.add_argument("--eval-guidance", type=float, nargs="+", default=[1.0, 3.0],
                    help="CFG scales evaluated")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads")
    ap.add_argument("--channels-last", action="store_true",
                    help="UNet weights in channels-last (NHWC) memory: faster convolutions on CPU, a model equal "
                         "up to float rounding, so not bit for bit the committed one (trained without it)")
    ap.add_argument("--bench", type=int, default=0,
                    help="only time this many training steps (at least 4; the first 3 warm up) and exit")
    args = ap.parse_args(argv)
    if not args.bench and not args.output_dir:
        ap.error("--output-dir is required (or --bench N to time N steps)")
    if 0 < args.bench < 4:
        ap.error("--bench N times the steps after 3 warm-up steps; use N >= 4")
    for name in ("attn", "up_attn", "only_cross"):
        flags = getattr(args, name)
        if flags is not None and (len(flags) != len(args.channels) or set(flags) - {0, 1}):
            ap.error(f"--{name.replace('_', '-')} needs one 0/1 per level of --channels ({len(args.channels)})")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(args.threads)
    # reproducible on 2+ threads too: fail loudly if an op without a deterministic CPU kernel creeps in
    torch.use_deterministic_algorithms(True)
    try:
        pretrain(args)
    finally:  # leave the caller's process (a test session) as it was
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict)


def pretrain(args: argparse.Namespace) -> None:
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    bench_log = os.path.join("outputs", "pretrain_bench_log")
    log_dir = args.log_dir or (args.output_dir.rstrip("/") + "_log" if args.output_dir else bench_log)
    os.makedirs(log_dir, exist_ok=True)
    t_start = time.time()

    def log(msg: str) -> None:
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        with open(os.path.join(log_dir, "log.txt"), "a") as fh:
            fh.write(line + "\n")

    items = split_prompts(args.split_seed)["pretrain"]
    per_prompt = 8 if args.bench else args.scenes_per_prompt
    data = render_dataset(items, per_prompt, args.seed)
    pix = torch.from_numpy(data).float().div(255).mul(2).sub(1)
    shift, scale = float(pix.mean()), float(1.0 / pix.std())
    del pix
    log(f"rendered {data.shape[0]} x {data.shape[1]} scenes; latent shift {shift:.4f} scale {scale:.4f}")

    pipe = build_pipeline(args, os.path.join(log_dir, "_tokenizer"), shift, scale)
    params = {n: sum(p.numel() for p in getattr(pipe, n).parameters()) for n in ("unet", "text_encoder", "vae")}
    log(f"args {vars(args)}")
    log(f"parameters: {params}; unet blocks {pipe.unet.config.down_block_types}")
    if args.channels_last:  # before the optimizer and EMA copy the weights; saving restores the usual layout
        pipe.unet.to(memory_format=torch.channels_last)
    trainable = [p for n in ("unet", "text_encoder") for p in getattr(pipe, n).parameters()]
    set_mode(pipe, True)
    pipe.vae.requires_grad_(False)
    opt = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.99))
    ema = [p.detach().clone() for p in trainable] if args.ema > 0 else None

    def swap_ema() -> None:
        if ema is not None:
            with torch.no_grad():
                for p, q in zip(trainable, ema):
                    tmp = p.detach().clone()
                    p.copy_(q)
                    q.copy_(tmp)

    cats = np.array([CATEGORIES.index(it["category"]) for it in items])
    counts = np.bincount(cats, minlength=len(CATEGORIES))
    probs = 0.5 / len(items) + 0.5 / (counts > 0).sum() / counts[cats]
    probs = probs / probs.sum()
    prompts = [it["prompt"] for it in items]
    g = np.random.default_rng([args.seed, 1])
    tg = torch.Generator().manual_seed(args.seed + 7)
    ev_items, ev_seeds = eval_set(args.split_seed, args.eval_per_category)
    curve_path = os.path.join(log_dir, "curve.jsonl")
    if not args.bench:
        open(curve_path, "w").close()

    def record(step: int, loss: float, sps: float) -> None:
        swap_ema()
        try:
            row = {"step": step, "loss": round(loss, 5), "s_per_step": round(sps, 3),
                   "wall_s": round(time.time() - t_start, 1)}
            for w in args.eval_guidance:
                t0 = time.time()
                m, imgs = measure(pipe, ev_items, ev_seeds, args.eval_steps, w)
                row[f"heldout_cfg{w:g}"] = m
                log(f"step {step} held-out (guidance {w:g}, {time.time() - t0:.0f}s) {m}")
                from torchvision.utils import save_image

                save_image(imgs, os.path.join(log_dir, f"samples_{step:06d}_cfg{w:g}.png"),
                           nrow=args.eval_per_category)
            with open(curve_path, "a") as fh:
                fh.write(json.dumps(row) + "\n")
        finally:
            swap_ema()

    total = args.bench or args.steps
    run_loss, last_loss, t_train, t_eval = 0.0, float("nan"), time.time(), 0.0
    for step in range(1, total + 1):
        pi = g.choice(len(items), size=args.batch_size, p=probs)
        si = g.integers(0, data.shape[1], size=args.batch_size)
        imgs = torch.from_numpy(data[pi, si]).permute(0, 3, 1, 2).float().div(255).contiguous()
        caps = [prompts[i] if u >= args.cfg_dropout else "" for i, u in zip(pi, g.random(args.batch_size))]
        if args.caption_noise > 0:
            caps = noisy_captions(caps, [items[i] for i in pi], args.caption_noise, g)
        with torch.no_grad():
            x0 = to_latent(pipe, imgs)
        uniq = list(dict.fromkeys(caps))
        # index_select, not advanced indexing: on CPU with 2+ threads the backward of x[idx] with repeated
        # indices accumulates racily, so the text encoder's gradients (and every later step) change run to run
        e = encode(pipe, uniq).index_select(0, torch.tensor([uniq.index(c) for c in caps]))
        if args.t_dist == "uniform":
            t = torch.rand(args.batch_size, generator=tg)
        else:
            t = torch.sigmoid(torch.randn(args.batch_size, generator=tg))
        if args.shift != 1.0:
            t = args.shift * t / (1 + (args.shift - 1) * t)
        eps = torch.randn(x0.shape, generator=tg)
        tb = t.view(-1, 1, 1, 1)
        xt = (1 - tb) * x0 + tb * eps
        loss = torch.nn.functional.mse_loss(velocity(pipe, xt, t, e), eps - x0)
        if step <= args.warmup:
            f = step / args.warmup
        else:
            f = 0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))
        for gr in opt.param_groups:
            gr["lr"] = args.lr * f
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        if ema is not None:
            d = min(args.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in trainable], 1 - d)
        run_loss += loss.item()
        if args.bench:
            if step == 3:
                t_b = time.time()
            continue
        sps = (time.time() - t_train - t_eval) / step
        if step % 50 == 0:
            log(f"step {step} loss {run_loss / 50:.4f} lr {args.lr * f:.2e} ({sps:.3f} s/step)")
            last_loss, run_loss = run_loss / 50, 0.0
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            t0 = time.time()
            record(step, last_loss, sps)
            t_eval += time.time() - t0
    if args.bench:
        sps = (time.time() - t_b) / (total - 3)
        log(f"BENCH channels {args.channels} attn {args.attn} up {args.up_attn} only-cross {args.only_cross} "
            f"lpb {args.layers_per_block}{' channels-last' if args.channels_last else ''}: {sps:.3f} s/step "
            f"(batch {args.batch_size}, {args.threads} thread), unet {params['unet'] / 1e6:.2f}M params, "
            f"loss {run_loss / total:.4f}")
        return
    train_s = time.time() - t_train - t_eval
    log(f"training took {train_s:.0f} s ({train_s / args.steps:.3f} s/step), evals {t_eval:.0f} s")
    record(args.steps, last_loss, train_s / args.steps)
    swap_ema()  # save the EMA weights
    set_mode(pipe, False)
    tmp = args.output_dir.rstrip("/") + ".tmp"  # written whole first: a failed save keeps the earlier model
    shutil.rmtree(tmp, ignore_errors=True)
    pipe.save_pretrained(tmp, safe_serialization=True)
    replace_dir(tmp, args.output_dir)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.output_dir) for f in fs)
    info = {"args": vars(args), "parameters": params, "train_s": round(train_s, 1),
            "total_s": round(time.time() - t_start, 1), "size_mb": round(size / 2 ** 20, 2),
            "latent_shift": shift, "latent_scale": scale, "torch": torch.__version__}
    with open(os.path.join(log_dir, "pretrain.json"), "w") as fh:
        json.dump(info, fh, indent=2)
    log(f"saved {args.output_dir} ({size / 2 ** 20:.2f} MB)")


if __name__ == "__main__":
    main()
