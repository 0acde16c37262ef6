"""Shared weight loading for reward models: a local path or a hub id, offline-safe.

Every loader takes either a local path or a Hugging Face hub reference:

* a folder (transformers models and processors): a local directory or a hub repo id
  such as ``openai/clip-vit-large-patch14``;
* a single file (state dicts, open_clip checkpoints): a local file or ``ORG/REPO/FILE``
  (for example ``xswu/HPSv2/HPS_v2_compressed.pt``), fetched with ``hf_hub_download``.

With ``HF_HUB_OFFLINE=1`` hub references are resolved from the local cache only
(``local_files_only=True``), so nothing touches the network. A missing weight raises a
``FileNotFoundError`` whose message is ONE line: the config key, the missing file, and
where users get it. State dicts are loaded with ``torch.load(weights_only=True)`` (or
safetensors); nothing is unpickled and no remote code is trusted.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict

import torch

WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt", ".json", ".npz")


def offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) asks for no network."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def looks_local(ref: str) -> bool:
    """Whether ``ref`` names a filesystem path rather than a hub reference."""
    ref = str(ref)
    return (os.path.exists(ref) or os.path.isabs(ref) or ref.startswith((".", "~"))
            or ref.count("/") == 0 or (ref.lower().endswith(WEIGHT_SUFFIXES) and ref.count("/") < 2))


def _one_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    return lines[0] if lines else ""


def missing(key: str, what: str, where: str, source: str) -> FileNotFoundError:
    """The one-line missing-weight error: ``KEY: WHAT not found at WHERE; SOURCE``."""
    return FileNotFoundError(_one_line(f"{key}: {what} not found at {where}; {source}"))


def resolve_file(ref: str, key: str, what: str, source: str) -> str:
    """Local path of a single weight file given as a local path or ``ORG/REPO/FILE``.

    key: config key for the message (``hpsv2.checkpoint``); what: the file users look for;
    source: where they get it (``download it from ...``).
    """
    ref = os.path.expanduser(str(ref))
    if not ref:
        raise missing(key, what, "''", source)
    if looks_local(ref):
        if not os.path.isfile(ref):
            raise missing(key, what, ref, source)
        return ref
    org, repo, filename = ref.split("/", 2)
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(f"{org}/{repo}", filename, local_files_only=offline())
    except Exception as e:  # offline cache miss, network error, missing repo or file
        how = ("it is not in the local Hugging Face cache and HF_HUB_OFFLINE=1" if offline()
               else f"download failed ({_one_line(e)})")
        raise FileNotFoundError(_one_line(
            f"{key}: {what} not found at hub file {ref}: {how}; {source}")) from None


def from_pretrained(loader: Callable[..., Any], ref: str, key: str, what: str, source: str, **kwargs: Any) -> Any:
    """``loader(ref, local_files_only=offline(), **kwargs)`` with one-line errors.

    loader: a ``from_pretrained`` (CLIPModel, AutoProcessor, ...); ref: a local folder or
    hub id. Never passes ``trust_remote_code``.
    """
    ref = os.path.expanduser(str(ref))
    if not ref:
        raise missing(key, what, "''", source)
    local = os.path.isdir(ref) or looks_local(ref)
    if local and not os.path.isdir(ref):
        raise missing(key, what, ref, source)
    try:
        return loader(ref, local_files_only=offline() or local, **kwargs)
    except (OSError, ValueError, EnvironmentError) as e:
        if local:
            raise FileNotFoundError(_one_line(f"{key}: cannot load {what} from {ref} ({_one_line(e)}); {source}")) from None
        how = ("it is not in the local Hugging Face cache and HF_HUB_OFFLINE=1" if offline()
               else f"loading failed ({_one_line(e)})")
        raise FileNotFoundError(_one_line(f"{key}: {what} '{ref}' not found: {how}; {source}")) from None


def load_state_dict(path: str, key: str) -> Dict[str, torch.Tensor]:
    """A tensor state dict from ``path`` (safetensors, or ``torch.load(weights_only=True)``).

    Unwraps ``{"state_dict": ...}`` checkpoints and strips a DDP ``module.`` prefix.
    """
    from flowrl.registry import ConfigError

    try:
        if str(path).endswith(".safetensors"):
            from safetensors.torch import load_file

            obj: Any = load_file(path, device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ConfigError(_one_line(f"{key}: {path} is not a readable weights file ({_one_line(e)})")) from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ConfigError(f"{key}: {path} holds no state dict of tensors")
    if obj and all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return obj


def load_into(module: torch.nn.Module, state: Dict[str, torch.Tensor], key: str, path: str) -> None:
    """``module.load_state_dict(state, strict=True)`` with a one-line mismatch error."""
    from flowrl.registry import ConfigError

    try:
        result = module.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches raise even when not strict
        detail = next((ln.strip() for ln in str(e).splitlines()[1:] if ln.strip()), _one_line(e))
        raise ConfigError(f"{key}: {path} does not match the {type(module).__name__} architecture ({detail})") from None
    bad_missing, bad_extra = list(result.missing_keys), list(result.unexpected_keys)
    if bad_missing or bad_extra:
        example = (bad_missing + bad_extra)[0]
        raise ConfigError(
            f"{key}: {path} does not match the {type(module).__name__} architecture "
            f"({len(bad_missing)} missing, {len(bad_extra)} unexpected keys, e.g. '{example}')")
