"""Remote rewards against a real `rewards serve` process on loopback (127.0.0.1 only)."""
import base64
import importlib.util
import json
import os
import re
import selectors
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from rewards.base import REWARDS, CompositeReward, build_reward
from rewards.images import prompts_of
from rewards.remote import RemoteRewardConfig, decode_images, encode_images, is_loopback
from tests.conftest import ROOT
from tests.contracts.reward_fixtures import images, prompt_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TOKEN = "test-token-0123456789abcdef"
PLUGIN = "tests.integration.remote_plugin"
HAS_JPEG = importlib.util.find_spec("rewards.jpeg") is not None
MAX_BYTES = 200_000


def launch(cfg, port=0, args=(), env=None, timeout=30.0):
    """`python -m rewards.cli serve CFG` on 127.0.0.1 in a subprocess -> (process, base url) once it listens."""
    env = {**os.environ, "FLOWRL_REWARD_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, "-m", "rewards.cli", "serve", str(cfg), "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:  # the process ended
            break
        seen.append(line)
        m = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise AssertionError(f"server did not start: {''.join(seen)}{proc.stdout.read() if proc.poll() is not None else ''}")


def start_server(tmp_path, port=0, max_bytes=MAX_BYTES, slow_delay=2.0, name="serve"):
    """A server of test_brightness, test_slow (sleeps ``slow_delay``) and jpeg_compressibility."""
    entries = ["  - {name: test_brightness}", f"  - {{name: test_slow, delay_s: {slow_delay}}}"]
    if HAS_JPEG:
        entries.append("  - {name: jpeg_compressibility}")
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text("rewards:\n" + "\n".join(entries) + "\n")
    return launch(cfg, port, ["--max-bytes", str(max_bytes), "--import", PLUGIN])


def stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    proc.stdout.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc, url = start_server(tmp_path_factory.mktemp("remote"))
    yield url
    stop(proc)


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv("FLOWRL_REWARD_TOKEN", TOKEN)


def remote(url, reward, **kw):
    return build_reward(RemoteRewardConfig(url=url, reward=reward, **kw))


def post(url, body: bytes, token=TOKEN, path="/score"):
    """-> (status, parsed JSON body)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def brightness(x, batch):
    """test_brightness computed here: 100 * mean pixel + words in the prompt."""
    words = torch.tensor([len(p.split()) for p in prompts_of(batch)], dtype=torch.float32)
    return 100.0 * x.mean(dim=(1, 2, 3)) + words


@pytest.mark.parametrize("fmt", ["png", "raw"])
def test_remote_scores_equal_in_process_scores(server, token_env, fmt):
    x, batch = images(6), prompt_batch(6)  # uint8-level pixels: both formats are lossless
    out = remote(server, "test_brightness", image_format=fmt)(x, batch)
    assert bool(out.valid.all()) and out.info["remote_attempts"] == 1
    assert torch.allclose(out.score, brightness(x, batch), atol=1e-4)
    assert out.info["mean_words"] == pytest.approx(float(brightness(torch.zeros_like(x), batch).mean()))
    if HAS_JPEG:
        local = build_reward(REWARDS.get("jpeg_compressibility").config_cls())(x, batch)
        far = remote(server, "jpeg_compressibility", image_format=fmt)(x, batch)
        assert torch.allclose(far.score, local.score, atol=1e-5) and torch.equal(far.valid, local.valid)


def test_several_rewards_in_one_request_and_health(server):
    x, batch = images(4), prompt_batch(4)
    body = json.dumps({"rewards": ["test_brightness"], "images": encode_images(x, "raw"), "batch": batch}).encode()
    status, resp = post(server, body)
    assert status == 200 and set(resp) == {"scores", "valid", "info"}
    assert torch.allclose(torch.tensor(resp["scores"]["test_brightness"]), brightness(x, batch), atol=1e-4)
    with urllib.request.urlopen(server + "/health", timeout=5) as r:
        assert json.loads(r.read()) == {"status": "ok"}  # no reward names without the token
    req = urllib.request.Request(server + "/health", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert "test_brightness" in json.loads(r.read())["rewards"]


def test_wrong_or_missing_token_is_refused(server, monkeypatch):
    body = json.dumps({"images": encode_images(images(2), "png"), "batch": prompt_batch(2)}).encode()
    assert post(server, body, token="wrong")[0] == 401
    assert post(server, body, token=None)[0] == 401
    monkeypatch.setenv("FLOWRL_REWARD_TOKEN", "wrong")
    t0 = time.monotonic()
    out = remote(server, "test_brightness", retries=3, backoff_s=1.0)(images(2), prompt_batch(2))
    assert not bool(out.valid.any()) and "401" in out.info["error"]
    assert time.monotonic() - t0 < 1.0  # a 4xx answer is not retried


def test_oversized_request_is_refused(server, token_env):
    assert post(server, b"{" + b" " * (MAX_BYTES + 1) + b"}")[0] == 413
    big = images(8, size=96)  # ~300 KB of PNG: over the server's 200 kB bound
    out = remote(server, "test_brightness", image_format="raw")(big, prompt_batch(6) + prompt_batch(2))
    assert not bool(out.valid.any()) and "413" in out.info["error"]


def test_malformed_requests_get_400(server):
    good = {"images": encode_images(images(2), "raw"), "batch": prompt_batch(2)}
    bad_bodies = [
        b"{not json",
        json.dumps({**good, "rewards": ["no_such_reward"]}).encode(),
        json.dumps({**good, "batch": prompt_batch(3)}).encode(),
        json.dumps({**good, "images": {**good["images"], "data": "%%%"}}).encode(),
        json.dumps({**good, "images": {**good["images"], "shape": [2, 3, 5, 5]}}).encode(),
        json.dumps([1, 2]).encode(),
    ]
    for body in bad_bodies:
        status, resp = post(server, body)
        assert status == 400 and resp["error"], (body[:60], status, resp)
    assert post(server, b"{}", path="/nope")[0] == 404


def test_timeout_is_honoured(server, token_env):
    slow = remote(server, "test_slow", request_timeout_s=0.3, retries=1, backoff_s=0.05)
    t0 = time.monotonic()
    out = slow(images(2), prompt_batch(2))  # the server sleeps 2 s per call
    elapsed = time.monotonic() - t0
    assert not bool(out.valid.any()) and "timed out" in out.info["error"].lower()
    assert elapsed < 1.5, elapsed
    # other rewards on the same server are not blocked by the slow one
    assert bool(remote(server, "test_brightness")(images(2), prompt_batch(2)).valid.all())


def test_server_killed_mid_run_marks_invalid_and_the_run_continues(tmp_path, token_env):
    proc, url = start_server(tmp_path, slow_delay=1.0, name="first")
    port = int(url.rsplit(":", 1)[1])
    x, batch = images(4), prompt_batch(4)
    rewards = CompositeReward([RemoteRewardConfig(url=url, reward="test_slow", retries=1, backoff_s=0.05)])
    try:
        killer = threading.Timer(0.4, proc.kill)
        killer.start()  # kill the server while it is scoring
        t0 = time.monotonic()
        out = rewards(x, batch)
        killer.join()
        assert not bool(out.valid.any()) and out.metrics["reward/remote_invalid_frac"] == 1.0
        assert time.monotonic() - t0 < 5.0
        error = rewards.rewards[0]  # the run keeps going: no exception, the failure is counted
        assert error.consecutive_failures == 1
    finally:
        stop(proc)
    proc, _ = start_server(tmp_path, port=port, slow_delay=0.0, name="second")  # restarted on the same port
    try:
        out = rewards(x, batch)
        assert bool(out.valid.all()) and torch.allclose(out.total, brightness(x, batch), atol=1e-4)
        assert rewards.rewards[0].consecutive_failures == 0
    finally:
        stop(proc)


def test_user_mistakes_exit_2(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rewards:\n  - {name: no_such_reward}\n")
    vlm = tmp_path / "vlm.yaml"
    vlm.write_text(f"rewards:\n  - {{name: vlm_yes_no, path: {tmp_path / 'absent-vlm'}}}\n")
    base = [sys.executable, "-m", "rewards.cli", "serve"]
    env = {k: v for k, v in os.environ.items() if k != "FLOWRL_REWARD_TOKEN"}
    env["PYTHONPATH"] = str(ROOT)
    no_token = subprocess.run(base + [str(cfg)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert no_token.returncode == 2 and "FLOWRL_REWARD_TOKEN" in no_token.stderr
    env["FLOWRL_REWARD_TOKEN"] = TOKEN
    cases = (([str(tmp_path / "absent.yaml")], "not found"), ([str(cfg)], "unknown reward"),
             ([str(vlm)], "absent-vlm"))
    for args, needle in cases:
        r = subprocess.run(base + args + ["--port", "0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and needle in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_wire_helpers_and_loopback():
    x = images(3, size=8)
    for fmt in ("png", "raw"):
        assert torch.equal(decode_images(json.loads(json.dumps(encode_images(x, fmt)))), x)
    f32 = {"format": "raw", "dtype": "float32", "shape": [3, 3, 8, 8],
           "data": base64.b64encode(x.numpy().tobytes()).decode()}
    assert torch.equal(decode_images(f32), x)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
