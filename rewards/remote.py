"""Remote rewards: serve configured rewards over HTTP and score through them from a run.

For reward models that live on other GPUs or machines (or need their own environment).
Standard library only (``http.server``, ``urllib``), no extra dependencies.

Wire format (JSON, UTF-8):

    POST /score   Authorization: Bearer <token>
      {"rewards": [name, ...],                 optional; default: every served reward
       "images": {"format": "png", "data": [base64 PNG, ...]}
              or {"format": "raw", "dtype": "uint8" | "float32", "shape": [B, 3, H, W],
                  "data": base64 of the C-order little-endian array (uint8 0..255 or float32 0..1)},
       "batch": [item, ...]}                   B prompt strings or dicts with "prompt"
    -> 200 {"scores": {name: [B] or [B, A]}, "valid": {name: [...] bools}, "info": {name: {...}}}
    GET /health -> 200 {"status": "ok"} (+ "rewards": [names] when the token is given)

Errors: 400 malformed request, 401 missing or wrong token, 404 unknown path, 411 no
Content-Length, 413 body over ``max_bytes``, 500 server bug; the body is {"error": "..."}.
A reward that fails inside the server answers 200 with its samples ``valid: false``.
"""
from __future__ import annotations

import base64
import hmac
import http.client
import io
import ipaddress
import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from flowrl._fields import hfield
from flowrl.registry import ConfigError
from flowrl.types import RewardOutput
from rewards.base import REWARDS, Reward, RewardConfig
from rewards.images import check_images, finite_rows, from_pil, to_pil

Tensor = torch.Tensor

DEFAULT_PORT = 8700
DEFAULT_TOKEN_ENV = "FLOWRL_REWARD_TOKEN"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
IMAGE_FORMATS = ("png", "raw")
RAW_DTYPES = {"uint8": np.uint8, "float32": np.float32}


class BadRequest(ValueError):
    """A malformed /score request (answered with 400 and this message)."""


# --------------------------------------------------------------------------- wire format
def encode_images(images: Tensor, fmt: str = "png") -> Dict[str, Any]:
    """[B, 3, H, W] float in [0, 1] -> the JSON "images" object (pixels rounded to uint8)."""
    if fmt == "png":
        data = []
        for im in to_pil(images):
            buf = io.BytesIO()
            im.save(buf, format="PNG", compress_level=1)
            data.append(base64.b64encode(buf.getvalue()).decode("ascii"))
        return {"format": "png", "data": data}
    if fmt == "raw":
        arr = (check_images(images).cpu().numpy() * 255).round().astype(np.uint8)
        return {"format": "raw", "dtype": "uint8", "shape": list(arr.shape),
                "data": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii")}
    raise ValueError(f"image format '{fmt}' unknown; choose one of {', '.join(IMAGE_FORMATS)}")


def _b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise BadRequest(f"{what}: expected a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError as e:
        raise BadRequest(f"{what}: invalid base64 ({e})") from None


def decode_images(spec: Any) -> Tensor:
    """The JSON "images" object -> [B, 3, H, W] float32 in [0, 1]; BadRequest if malformed."""
    if not isinstance(spec, Mapping):
        raise BadRequest("images: expected an object with 'format' and 'data'")
    fmt = spec.get("format")
    if fmt == "png":
        data = spec.get("data")
        if not isinstance(data, list) or not data:
            raise BadRequest("images.data: expected a non-empty list of base64 PNG strings")
        try:
            pil = [Image.open(io.BytesIO(_b64(d, f"images.data[{i}]"))) for i, d in enumerate(data)]
            for im in pil:
                im.load()
        except BadRequest:
            raise
        except Exception as e:  # PIL raises several types for broken files
            raise BadRequest(f"images.data: not a decodable PNG ({type(e).__name__})") from None
        if len({im.size for im in pil}) != 1:
            raise BadRequest("images.data: all images of a batch must have the same size")
        return from_pil(pil)
    if fmt == "raw":
        dtype, shape = spec.get("dtype"), spec.get("shape")
        if dtype not in RAW_DTYPES:
            raise BadRequest(f"images.dtype: expected one of {', '.join(RAW_DTYPES)}, got {dtype!r}")
        if (not isinstance(shape, list) or len(shape) != 4 or shape[1] != 3
                or not all(isinstance(s, int) and s > 0 for s in shape)):
            raise BadRequest(f"images.shape: expected [B, 3, H, W] positive integers, got {shape!r}")
        raw = _b64(spec.get("data"), "images.data")
        np_dtype = RAW_DTYPES[dtype]
        if len(raw) != int(np.prod(shape)) * np.dtype(np_dtype).itemsize:
            raise BadRequest(f"images.data: {len(raw)} bytes do not match shape {shape} of {dtype}")
        x = torch.frombuffer(bytearray(raw), dtype=torch.uint8 if dtype == "uint8" else torch.float32).view(shape)
        return x.float().div_(255.0) if dtype == "uint8" else x
    raise BadRequest(f"images.format: expected one of {', '.join(IMAGE_FORMATS)}, got {fmt!r}")


def to_jsonable(value: Any) -> Any:
    """Tensors/arrays -> lists, numpy scalars -> numbers, NaN/inf -> None, unknown -> str."""
    if isinstance(value, (Tensor, np.ndarray)):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return to_jsonable(value.item())
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return str(value)


def build_request(images: Tensor, batch: Sequence[Any], rewards: Optional[List[str]], fmt: str) -> bytes:
    """The body of POST /score for images [B, 3, H, W] and B batch items."""
    body = {"images": encode_images(images, fmt), "batch": to_jsonable(list(batch))}
    if rewards is not None:
        body["rewards"] = list(rewards)
    return json.dumps(body, allow_nan=False).encode("utf-8")


def parse_scores(response: Any, name: str, n: int) -> RewardOutput:
    """One reward's part of a /score response -> RewardOutput (score [n] or [n, A]); ValueError if malformed."""
    try:
        score = torch.tensor(response["scores"][name], dtype=torch.float32)
        valid = torch.tensor(response["valid"][name], dtype=torch.bool)
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"malformed response: no usable scores for '{name}' ({type(e).__name__}: {e})") from None
    if score.ndim == 0 or score.shape[0] != n or valid.shape != score.shape:
        raise ValueError(f"malformed response: '{name}' has score shape {tuple(score.shape)}, "
                         f"valid shape {tuple(valid.shape)}; expected first dimension {n}")
    info = response.get("info", {}).get(name, {}) if isinstance(response.get("info"), Mapping) else {}
    return RewardOutput(score, valid, dict(info) if isinstance(info, Mapping) else {})


# --------------------------------------------------------------------------- server
def score_payload(rewards: Mapping[str, Reward], locks: Mapping[str, threading.Lock], payload: Any) -> Dict[str, Any]:
    """Run the requested rewards on a parsed /score body; BadRequest if it is malformed."""
    if not isinstance(payload, Mapping):
        raise BadRequest("body: expected a JSON object with 'images' and 'batch'")
    names = payload.get("rewards", list(rewards))
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise BadRequest("rewards: expected a non-empty list of reward names")
    unknown = [n for n in names if n not in rewards]
    if unknown:
        raise BadRequest(f"rewards: {unknown} not served here; this server serves {sorted(rewards)}")
    batch = payload.get("batch")
    if not isinstance(batch, list):
        raise BadRequest("batch: expected a list of items (prompt strings or objects with 'prompt')")
    images = decode_images(payload.get("images"))
    if images.shape[0] != len(batch):
        raise BadRequest(f"batch: {len(batch)} items for {images.shape[0]} images")
    out: Dict[str, Dict[str, Any]] = {"scores": {}, "valid": {}, "info": {}}
    for name in names:
        with locks[name]:  # one call at a time per reward model; different rewards may overlap
            result = rewards[name](images, batch)
        out["scores"][name] = to_jsonable(result.score)
        out["valid"][name] = to_jsonable(result.valid)
        out["info"][name] = to_jsonable(result.info)
    return out


class RewardServer(ThreadingHTTPServer):
    """A threading HTTP server holding the rewards, the token and the request size bound."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: Tuple[str, int], rewards: Mapping[str, Reward], token: str,
                 max_bytes: int = DEFAULT_MAX_BYTES, quiet: bool = True):
        if not token:
            raise ValueError("a non-empty shared-secret token is required")
        self.rewards = dict(rewards)
        self.locks = {name: threading.Lock() for name in self.rewards}
        self.token = token.encode("utf-8")
        self.max_bytes = int(max_bytes)
        self.quiet = quiet
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def authorized(self, header: Optional[str]) -> bool:
        """Constant-time check of an ``Authorization: Bearer <token>`` header."""
        if not header or not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer "):].strip().encode("utf-8"), self.token)


class _Handler(BaseHTTPRequestHandler):
    server: RewardServer
    server_version = "flowrl-rewards/1"
    timeout = 120  # seconds a client may stall while sending (socket timeout)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        if not self.server.quiet:
            super().log_message(format, *args)

    def _reply(self, code: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body, allow_nan=False).encode("utf-8")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if code >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        if code == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(data)

    def _drain(self, length: Optional[str], limit: int) -> None:
        """Read and drop an unread body of at most ``limit`` bytes, so that the client gets
        the error answer instead of a connection reset; a larger body is not read."""
        n = int(length) if length and length.isdigit() else 0
        if n > limit:
            return
        while n > 0:
            chunk = self.rfile.read(min(n, 1 << 16))
            if not chunk:
                return
            n -= len(chunk)

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        if self.path.rstrip("/") != "/health":
            return self._reply(404, {"error": f"no such path {self.path}; use GET /health or POST /score"})
        body: Dict[str, Any] = {"status": "ok"}
        if self.server.authorized(self.headers.get("Authorization")):
            body["rewards"] = sorted(self.server.rewards)
        self._reply(200, body)

    def do_POST(self) -> None:  # noqa: N802 (stdlib name)
        if self.path.rstrip("/") != "/score":
            return self._reply(404, {"error": f"no such path {self.path}; use POST /score"})
        length = self.headers.get("Content-Length")
        if not self.server.authorized(self.headers.get("Authorization")):
            self._drain(length, min(self.server.max_bytes, 1 << 20))
            return self._reply(401, {"error": "missing or wrong token (send 'Authorization: Bearer <token>')"})
        if length is None or not length.isdigit():
            return self._reply(411, {"error": "send a Content-Length header"})
        if int(length) > self.server.max_bytes:
            self._drain(length, 4 * self.server.max_bytes)
            return self._reply(413, {"error": f"request of {length} bytes is over the server's limit of "
                                              f"{self.server.max_bytes}; send smaller batches or raise --max-bytes"})
        raw = self.rfile.read(int(length))
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return self._reply(400, {"error": f"body is not valid JSON ({e})"})
        try:
            result = score_payload(self.server.rewards, self.server.locks, payload)
        except BadRequest as e:
            return self._reply(400, {"error": str(e)})
        except Exception as e:  # a server bug must not kill the server; the client retries 5xx
            return self._reply(500, {"error": f"{type(e).__name__}: {e}"})
        self._reply(200, result)


def is_loopback(host: str) -> bool:
    """True for localhost / 127.0.0.0/8 / ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_in_thread(rewards: Mapping[str, Reward], token: str, host: str = "127.0.0.1", port: int = 0,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> RewardServer:
    """Start a server on a daemon thread (tests, notebooks); stop it with ``shutdown(); server_close()``."""
    server = RewardServer((host, port), rewards, token, max_bytes)
    threading.Thread(target=server.serve_forever, name="reward-server", daemon=True).start()
    return server


# --------------------------------------------------------------------------- client
@dataclass
class RemoteRewardConfig(RewardConfig):
    """Score through a `rewards serve` server; a failed request marks the batch invalid."""

    name: str = hfield("remote", "reward name")
    url: str = hfield(f"http://127.0.0.1:{DEFAULT_PORT}", "base URL of the `rewards serve` server")
    reward: str = hfield("", "name of the reward on the server (one of those it serves)")
    token_env: str = hfield(DEFAULT_TOKEN_ENV, "environment variable holding the server's shared-secret token")
    request_timeout_s: float = hfield(120.0, "seconds one HTTP attempt may wait (connecting, and each read); "
                                             "RewardConfig.timeout_s bounds the whole call")
    retries: int = hfield(3, "extra attempts after a connection error, a timeout or a 5xx answer")
    backoff_s: float = hfield(0.5, "wait before extra attempt k (k = 1, 2, ...) is backoff_s * 2**(k-1) seconds")
    image_format: str = hfield("raw", "how images travel (both lossless at uint8): raw (an array; least CPU) "
                                      "or png (compressed; fewer bytes on slow links, ~3x the CPU time)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"{self.name}.url: '{self.url}' must start with http:// or https://")
        if self.image_format not in IMAGE_FORMATS:
            raise ConfigError(f"{self.name}.image_format: '{self.image_format}' unknown; choose one of {', '.join(IMAGE_FORMATS)}")
        if not (self.request_timeout_s > 0) or self.retries < 0 or self.backoff_s < 0:
            raise ConfigError(f"{self.name}: need request_timeout_s > 0, retries >= 0 and backoff_s >= 0")


class _Retryable(Exception):
    """A failure worth another attempt (connection, timeout, 5xx)."""


def _post(url: str, body: bytes, token: str, timeout: float) -> Any:
    """One POST; returns the parsed JSON body; _Retryable or ValueError on failure."""
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = resp.read()
    except urllib.error.HTTPError as e:
        detail = _error_text(e)
        if e.code >= 500:
            raise _Retryable(f"HTTP {e.code}: {detail}") from None
        raise ValueError(f"HTTP {e.code}: {detail}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # refused, reset, timeout
        reason = getattr(e, "reason", e)
        raise _Retryable(f"{type(reason).__name__}: {reason}") from None
    try:
        return json.loads(data)
    except ValueError:
        raise ValueError("server answered with a body that is not JSON") from None


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read()).get("error", e.reason))
    except Exception:
        return str(e.reason)


class RemoteReward(Reward):
    """Client of a `rewards serve` server. score [B] (or [B, A]) as the server's reward gives it.

    Never raises and never invents a score: after ``retries`` failed attempts every sample
    of the batch is ``valid=False`` and ``info["error"]`` says why.
    """

    def __init__(self, config: RemoteRewardConfig, token: Optional[str] = None):
        super().__init__(config)
        if not config.reward:
            raise ConfigError(f"{config.name}.reward: empty; name the reward on the server (GET {config.url}/health lists them)")
        token = token if token is not None else os.environ.get(config.token_env, "")
        if not token:
            raise ConfigError(f"{config.name}.token_env: environment variable {config.token_env} is not set; "
                              f"export the token the server was started with")
        self._token = token
        self.endpoint = config.url.rstrip("/") + "/score"

    def request(self, body: bytes) -> Tuple[Any, int]:
        """POST with retries and exponential backoff -> (parsed response, attempts); raises on final failure."""
        cfg = self.config
        last = ""
        for attempt in range(cfg.retries + 1):
            if attempt:
                time.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            try:
                return _post(self.endpoint, body, self._token, cfg.request_timeout_s), attempt + 1
            except _Retryable as e:
                last = str(e)
        raise ConnectionError(f"no answer from {cfg.url} after {cfg.retries + 1} attempts; last error: {last}")

    def score(self, outputs: Tensor, batch: Sequence[Any]) -> RewardOutput:
        """outputs [B, 3, H, W] in [0, 1] (sent as uint8); batch: B items -> the server's scores.

        Samples with a non-finite pixel are sent as sanitised images and marked invalid."""
        n = len(batch)
        try:
            images = outputs.detach().float().cpu()
            body = build_request(torch.nan_to_num(images, nan=0.0), batch, [self.config.reward], self.config.image_format)
            response, attempts = self.request(body)
            out = parse_scores(response, self.config.reward, n)
            finite = finite_rows(images).view(-1, *([1] * (out.valid.ndim - 1)))
            out.valid = out.valid & finite
            out.info["remote_attempts"] = attempts
            return out
        except Exception as e:  # never raise, never a sentinel: the whole batch is invalid
            text = (str(e).strip().splitlines() or [""])[0]
            return RewardOutput(torch.zeros(n), torch.zeros(n, dtype=torch.bool),
                                {"error": f"remote {self.config.reward}: {type(e).__name__}: {text}"})


REWARDS.register("remote", RemoteRewardConfig, help="a reward served by `rewards serve` on another process or machine")(RemoteReward)

__all__ = ["RemoteReward", "RemoteRewardConfig", "RewardServer", "BadRequest", "encode_images", "decode_images",
           "build_request", "parse_scores", "score_payload", "serve_in_thread", "is_loopback", "to_jsonable",
           "DEFAULT_PORT", "DEFAULT_TOKEN_ENV", "DEFAULT_MAX_BYTES"]
