"""The shapes world: a GenEval-like procedural text-to-image world and its verifier.

``world`` renders scenes of flat coloured shapes (the SPEC lives in its docstring and in
``SPEC.md``), ``prompts`` generates GenEval-style prompts, ground-truth scenes and the
fixed held-out split, and ``verifier`` holds ShapesEval, registered in ``REWARDS`` as
``shapes_eval`` when this package is imported.
"""
from rewards.shapes import prompts, verifier, world  # noqa: F401  (verifier registers shapes_eval)
from rewards.shapes.prompts import (CATEGORIES, all_prompts, item_spec, mismatch, parse_prompt, sample_scene,
                                    split_prompts, write_jsonl, write_split)
from rewards.shapes.verifier import ShapesEval, ShapesEvalConfig, detect, evaluate
from rewards.shapes.world import COLOURS, SHAPES, Obj, Scene, render, render_batch

__all__ = ["CATEGORIES", "COLOURS", "SHAPES", "Obj", "Scene", "ShapesEval", "ShapesEvalConfig", "all_prompts",
           "detect", "evaluate", "item_spec", "mismatch", "parse_prompt", "render", "render_batch", "sample_scene",
           "split_prompts", "write_jsonl", "write_split"]
