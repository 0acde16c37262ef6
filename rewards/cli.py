"""Command line: ``rewards serve CONFIG [--host H] [--port N] [--token-env VAR] [--max-bytes N] [--import MOD]``.

Serves the rewards listed under ``rewards:`` in CONFIG (the same section a flowrl config
has, e.g. ``rewards: [{name: jpeg_compressibility}]``; other top-level keys are ignored)
over HTTP; see ``rewards.remote`` for the wire format. The shared-secret token is read
from an environment variable (default FLOWRL_REWARD_TOKEN) and is required. User
mistakes (missing config, no token, unknown reward, busy port) exit with code 2 and one line.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from typing import Any, Dict, List, Optional

USAGE = "rewards serve CONFIG [--host 127.0.0.1] [--port 8700] [--token-env FLOWRL_REWARD_TOKEN] [--max-bytes N] [--import MODULE ...]"


class UserError(Exception):
    """A user mistake: printed as one line, exit code 2."""


def parser() -> argparse.ArgumentParser:
    from rewards.remote import DEFAULT_MAX_BYTES, DEFAULT_PORT, DEFAULT_TOKEN_ENV

    p = argparse.ArgumentParser(prog="rewards", description="Serve flowrl rewards over HTTP.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the rewards of a config over HTTP (POST /score, GET /health)")
    s.add_argument("config", help="YAML file with a `rewards:` list (a flowrl config works)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; anything else is reachable from the network)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = any free port, printed at start)")
    s.add_argument("--token-env", default=DEFAULT_TOKEN_ENV, help="environment variable holding the shared-secret token (required)")
    s.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="largest request body accepted (413 above it)")
    s.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (plugins that register their own rewards); repeatable")
    s.add_argument("--log-requests", action="store_true", help="log every request to stderr")
    return p


def import_reward_modules(extra: List[str]) -> None:
    """Register the built-in rewards (``import rewards`` registers every model) and plugins."""
    import flowrl.builtins  # noqa: F401  (toy rewards and anything the engine registers)
    import rewards  # noqa: F401

    for name in extra:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(f"--import: cannot import '{name}' ({e}); check the module name and PYTHONPATH") from None


def read_reward_configs(path: str) -> List[Any]:
    """CONFIG -> the RewardConfig of every entry under ``rewards:`` (ConfigError on mistakes)."""
    import yaml

    from flowrl.configlib import build_section
    from flowrl.registry import ConfigError
    from rewards.base import REWARDS

    try:
        with open(path) as fh:
            data = yaml.safe_load(fh)
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict) or "rewards" not in data:
        raise UserError(f"{path}: needs a top-level `rewards:` list, e.g. rewards: [{{name: jpeg_compressibility}}]")
    entries = data["rewards"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError("rewards: expected a non-empty list of reward sections ({name: ...})")
    configs = [build_section(REWARDS, e, f"rewards[{i}]") for i, e in enumerate(entries)]
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"rewards: duplicate reward names {names}; serve each reward once")
    return configs


def build_rewards(configs: List[Any]) -> Dict[str, Any]:
    """name -> built Reward. The server never stops on repeated failures (the client counts them)."""
    from rewards.base import build_reward

    built = {}
    for c in configs:
        if hasattr(c, "max_consecutive_failures"):
            c = dataclasses.replace(c, max_consecutive_failures=0)
        built[c.name] = build_reward(c)
    return built


def serve(args: argparse.Namespace) -> int:
    token = os.environ.get(args.token_env, "")
    if not token:
        raise UserError(f"--token-env: environment variable {args.token_env} is not set; export a shared secret "
                        f"(e.g. {args.token_env}=$(python -c 'import secrets; print(secrets.token_hex(16))')) "
                        f"and give the same value to the clients")
    if not os.path.isfile(args.config):
        raise UserError(f"CONFIG: {args.config} not found; pass a YAML file with a `rewards:` list")
    if args.max_bytes < 1:
        raise UserError(f"--max-bytes: must be >= 1, got {args.max_bytes}")
    import_reward_modules(args.imports)
    from rewards.remote import RewardServer, is_loopback

    rewards = build_rewards(read_reward_configs(args.config))
    try:
        server = RewardServer((args.host, args.port), rewards, token, args.max_bytes, quiet=not args.log_requests)
    except OSError as e:
        raise UserError(f"--host/--port: cannot bind {args.host}:{args.port} ({e.strerror or e}); pick another port") from None
    if not is_loopback(args.host):
        print(f"rewards serve: WARNING: bound to {args.host}, reachable from the network; keep the token secret "
              f"and prefer an SSH tunnel to a loopback server", file=sys.stderr, flush=True)
    print(f"rewards serve: serving {', '.join(sorted(rewards))} on {server.url} (POST /score, GET /health)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    from flowrl.registry import ConfigError

    args = parser().parse_args(argv)
    try:
        if args.command == "serve":
            return serve(args)
    except UserError as e:
        print(f"rewards {args.command}: {e}", file=sys.stderr)
        return 2
    except (ConfigError, FileNotFoundError) as e:  # config parsing; a reward loader's missing weights
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"rewards {args.command}: {msg}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
