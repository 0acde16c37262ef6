"""The driving planner as a flowrl ``Head`` (multi-agent control chunks, SCORP-style).

x [B, A, H, 2] is the NORMALISED joint control chunk of the A controlled slots
(``model.normalise_controls``: accel / 3 m/s^2, steer / 0.2 rad); ``decode`` returns
physical controls [B, A, H, 2] for ``DrivingEnv.step``. ``event_ndim = 2`` makes
log-probs per agent [B, A], matching the per-agent dense reward.

``encode`` takes observation ``Scene``s (``DrivingEnv.observe``, ``DemoDataset``), a list
of them, or scene seeds (ints). The reference policy for KL terms is a frozen copy of the
weights the head started from (the planner is small). ``regression_loss`` is the
offline hook ``flow_matching`` calls: masked flow matching plus the loss on the states
reached by the one-step denoised controls (``model.denoising_loss``).
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Sequence

import torch
from safetensors.torch import load_file, save_file

from flowrl._fields import hfield
from flowrl.heads.base import Head
from planners.driving.model import (PlannerConfig, PlannerDenoiser, denormalise_controls, normalise_controls,
                                    rollout_controls, scene_features)
from planners.driving.scenes import Scene, make_scenes

Tensor = torch.Tensor
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRETRAINED = "planners/driving/pretrained"


@dataclass
class DrivingHeadConfig:
    """The multi-agent diffusion planner."""

    name: str = hfield("driving_planner", "head name")
    path: Optional[str] = hfield(None, "load a saved planner (save_pretrained folder, e.g. planners/driving/pretrained); "
                                       "null = random init from init_seed")
    planner: PlannerConfig = hfield(default_factory=PlannerConfig, help="denoiser size (ignored when path is set: "
                                                                        "the saved config.json wins)")
    state_weight: float = hfield(1.0, "offline pretraining: weight of the loss on states reached by the denoised controls")
    init_seed: int = hfield(0, "seed of the random initialisation")

    def __post_init__(self) -> None:
        if isinstance(self.planner, dict):
            self.planner = PlannerConfig(**self.planner)
        if self.state_weight < 0:
            raise ValueError("head.state_weight must be >= 0")


def resolve_path(path: str) -> str:
    """A relative path is taken from the working directory, else from the repository root."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    alt = os.path.join(REPO, path)
    return alt if os.path.exists(alt) else path


class DrivingHead(Head):
    """Head over ``PlannerDenoiser``: velocity prediction, flowrl time (t = 1 noise)."""

    prediction = "velocity"
    event_ndim = 2

    def __init__(self, config: Optional[DrivingHeadConfig] = None):
        super().__init__()
        config = config or DrivingHeadConfig()
        state = None
        if config.path:
            path = resolve_path(config.path)
            weights = os.path.join(path, "model.safetensors")
            if not os.path.isfile(weights):
                raise FileNotFoundError(f"head.path: {weights} not found; point head.path at a planner's final/ folder "
                                        f"or run `flowrl train configs/driving/pretrain.yaml`")
            with open(os.path.join(path, "config.json")) as fh:
                saved = json.load(fh)
            config = DrivingHeadConfig(**{**asdict(config), "planner": PlannerConfig(**saved["planner"]),
                                          "state_weight": saved.get("state_weight", config.state_weight)})
            state = load_file(weights)
        self.config = config
        with torch.random.fork_rng(devices=[]):  # the same head whatever the run's seed
            torch.manual_seed(config.init_seed)
            self.model = PlannerDenoiser(config.planner)
        if state is not None:
            self.model.load_state_dict(state)
        self.reference = copy.deepcopy(self.model).requires_grad_(False)
        self.eval()

    @property
    def device(self) -> torch.device:
        return self.model.out.weight.device

    # ---- the Head contract
    @torch.no_grad()
    def encode(self, batch: Any) -> Dict[str, Tensor]:
        if isinstance(batch, Scene):
            scene = batch
        elif len(batch) and all(isinstance(b, Scene) for b in batch):
            scene = Scene.stack(list(batch))
        else:
            scene = make_scenes([int(b) for b in batch])
        return {k: v.to(self.device) for k, v in scene_features(scene.to(self.device)).items()}

    def init_noise(self, cond: Dict[str, Tensor], generators: Sequence[torch.Generator]) -> Tensor:
        a = cond["agent_valid"].shape[1]
        shape = (a, self.config.planner.horizon, 2)
        return torch.stack([torch.randn(shape, generator=g) for g in generators]).to(self.device)

    def velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        return self.model(x, t, cond)

    def reference_velocity(self, x: Tensor, t: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        with torch.no_grad():
            return self.reference(x, t, cond)

    def decode(self, x: Tensor, cond: Dict[str, Tensor]) -> Tensor:
        """Normalised chunk -> physical (accel m/s^2, steer rad) [B, A, H, 2]."""
        return denormalise_controls(x)

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    # ---- offline hook (flowrl.algorithms.flow_matching)
    def regression_loss(self, out: Tensor, x_t: Tensor, t: Tensor, x0: Tensor, eps: Tensor,
                        cond: Dict[str, Tensor]) -> Tensor:
        """Per-sample [B] loss: flow matching on the valid controlled slots plus
        ``state_weight`` x the squared distance (per 2 m) between the states reached by the
        one-step denoised controls x0_hat = x_t - t v and by the data controls."""
        mask = cond["agent_valid"].float()[..., None, None]
        n = mask.flatten(1).sum(1).clamp(min=1) * x0.shape[2]
        fm = (((out.float() - (eps - x0).float()) ** 2) * mask).flatten(1).sum(1) / (2 * n)
        if self.config.state_weight == 0:
            return fm
        tb = t.view(-1, 1, 1, 1).to(out.dtype)
        x0_hat = x_t - tb * out
        reached = rollout_controls(cond["ego_state"], denormalise_controls(x0_hat.float()), cond["wheelbase"])
        with torch.no_grad():
            target = rollout_controls(cond["ego_state"], denormalise_controls(x0.float()), cond["wheelbase"])
        err = (((reached[..., :2] - target[..., :2]) / 2.0) ** 2).sum(-1, keepdim=True)
        state = (err * mask).flatten(1).sum(1) / n
        return fm + self.config.state_weight * state

    # ---- files
    def save_pretrained(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()},
                  os.path.join(directory, "model.safetensors"))
        with open(os.path.join(directory, "config.json"), "w") as fh:
            json.dump({"planner": asdict(self.config.planner), "state_weight": self.config.state_weight,
                       "control_scale": [3.0, 0.2], "x_layout": "[B, A, H, 2] normalised (accel, steer)"}, fh, indent=2)

    @classmethod
    def from_pretrained(cls, directory: str) -> "DrivingHead":
        return cls(DrivingHeadConfig(path=directory))


def normalised_demo_controls(controls: Tensor) -> Tensor:
    """Physical demo controls -> the head's x space (what offline regression trains on)."""
    return normalise_controls(controls)
