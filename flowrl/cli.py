"""Command line: ``flowrl train|eval|sample|validate CONFIG [key=value ...]``.

User mistakes (missing file, bad YAML, unknown key, wrong type, invalid combination,
missing checkpoint) exit with code 2 and one line naming the key and the fix.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Tuple

USAGE = """flowrl train CONFIG [key=value ...]              train; writes output_dir/{config.yaml,metrics.jsonl,checkpoints/,final/,report.json}
flowrl eval CONFIG [checkpoint=DIR] [key=value ...] evaluate a checkpoint (default: the starting model); writes output_dir/eval.json
flowrl sample CONFIG [checkpoint=DIR] [key=value ...] sample the evaluation items; writes output_dir/samples.safetensors
flowrl validate CONFIG [key=value ...]            check a config without running anything
flowrl validate --build CONFIG [key=value ...]    also build the parts (loads the weights) and run train's start-up checks; writes nothing
flowrl validate --list heads|algorithms|rewards|data|envs
flowrl reward-serve CONFIG [--host H] [--port N] [--token-env VAR]  serve a config's rewards over HTTP"""


class UserError(Exception):
    pass


def _pop(overrides: List[str], key: str) -> Tuple[Optional[str], List[str]]:
    value, rest = None, []
    for o in overrides:
        if o.startswith(key + "="):
            value = o.split("=", 1)[1]
        else:
            rest.append(o)
    return value, rest


def _load(path: str, overrides: List[str]):
    import flowrl.builtins  # noqa: F401  (registers heads, algorithms, rewards, data sources)
    from flowrl.config import load_config

    return load_config(path, overrides)


def _list(kind: str) -> str:
    import flowrl.builtins  # noqa: F401
    from flowrl.registry import ALGORITHMS, DATASETS, ENVIRONMENTS, HEADS
    from rewards import REWARDS

    regs = {"heads": HEADS, "algorithms": ALGORITHMS, "rewards": REWARDS, "data": DATASETS, "envs": ENVIRONMENTS}
    if kind not in regs:
        raise UserError(f"--list: unknown kind '{kind}'; choose one of {', '.join(regs)}")
    reg = regs[kind]
    return "\n".join(f"{n:<20} {reg.get(n).help}" for n in reg.names())


def cmd_validate(args) -> int:
    if args.list:
        print(_list(args.list))
        return 0
    if not args.config:
        raise UserError("validate: pass a CONFIG path (or --list KIND)")
    if args.build:  # the checks that need the built head, sampler, data and environment
        cfg, trainer = _trainer(args, for_eval=False)
        n = sum(p.numel() for p in trainer.named_trainable.values())
        trainer.close()
        print(f"{args.config}: ok, built ({cfg.algorithm.name} on {cfg.head.name}, {n} trainable parameters, "
              f"{cfg.max_steps} steps -> {cfg.output_dir})")
        return 0
    cfg = _load(args.config, args.overrides)
    print(f"{args.config}: ok ({cfg.algorithm.name} on {cfg.head.name}, {cfg.max_steps} steps -> {cfg.output_dir})")
    return 0


def _trainer(args, for_eval: bool):
    import torch

    from flowrl.trainer import Trainer

    if os.environ.get("FLOWRL_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["FLOWRL_NUM_THREADS"]))
    checkpoint, overrides = _pop(args.overrides, "checkpoint")
    cfg = _load(args.config, overrides)
    if checkpoint is not None and not os.path.isfile(os.path.join(checkpoint, "trainable.safetensors")):
        raise UserError(f"checkpoint: {checkpoint} is not a checkpoint (no trainable.safetensors); "
                        f"pass output_dir/checkpoints/step-N or output_dir/final")
    trainer = Trainer(cfg, for_eval=for_eval)
    if checkpoint is not None:
        trainer.load_for_eval(checkpoint)
    return cfg, trainer


def cmd_train(args) -> int:
    cfg, trainer = _trainer(args, for_eval=False)
    trainer.train()
    trainer.close()
    return 0


def cmd_eval(args) -> int:
    from flowrl.trainer.checkpoint import atomic_write_text

    seed, args.overrides = _pop(args.overrides, "seed")
    cfg, trainer = _trainer(args, for_eval=True)
    seed_value = int(seed) if seed is not None else cfg.eval.seed
    metrics = trainer.evaluate(seed=seed_value, tag=f"eval-seed{seed_value}")
    if trainer.is_main:
        print(json.dumps(metrics, indent=2))
        os.makedirs(cfg.output_dir, exist_ok=True)
        atomic_write_text(os.path.join(cfg.output_dir, "eval.json"), json.dumps(metrics, indent=2))
    trainer.close()
    return 0


def cmd_sample(args) -> int:
    from safetensors.torch import save_file

    import torch

    seed, args.overrides = _pop(args.overrides, "seed")
    cfg, trainer = _trainer(args, for_eval=True)
    seed_value = int(seed) if seed is not None else cfg.eval.seed
    items, final = trainer.sample(seed=seed_value)
    outputs = trainer.head.decode(final, trainer.head.encode(items))
    os.makedirs(cfg.output_dir, exist_ok=True)
    path = os.path.join(cfg.output_dir, "samples.safetensors")
    tensors = {"final": final.contiguous().cpu()}
    if isinstance(outputs, torch.Tensor) and outputs is not final:
        tensors["outputs"] = outputs.contiguous().cpu()  # decoded (images for t2i heads)
    save_file(tensors, path)
    print(f"wrote {len(items)} samples to {path}")
    if hasattr(trainer.head, "save_samples"):
        print(f"grid: {trainer.head.save_samples(outputs, items, cfg.output_dir, f'sample-seed{seed_value}')}")
    trainer.close()
    return 0


def _parse(argv: List[str]) -> argparse.Namespace:
    """COMMAND [CONFIG] [key=value ...] [--list KIND]; raises UserError on misuse."""
    if not argv:
        raise UserError("missing command; use train, eval, sample or validate (flowrl --help shows usage)")
    command, rest = argv[0], list(argv[1:])
    if command not in ("train", "eval", "sample", "validate"):
        raise UserError(f"unknown command '{command}'; use train, eval, sample or validate")
    kind = None
    if "--list" in rest:
        i = rest.index("--list")
        if i + 1 >= len(rest):
            raise UserError("--list: name a kind: heads, algorithms, rewards, data or envs")
        kind = rest[i + 1]
        del rest[i:i + 2]
    build = "--build" in rest
    if build:
        if command != "validate":
            raise UserError(f"--build: only validate takes it ({command} builds the parts anyway)")
        rest.remove("--build")
    config = rest.pop(0) if rest and "=" not in rest[0] else None
    stray = [r for r in rest if "=" not in r]
    if stray:
        raise UserError(f"{stray[0]}: overrides are key=value (for example max_steps=10)")
    if command != "validate" and not config:
        raise UserError(f"{command} needs a CONFIG path (see configs/)")
    if build and kind:
        raise UserError("--build: checks one CONFIG; drop --list")
    return argparse.Namespace(command=command, config=config, overrides=rest, list=kind, build=build)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if argv and argv[0] == "reward-serve":  # `flowrl reward-serve ...` == `rewards serve ...`
        from rewards.cli import main as rewards_main

        return rewards_main(["serve", *argv[1:]])
    from flowrl.registry import ConfigError
    from rewards import RewardFailure

    handlers = {"train": cmd_train, "eval": cmd_eval, "sample": cmd_sample, "validate": cmd_validate}
    try:
        args = _parse(argv)
        return handlers[args.command](args)
    except (ConfigError, UserError) as e:
        print(f"flowrl: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        msg = str(e).splitlines()[0] if str(e) else "a required file is missing"
        print(f"flowrl: error: {msg}", file=sys.stderr)
        return 2
    except RewardFailure as e:  # a reward broke for whole batches: the run stops, it is not a config mistake
        print(f"flowrl: error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("flowrl: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
