"""Pretrain the tiny text-to-image model of the shapes world (issue 5's "pretrained model").

    .venv/bin/python examples/shapes/pretrain.py --output-dir examples/shapes/model      # the committed model
    .venv/bin/python examples/shapes/pretrain.py --output-dir /tmp/shapes_try --steps 150  # a quick try

Result: a ``StableDiffusion3Pipeline`` folder (diffusers format) that the text-to-image head
loads with its normal path, ``head: {name: t2i, family: sd3, path: DIR, resolution: 32,
max_sequence_length: 2}``:

- ``vae``: a pixel-space identity ``AutoencoderKL`` (one block of 12 channels, no
  downsampling, so ``vae_scale_factor`` = 1). Its weights are CONSTRUCTED, not trained:
  every residual branch is zeroed and the GroupNorm -> SiLU -> conv tail is made exact by
  carrying each colour channel as (K + x, -K - x, K - x, -K + x) with K = 1000, whose group
  mean is 0 and group std is K (up to 5e-4 of the [-1, 1] range), so decode(encode(x)) = x
  to about 0.1 of an 8-bit level. The "latents" are the 32 x 32 RGB pixels in [-1, 1],
  normalised by ``shift_factor`` / ``scaling_factor`` (mean and std of the training renders).
- ``transformer``: a small ``SD3Transformer2DModel`` (patch 2 -> 256 image tokens).
- ``text_encoder`` / ``text_encoder_2``: small ``CLIPTextModelWithProjection`` models
  trained jointly with the transformer, sharing one real CLIP BPE tokenizer built from
  open-clip-torch's shipped vocabulary (``flowrl.heads.t2i.tokenizers``; first 8000 merges,
  16 tokens per prompt). SD3 reads their penultimate hidden states (token embeddings) and
  their pooled projections.
- ``text_encoder_3``: a placeholder ``T5EncoderModel`` with no layers and a zero final norm,
  so its output is exactly zero -- the same as SD3 without T5 (``text_encoder_3=None``),
  which diffusers cannot load from a folder without an explicit ``text_encoder_3=None``
  argument (the head's loader passes none). ``tokenizer_3`` is the same CLIP BPE with no
  merge (byte-level, 515 tokens). The pipeline appends ``max_sequence_length`` such zero
  tokens; the model is trained with TWO (the fewest a CLIP tokenizer can truncate to), so load it
  with ``max_sequence_length=2`` (head
  config ``head.max_sequence_length: 2``; plain diffusers ``pipe(..., max_sequence_length=2)``).
- ``scheduler``: ``FlowMatchEulerDiscreteScheduler(shift=--shift)`` (default 1.0: no resolution shift at 32 px).

Training data: renders of the PRETRAIN prompts of ``split_prompts(split_seed)`` only
(``--scenes-per-prompt`` random ground-truth scenes each, seeded); prompts are drawn half
uniformly over prompts and half uniformly over categories; ``--cfg-dropout`` of the
captions are replaced by the empty prompt (the negative prompt of CFG). Loss: rectified
flow, x_t = (1 - t) x0 + t eps, target eps - x0, t uniform in [0, 1] (``--t-dist``), the
transformer called with timestep 1000 t exactly as ``flowrl.heads.t2i.sd3`` calls it.
AdamW, linear warm-up then cosine decay; everything is seeded by ``--seed``
(reproducible on the same machine and torch version with the same thread count).
``--ema D`` keeps an EMA of the trained weights (the curve and the saved pipeline use it);
``--shift S`` shifts both the scheduler and the training times.

Status (measured, see the README): no setting tried so far reaches held-out ShapesEval 0.25.
The best, patch 2, 4 layers, width 64, lr 2e-3, ``--ema 0.999 --shift 3``, scores 0.04
after 3000-4000 steps: colours and counts follow the prompt, but every object comes out as
a round blob, so only the colour category passes.

A held-out learning curve (eval split, balanced per category, fixed seeds, Euler with the
pipeline's own time grid) is written to ``OUTPUT_DIR/../<name>_log/curve.jsonl`` unless
``--log-dir`` says otherwise.
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

from rewards.shapes.prompts import CATEGORIES, sample_scene, split_prompts, take_per_category  # noqa: E402
from rewards.shapes.world import render  # noqa: E402

BIG = 1000.0        # K: carrier offset of the identity autoencoder
SILU_SHIFT = 20.0   # keeps SiLU in its linear range (error < 1e-7)
NUM_MERGES = 8000   # BPE merges kept (vocabulary 8514 tokens)
T5_TOKENS = 2       # max_sequence_length: zero "T5" tokens the transformer is trained with
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


# --------------------------------------------------------------------------- pipeline
def clip_text(hidden: int, layers: int, heads: int, seed: int, vocab: int):
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, max_position_embeddings=MAX_TOKENS, projection_dim=hidden,
                         bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    torch.manual_seed(seed)
    return CLIPTextModelWithProjection(cfg)


def build_pipeline(args, tok_dir: str, shift_factor: float, scaling_factor: float):
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    from flowrl.heads.t2i.tokenizers import build_clip_tokenizer

    tok = build_clip_tokenizer(tok_dir, NUM_MERGES, model_max_length=MAX_TOKENS)
    vocab = len(tok)
    te1 = clip_text(args.text_dim, args.text_layers, 2, args.seed + 1, vocab)
    te2 = clip_text(args.text_dim, args.text_layers, 2, args.seed + 2, vocab)
    torch.manual_seed(args.seed)
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=args.patch_size, in_channels=3, out_channels=3,
                                        num_layers=args.layers, attention_head_dim=args.head_dim,
                                        num_attention_heads=args.heads, joint_attention_dim=2 * args.text_dim,
                                        caption_projection_dim=args.heads * args.head_dim,
                                        pooled_projection_dim=2 * args.text_dim,
                                        pos_embed_max_size=32 // args.patch_size)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=args.shift),
        vae=identity_autoencoder(shift_factor, scaling_factor),
        text_encoder=te1, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok,
        text_encoder_3=zero_t5(2 * args.text_dim), tokenizer_3=build_clip_tokenizer(tok_dir + "_bytes", 1))


def zero_t5(width: int):
    """A T5 encoder with no blocks and a zero final norm: its output is exactly 0 (no T5)."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=515, d_model=width, d_kv=8, d_ff=8, num_layers=0, num_heads=1, dropout_rate=0.0,
                   decoder_start_token_id=0, pad_token_id=514, eos_token_id=514)
    t5 = T5EncoderModel(cfg)
    with torch.no_grad():
        t5.encoder.final_layer_norm.weight.zero_()
    return t5.eval()


def encode(pipe, prompts: List[str]):
    """(token embeddings [n, 16, 2 d], pooled [n, 2 d]) through the pipeline's own encode_prompt
    (differentiable: no no_grad inside), exactly what the head feeds the transformer."""
    embeds, _, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=prompts, prompt_3=prompts, device="cpu",
                                              do_classifier_free_guidance=False, max_sequence_length=T5_TOKENS)
    return embeds, pooled


def velocity(pipe, x, t, embeds, pooled):
    """The transformer in flowrl's convention (as ``SD3Head.denoise``): t [B] in [0, 1]."""
    timestep = t * pipe.scheduler.config.num_train_timesteps
    return pipe.transformer(hidden_states=x, timestep=timestep, encoder_hidden_states=embeds,
                            pooled_projections=pooled, return_dict=False)[0]


def to_latent(pipe, images: torch.Tensor) -> torch.Tensor:
    """images [B, 3, H, W] in [0, 1] -> normalised latents (what decode_latents inverts)."""
    cfg = pipe.vae.config
    return (pipe.vae.encode(images * 2 - 1).latent_dist.mean - cfg.shift_factor) * cfg.scaling_factor


def from_latent(pipe, x: torch.Tensor) -> torch.Tensor:
    """normalised latents -> images in [0, 1] (as ``SD3Head.decode_latents`` + ``T2IHead.decode``)."""
    cfg = pipe.vae.config
    return (pipe.vae.decode(x / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0] / 2 + 0.5).clamp(0, 1)


@torch.no_grad()
def sample(pipe, prompts: List[str], seeds: Sequence[int], steps: int, guidance: float = 1.0, batch: int = 64):
    """Euler ODE on the scheduler's own sigma grid -> images [n, 3, 32, 32] in [0, 1]."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from flowrl import rng

    sched = FlowMatchEulerDiscreteScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(steps, device="cpu")
    sigmas = sched.sigmas.float()
    out = []
    for s in range(0, len(prompts), batch):
        ps = prompts[s:s + batch]
        e, p = encode(pipe, ps)
        if guidance > 1:
            ne, npool = encode(pipe, [""])
            e = torch.cat([ne.expand(len(ps), -1, -1), e])
            p = torch.cat([npool.expand(len(ps), -1), p])
        x = torch.stack([torch.randn((3, 32, 32), generator=rng.generator(0, rng.STREAM_EVAL, sd, 0, 0))
                         for sd in seeds[s:s + batch]])
        for k in range(steps):
            t, tn = sigmas[k], sigmas[k + 1]
            tt = t.expand(len(ps))
            if guidance > 1:
                vu, vc = velocity(pipe, torch.cat([x, x]), torch.cat([tt, tt]), e, p).chunk(2)
                v = vu + guidance * (vc - vu)
            else:
                v = velocity(pipe, x, tt, e, p)
            x = x + (tn - t) * v
        out.append(from_latent(pipe, x))
    return torch.cat(out)


# --------------------------------------------------------------------------- data
def render_dataset(items: Sequence[Dict], per_prompt: int, seed: int) -> np.ndarray:
    """uint8 [len(items), per_prompt, 32, 32, 3] of ground-truth scenes (seeded per prompt)."""
    out = np.empty((len(items), per_prompt, 32, 32, 3), dtype=np.uint8)
    for i, it in enumerate(items):
        g = np.random.default_rng([seed, i])
        for j in range(per_prompt):
            out[i, j] = render(sample_scene(it, g))
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


def measure(pipe, items, seeds, steps: int, guidance: float = 1.0) -> Dict[str, float]:
    from rewards.shapes.verifier import evaluate

    was = pipe.transformer.training
    pipe.transformer.eval(); pipe.text_encoder.eval(); pipe.text_encoder_2.eval()
    imgs = sample(pipe, [it["prompt"] for it in items], seeds, steps, guidance)
    if was:
        pipe.transformer.train(); pipe.text_encoder.train(); pipe.text_encoder_2.train()
    return {k: round(v, 4) for k, v in evaluate(imgs, items).items()}


# --------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-dir", required=True, help="where the diffusers pipeline folder is written")
    ap.add_argument("--log-dir", default="", help="learning curve + log (default: OUTPUT_DIR + '_log')")
    ap.add_argument("--seed", type=int, default=0, help="seeds weights, data order, noise")
    ap.add_argument("--split-seed", type=int, default=0, help="seed of split_prompts (pretrain prompts)")
    ap.add_argument("--scenes-per-prompt", type=int, default=256, help="ground-truth renders per pretrain prompt")
    ap.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--cfg-dropout", type=float, default=0.1, help="share of captions replaced by the empty prompt")
    ap.add_argument("--t-dist", choices=["uniform", "logit_normal"], default="uniform")
    ap.add_argument("--patch-size", type=int, default=4, help="transformer patch size (4: 64 image tokens)")
    ap.add_argument("--layers", type=int, default=4, help="SD3 transformer blocks")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--text-dim", type=int, default=64, help="width of each CLIP text encoder")
    ap.add_argument("--text-layers", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=500, help="held-out curve every N steps (0 = only at the end)")
    ap.add_argument("--eval-per-category", type=int, default=16)
    ap.add_argument("--eval-steps", type=int, default=20, help="Euler steps of the curve's samples")
    ap.add_argument("--eval-guidance", type=float, nargs="+", default=[1.0], help="CFG scales of the curve")
    ap.add_argument("--snapshots", action="store_true", help="at each curve point also save the pipeline and a grid")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shift", type=float, default=1.0,
                    help="time shift S of the pipeline's scheduler (FlowMatchEulerDiscreteScheduler(shift=S), what "
                         "sampling uses) and of the training times: t -> S t / (1 + (S - 1) t) (1 = no shift)")
    ap.add_argument("--ema", type=float, default=0.0,
                    help="EMA decay of the trained weights (0 = off); when on, the curve, the snapshots and the "
                         "saved pipeline use the EMA weights (decay warmed up as min(ema, (1 + step) / (10 + step)))")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import diffusers
    import transformers

    diffusers.utils.logging.set_verbosity_error()  # the zero-T5 tokenizer's truncation notice, every call
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(args.seed)
    log_dir = args.log_dir or args.output_dir.rstrip("/") + "_log"
    os.makedirs(log_dir, exist_ok=True)
    t_start = time.time()

    def log(msg: str) -> None:
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        with open(os.path.join(log_dir, "log.txt"), "a") as fh:
            fh.write(line + "\n")

    split = split_prompts(args.split_seed)
    items = split["pretrain"]
    data = render_dataset(items, args.scenes_per_prompt, args.seed)
    pix = torch.from_numpy(data).float().div(255).mul(2).sub(1)
    shift, scale = float(pix.mean()), float(1.0 / pix.std())
    del pix
    log(f"rendered {data.shape[0]} x {data.shape[1]} scenes; latent shift {shift:.4f} scale {scale:.4f}")

    tok_dir = os.path.join(log_dir, "_tokenizer")
    pipe = build_pipeline(args, tok_dir, shift, scale)
    params = {n: sum(p.numel() for p in getattr(pipe, n).parameters())
              for n in ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae")}
    log(f"parameters: {params}")
    trainable = [p for n in ("transformer", "text_encoder", "text_encoder_2") for p in getattr(pipe, n).parameters()]
    for n in ("transformer", "text_encoder", "text_encoder_2"):
        getattr(pipe, n).train()
    pipe.vae.requires_grad_(False)
    pipe.text_encoder_3.requires_grad_(False)
    opt = torch.optim.AdamW(trainable, lr=args.lr, weight_decay=args.weight_decay, betas=(0.9, 0.99))
    ema = [p.detach().clone() for p in trainable] if args.ema > 0 else None

    def swap_ema() -> None:  # exchange the live and the EMA weights (twice = back to the live ones)
        if ema is not None:
            with torch.no_grad():
                for p, q in zip(trainable, ema):
                    tmp = p.detach().clone()
                    p.copy_(q)
                    q.copy_(tmp)

    # prompt sampling: half uniform over prompts, half uniform over categories
    cats = np.array([CATEGORIES.index(it["category"]) for it in items])
    counts = np.bincount(cats, minlength=len(CATEGORIES))
    present = counts > 0
    probs = 0.5 / len(items) + 0.5 / present.sum() / counts[cats]
    probs = probs / probs.sum()
    prompts = [it["prompt"] for it in items]
    g = np.random.default_rng([args.seed, 1])
    tg = torch.Generator().manual_seed(args.seed + 7)
    ev_items, ev_seeds = eval_set(args.split_seed, args.eval_per_category)
    curve_path = os.path.join(log_dir, "curve.jsonl")
    open(curve_path, "w").close()

    def record(step: int, loss: float) -> None:
        swap_ema()
        try:
            _record(step, loss)
        finally:
            swap_ema()

    def _record(step: int, loss: float) -> None:
        row = {"step": step, "loss": round(loss, 5), "wall_s": round(time.time() - t_start, 1)}
        for w in args.eval_guidance:
            m = measure(pipe, ev_items, ev_seeds, args.eval_steps, w)
            row[f"heldout_cfg{w:g}"] = m
            log(f"step {step} held-out (guidance {w:g}) {m}")
        with open(curve_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        if args.snapshots:  # the pipeline and a sample grid as of this step (to inspect mid-run)
            snap = os.path.join(log_dir, "snapshot")
            pipe.save_pretrained(snap)
            from torchvision.utils import save_image

            imgs = sample(pipe, [it["prompt"] for it in ev_items], ev_seeds, args.eval_steps)
            save_image(imgs, os.path.join(log_dir, f"samples_{step:06d}.png"), nrow=args.eval_per_category)

    run_loss, last_loss, t_train = 0.0, float("nan"), time.time()
    for step in range(1, args.steps + 1):
        pi = g.choice(len(items), size=args.batch_size, p=probs)
        si = g.integers(0, data.shape[1], size=args.batch_size)
        imgs = torch.from_numpy(data[pi, si]).permute(0, 3, 1, 2).float().div(255).contiguous()
        caps = [prompts[i] if u >= args.cfg_dropout else "" for i, u in zip(pi, g.random(args.batch_size))]
        with torch.no_grad():
            x0 = to_latent(pipe, imgs)
        uniq = list(dict.fromkeys(caps))
        e, p = encode(pipe, uniq)
        idx = torch.tensor([uniq.index(c) for c in caps])
        e, p = e[idx], p[idx]
        if args.t_dist == "uniform":
            t = torch.rand(args.batch_size, generator=tg)
        else:
            t = torch.sigmoid(torch.randn(args.batch_size, generator=tg))
        if args.shift != 1.0:  # the scheduler's own shift, so training covers the times sampling visits
            t = args.shift * t / (1 + (args.shift - 1) * t)
        eps = torch.randn(x0.shape, generator=tg)
        tb = t.view(-1, 1, 1, 1)
        xt = (1 - tb) * x0 + tb * eps
        pred = velocity(pipe, xt, t, e, p)
        loss = torch.nn.functional.mse_loss(pred, eps - x0)
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
        if step % 50 == 0:
            log(f"step {step} loss {run_loss / 50:.4f} lr {args.lr * f:.2e} "
                f"({(time.time() - t_train) / step:.2f} s/step)")
            last_loss, run_loss = run_loss / 50, 0.0
        if args.eval_every and step % args.eval_every == 0 and step != args.steps:
            record(step, last_loss)
    train_s = time.time() - t_train
    log(f"training took {train_s:.0f} s")
    record(args.steps, last_loss)
    swap_ema()  # the EMA weights are what gets saved

    for n in ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3", "vae"):
        getattr(pipe, n).eval()
    if os.path.isdir(args.output_dir):
        shutil.rmtree(args.output_dir)
    pipe.save_pretrained(args.output_dir)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.output_dir) for f in fs)
    info = {"args": vars(args), "parameters": params, "train_s": round(train_s, 1),
            "total_s": round(time.time() - t_start, 1), "size_mb": round(size / 2 ** 20, 2),
            "latent_shift": shift, "latent_scale": scale, "torch": torch.__version__}
    with open(os.path.join(log_dir, "pretrain.json"), "w") as fh:
        json.dump(info, fh, indent=2)
    log(f"saved {args.output_dir} ({size / 2 ** 20:.2f} MB)")


if __name__ == "__main__":
    main()
