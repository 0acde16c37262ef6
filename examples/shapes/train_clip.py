"""Train ShapesCLIP: an open_clip CLIP trained contrastively on shapes-world renders and prompts.

    .venv/bin/python examples/shapes/train_clip.py --output-dir examples/shapes/clip   # the committed model
    .venv/bin/python examples/shapes/train_clip.py --output-dir /tmp/clip_try --steps 200

Writes ``OUTPUT_DIR/ShapesCLIP.json`` (the architecture, open_clip's JSON layout; its file
stem is the model name) and ``OUTPUT_DIR/open_clip_model.safetensors`` (weights stored in
float16 to halve the file; they load into the float32 model), plus ``retrieval.json`` and
``reference_scores.json`` (see ``reference_scores``). The CLIP reward loads it with its normal open_clip path::

    rewards: [{name: clip, backend: open_clip, model_name: ShapesCLIP,
               model_config: examples/shapes/clip/ShapesCLIP.json,
               pretrained: examples/shapes/clip/open_clip_model.safetensors}]

Data: ground-truth renders of the ``pretrain`` and ``train`` prompts of
``split_prompts(--split-seed)`` (never the held-out ``eval`` prompts). Images are
preprocessed exactly as the reward preprocesses them (``rewards.clip.spec_from_open_clip``),
text goes through open_clip's own tokenizer (the real CLIP BPE, ``context_length`` 16).

Loss: symmetric InfoNCE with MULTIPLE positives. A render of "a red circle" also satisfies
"a circle" and "one circle"; treating those as negatives would teach the model to
contradict the verifier, so every (image, prompt) pair whose scene satisfies the prompt
(checked symbolically with ShapesEval's own ``satisfies``) counts as a positive:
``-log sum_{j positive} softmax_j`` per image, and the same per prompt over images.

Retrieval on held-out prompts (reported in ``retrieval.json``): ground-truth renders of the
eval prompts, each matched to the eval prompt with the highest cosine; correct when the
scene satisfies the retrieved prompt (image -> text top-1), overall and per category.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Dict, List, Sequence

import numpy as np
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from flowrl.trainer.checkpoint import replace_dir  # noqa: E402
from rewards.shapes.prompts import CATEGORIES, sample_scene, split_prompts  # noqa: E402
from rewards.shapes.verifier import Detection, satisfies  # noqa: E402
from rewards.shapes.world import Scene, render  # noqa: E402

NAME = "ShapesCLIP"


def architecture(args) -> Dict[str, Any]:
    """open_clip model config: a ViT over 32 x 32 images (4 x 4 patches), a small text tower."""
    return {
        "embed_dim": args.embed_dim,
        "vision_cfg": {"image_size": 32, "patch_size": 4, "width": args.vision_width, "layers": args.vision_layers,
                       "head_width": 32},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": args.text_width, "heads": args.text_width // 32,
                     "layers": args.text_layers},
    }


def scene_detections(scene: Scene) -> List[Detection]:
    """The scene's objects as perfect detections (what ShapesEval sees on a clean render)."""
    return [Detection(o.shape, o.colour, o.cx, o.cy, o.size ** 2, 1.0) for o in scene.objects]


def positives(scenes: Sequence[Scene], items: Sequence[Dict[str, Any]]) -> torch.Tensor:
    """[len(scenes), len(items)] bool: scene i satisfies prompt j (strict ShapesEval rules)."""
    dets = [scene_detections(s) for s in scenes]
    return torch.tensor([[satisfies(d, it) for it in items] for d in dets], dtype=torch.bool)


def multi_positive_nce(logits: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE with several positives. logits, pos: [B_img, B_txt] -> scalar.

    Every row and column holds at least one positive (image i's own prompt)."""
    neg_inf = torch.finfo(logits.dtype).min
    img = torch.logsumexp(logits.masked_fill(~pos, neg_inf), 1) - torch.logsumexp(logits, 1)
    txt = torch.logsumexp(logits.masked_fill(~pos, neg_inf), 0) - torch.logsumexp(logits, 0)
    return -(img.mean() + txt.mean()) / 2


def build_data(items: Sequence[Dict[str, Any]], per_prompt: int, seed: int):
    """(uint8 images [N, 32, 32, 3], scenes, item index [N]) of ground-truth renders."""
    scenes, index = [], []
    for i, it in enumerate(items):
        g = np.random.default_rng([seed, i])
        for _ in range(per_prompt):
            scenes.append(sample_scene(it, g))
            index.append(i)
    images = np.stack([render(s) for s in scenes])
    return images, scenes, np.asarray(index)


@torch.no_grad()
def retrieval(model, tokenizer, spec, items: Sequence[Dict[str, Any]], per_prompt: int, seed: int) -> Dict[str, float]:
    """Image -> text top-1 among ``items`` on fresh ground-truth renders (see module doc)."""
    from rewards.images import preprocess

    images, scenes, index = build_data(items, per_prompt, seed)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255)
    img = F.normalize(torch.cat([model.encode_image(preprocess(c, spec)) for c in x.split(256)]), dim=-1)
    txt = F.normalize(model.encode_text(tokenizer([it["prompt"] for it in items])), dim=-1)
    best = (img @ txt.T).argmax(1)
    ok = np.asarray([satisfies(scene_detections(s), items[int(b)]) for s, b in zip(scenes, best)])
    out = {"overall": float(ok.mean())}
    cats = np.asarray([items[i]["category"] for i in index])
    for c in CATEGORIES:
        if (cats == c).any():
            out[c] = float(ok[cats == c].mean())
    out["category_mean"] = float(np.mean([out[c] for c in CATEGORIES if c in out]))
    return {k: round(v, 4) for k, v in out.items()}


def reward_config(clip_dir: str):
    """The CLIP reward config that loads ShapesCLIP from ``clip_dir`` (open_clip backend)."""
    from rewards.clip import ClipScoreConfig

    return ClipScoreConfig(backend="open_clip", model_name=NAME, model_config=os.path.join(clip_dir, f"{NAME}.json"),
                           pretrained=os.path.join(clip_dir, "open_clip_model.safetensors"))


@torch.no_grad()
def reference_scores(clip_dir: str) -> Dict[str, List[float]]:
    """CLIP reward scores, through the reward's normal loader, of ground-truth renders of the
    first held-out item of each category (scene seed [0, j]): against their own prompts
    ("matched") and against the next category's prompt ("mismatched"). The stored sample
    a committed ShapesCLIP must reproduce (``reference_scores.json``)."""
    from rewards.base import build_reward
    from rewards.shapes.prompts import balanced
    from rewards.shapes.world import render_batch

    items = balanced(split_prompts(0)["eval"], 1)
    images = render_batch([sample_scene(it, np.random.default_rng([0, j])) for j, it in enumerate(items)])
    reward = build_reward(reward_config(clip_dir))
    rolled = items[1:] + items[:1]
    return {"prompts": [it["prompt"] for it in items],
            "matched": [round(float(v), 4) for v in reward(images, items).score],
            "mismatched": [round(float(v), 4) for v in reward(images, rolled).score]}


def write_reference(clip_dir: str) -> str:
    path = os.path.join(clip_dir, "reference_scores.json")
    with open(path, "w") as fh:
        json.dump(reference_scores(clip_dir), fh, indent=2)
    return path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-dir", required=True, help="where ShapesCLIP.json + open_clip_model.safetensors go")
    ap.add_argument("--seed", type=int, default=0, help="seeds weights, renders, batches")
    ap.add_argument("--split-seed", type=int, default=0, help="seed of split_prompts")
    ap.add_argument("--scenes-per-prompt", type=int, default=96, help="ground-truth renders per training prompt")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--embed-dim", type=int, default=64)
    ap.add_argument("--vision-width", type=int, default=128)
    ap.add_argument("--vision-layers", type=int, default=4)
    ap.add_argument("--text-width", type=int, default=64)
    ap.add_argument("--text-layers", type=int, default=3)
    ap.add_argument("--eval-per-prompt", type=int, default=4, help="held-out renders per eval prompt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--write-reference", action="store_true",
                    help="(re)write OUTPUT_DIR/reference_scores.json of an existing ShapesCLIP with 1 thread, then exit")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.write_reference:
        torch.set_num_threads(1)
        print(f"wrote {write_reference(args.output_dir)}")
        return
    torch.set_num_threads(args.threads)
    import open_clip
    from safetensors.torch import save_file

    from rewards.clip import spec_from_open_clip
    from rewards.images import preprocess

    t0 = time.time()
    out_dir = args.output_dir
    tmp = out_dir.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    cfg_path = os.path.join(tmp, f"{NAME}.json")
    with open(cfg_path, "w") as fh:
        json.dump(architecture(args), fh, indent=2)
    open_clip.add_model_config(cfg_path)
    torch.manual_seed(args.seed)
    model = open_clip.create_model(NAME, pretrained=None)
    tokenizer = open_clip.get_tokenizer(NAME)
    spec = spec_from_open_clip(open_clip.get_model_preprocess_cfg(model), "clip")

    split = split_prompts(args.split_seed)
    items = split["pretrain"] + split["train"]
    images, scenes, index = build_data(items, args.scenes_per_prompt, args.seed)
    tokens = tokenizer([it["prompt"] for it in items])
    print(f"[{time.time() - t0:6.1f}s] {len(images)} renders of {len(items)} prompts; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embedding" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embedding" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98))
    g = np.random.default_rng([args.seed, 1])
    model.train()
    run = 0.0
    for step in range(1, args.steps + 1):
        sel = g.choice(len(images), size=args.batch_size, replace=False)
        prompt_ids = list(dict.fromkeys(int(i) for i in index[sel]))
        pos = positives([scenes[i] for i in sel], [items[j] for j in prompt_ids])
        x = torch.from_numpy(images[sel]).permute(0, 3, 1, 2).float().div(255)
        img = F.normalize(model.encode_image(preprocess(x, spec)), dim=-1)
        txt = F.normalize(model.encode_text(tokens[prompt_ids]), dim=-1)
        loss = multi_positive_nce(model.logit_scale.exp() * img @ txt.T, pos)
        f = step / args.warmup if step <= args.warmup else \
            0.5 * (1 + math.cos(math.pi * (step - args.warmup) / max(1, args.steps - args.warmup)))
        for gr in opt.param_groups:
            gr["lr"] = args.lr * f
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        run += loss.item()
        if step % 100 == 0:
            print(f"[{time.time() - t0:6.1f}s] step {step} loss {run / 100:.4f}", flush=True)
            run = 0.0
    model.eval()
    train_s = time.time() - t0

    result = {
        "heldout": retrieval(model, tokenizer, spec, split["eval"], args.eval_per_prompt, args.seed + 1000),
        "train_prompts": retrieval(model, tokenizer, spec, split["train"], args.eval_per_prompt, args.seed + 2000),
        "train_s": round(train_s, 1), "args": vars(args), "torch": torch.__version__,
    }
    save_file({k: v.detach().half().contiguous() for k, v in model.state_dict().items()},
              os.path.join(tmp, "open_clip_model.safetensors"))
    with open(os.path.join(tmp, "retrieval.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    replace_dir(tmp, out_dir)
    print(f"[{time.time() - t0:6.1f}s] held-out image->text top-1 {result['heldout']}")
    print(f"[{time.time() - t0:6.1f}s] train-prompt image->text top-1 {result['train_prompts']}")
    torch.set_num_threads(1)
    print(f"saved {out_dir} ({write_reference(out_dir)})")


if __name__ == "__main__":
    main()
