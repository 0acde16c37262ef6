"""Top-down rendering of one scene of a ``SimState`` to a PIL image (PNG frames / GIFs)."""
from __future__ import annotations

from typing import List, Optional

import torch
from PIL import Image, ImageDraw

from planners.driving.geometry import box_corners


def render(state, index: int = 0, size: int = 600, extent: Optional[float] = None, flags: Optional[torch.Tensor] = None,
           center: Optional[torch.Tensor] = None) -> Image.Image:
    """Lanes grey, controlled vehicles blue (red when ``flags[a]``), background green."""
    sc = state.scene
    pos = state.pos[index].detach().cpu()
    alive = state.alive[index].cpu()
    ctrl = sc.controlled[index].cpu()
    if center is None:
        center = pos[ctrl & alive].mean(0) if bool((ctrl & alive).any()) else pos[alive].mean(0)
    extent = extent or 80.0
    scale = size / (2 * extent)
    to_px = lambda p: [((float(x) - float(center[0])) * scale + size / 2, size / 2 - (float(y) - float(center[1])) * scale)  # noqa: E731
                       for x, y in p]
    img = Image.new("RGB", (size, size), (250, 250, 250))
    d = ImageDraw.Draw(img)
    polys, pmask = sc.polylines[index].cpu(), sc.polyline_mask[index].cpu()
    for m in range(polys.shape[0]):
        if pmask[m]:
            hw = float(polys[m, 0, 4])
            d.line(to_px(polys[m, :, :2].tolist()), fill=(215, 215, 215), width=max(1, int(2 * hw * scale)))
    for m in range(polys.shape[0]):
        if pmask[m]:
            d.line(to_px(polys[m, :, :2].tolist()), fill=(160, 160, 160), width=1)
    length, width = sc.agents[index, :, -1, 5].cpu(), sc.agents[index, :, -1, 6].cpu()
    corners = box_corners(pos, state.heading[index].detach().cpu(), length, width)
    for n in range(pos.shape[0]):
        if not alive[n]:
            continue
        colour = (40, 150, 60)
        if ctrl[n]:
            colour = (220, 40, 40) if flags is not None and n < len(flags) and bool(flags[n]) else (40, 80, 220)
        d.polygon(to_px(corners[n].tolist()), fill=colour)
    return img


def save_gif(frames: List[Image.Image], path: str, fps: int = 10) -> None:
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=int(1000 / fps), loop=0)
