"""Kinematic bicycle model at 10 Hz: forward step, rollout and inverse dynamics.

State [..., 4] = (x, y, heading, speed); control [..., 2] = (accel m/s^2, steer rad).
Per step: v' = max(v + a dt, 0); the distance ds = (v + v') dt / 2 is driven on an arc
of curvature kappa = tan(steer) / wheelbase, so the heading turns by ds * kappa and the
position moves along the arc's chord. Constant controls therefore trace an exact circle
of radius wheelbase / tan(steer) (and a straight line for steer = 0); the step is
differentiable in the controls (except where the speed clamp at 0 is active).
Inverse dynamics recovers (accel, steer) exactly from consecutive states.
"""
from __future__ import annotations

import torch

from planners.driving.geometry import wrap_angle
from planners.driving.scenes import DT

Tensor = torch.Tensor


def bicycle_step(state: Tensor, control: Tensor, wheelbase: Tensor, dt: float = DT) -> Tensor:
    """state [..., 4], control [..., 2], wheelbase [...] -> next state [..., 4]."""
    x, y, h, v = state.unbind(-1)
    accel, steer = control.unbind(-1)
    v_next = (v + accel * dt).clamp(min=0.0)
    ds = 0.5 * (v + v_next) * dt
    dh = ds * torch.tan(steer) / wheelbase
    chord = ds * torch.sinc(dh / (2 * torch.pi))  # 2 sin(dh/2) / dh * ds
    mid = h + 0.5 * dh
    return torch.stack([x + chord * mid.cos(), y + chord * mid.sin(), h + dh, v_next], dim=-1)


def bicycle_rollout(state: Tensor, controls: Tensor, wheelbase: Tensor, dt: float = DT) -> Tensor:
    """state [..., 4], controls [..., H, 2], wheelbase [...] -> states [..., H, 4] (after each step)."""
    out = []
    for k in range(controls.shape[-2]):
        state = bicycle_step(state, controls[..., k, :], wheelbase, dt)
        out.append(state)
    return torch.stack(out, dim=-2)


def inverse_dynamics(states: Tensor, wheelbase: Tensor, dt: float = DT, min_ds: float = 1e-3) -> Tensor:
    """states [..., H+1, 4], wheelbase [...] -> controls [..., H, 2] that reproduce them.

    Steering is unobservable while the vehicle does not move (ds < ``min_ds``); it is
    set to 0 there.
    """
    v, v_next = states[..., :-1, 3], states[..., 1:, 3]
    accel = (v_next - v) / dt
    ds = 0.5 * (v + v_next) * dt
    dh = wrap_angle(states[..., 1:, 2] - states[..., :-1, 2])
    moving = ds > min_ds
    kappa = torch.where(moving, dh / ds.clamp(min=min_ds), torch.zeros_like(ds))
    steer = torch.atan(kappa * wheelbase.unsqueeze(-1))
    return torch.stack([accel, steer], dim=-1)


def wheelbase_of(length: Tensor) -> Tensor:
    """Wheelbase used by the simulator for a vehicle of the given length (60 %)."""
    return 0.6 * length
