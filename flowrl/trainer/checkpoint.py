"""Atomic, resume-complete checkpoints.

A checkpoint is a folder ``checkpoints/step-<N>/`` holding
  trainable.safetensors  the trainable tensors (LoRA / full weights of the trained part)
  ema.safetensors        EMA of those tensors (when EMA is on)
  optimizer.pt           optimizer state (tensors and numbers only; loaded weights_only)
  rng.pt                 torch's global RNG state (loaded weights_only)
  trainer_state.json     iteration, optimizer step, algorithm state; written last
It is written into a hidden temporary folder and renamed into place, so a killed write
never leaves a ``step-<N>`` folder that loads half.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any, Dict, Optional

import torch
from safetensors.torch import load_file, save_file

STATE = "trainer_state.json"
_STEP = re.compile(r"^step-(\d+)$")


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def save_tensors(tensors: Dict[str, torch.Tensor], path: str) -> None:
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, path)


def write_checkpoint(root: str, step: int, *, trainable: Dict[str, torch.Tensor], optimizer: Dict[str, Any],
                     state: Dict[str, Any], ema: Optional[Dict[str, torch.Tensor]] = None,
                     keep: int = 2) -> str:
    """Write ``root/step-<step>`` atomically and prune to the newest ``keep``. Returns its path."""
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"step-{step}")
    tmp = os.path.join(root, f".tmp-step-{step}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    save_tensors(trainable, os.path.join(tmp, "trainable.safetensors"))
    if ema is not None:
        save_tensors(ema, os.path.join(tmp, "ema.safetensors"))
    torch.save(optimizer, os.path.join(tmp, "optimizer.pt"))
    torch.save({"torch": torch.get_rng_state()}, os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, STATE), "w") as fh:
        json.dump(state, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    replace_dir(tmp, final)
    prune(root, keep)
    return final


def replace_dir(src: str, dst: str) -> None:
    """Move the finished folder ``src`` to ``dst``, replacing any folder there.

    The old ``dst`` is renamed aside and removed only once ``src`` is in place, so a crash at
    any point leaves a complete folder at ``dst`` or, briefly, at ``dst.old-<pid>``; never none.
    """
    dst = dst.rstrip("/")
    old = None
    if os.path.exists(dst):
        old = f"{dst}.old-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(dst, old)
    os.rename(src, dst)
    _fsync_dir(os.path.dirname(os.path.abspath(dst)))
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(root: str):
    """[(step, path)] of complete checkpoints, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _STEP.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, STATE)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def latest_checkpoint(root: str) -> Optional[str]:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def prune(root: str, keep: int) -> None:
    for _, path in list_checkpoints(root)[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def read_checkpoint(path: str, map_location: str | torch.device = "cpu") -> Dict[str, Any]:
    """Load every part of a checkpoint (safetensors + weights_only torch files)."""
    if not os.path.isfile(os.path.join(path, "trainable.safetensors")):
        raise FileNotFoundError(f"checkpoint: {path} holds no trainable.safetensors; pass output_dir/checkpoints/step-N or output_dir/final")
    out: Dict[str, Any] = {"trainable": load_file(os.path.join(path, "trainable.safetensors"))}
    ema = os.path.join(path, "ema.safetensors")
    out["ema"] = load_file(ema) if os.path.isfile(ema) else None
    for name in ("optimizer", "rng"):
        f = os.path.join(path, f"{name}.pt")
        out[name] = torch.load(f, map_location=map_location, weights_only=True) if os.path.isfile(f) else None
    state = os.path.join(path, STATE)
    out["state"] = json.load(open(state)) if os.path.isfile(state) else None
    return out


def atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
