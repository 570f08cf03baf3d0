"""The scorer's vision tower as CUDA graphs, one per fixed pixel budget.

At batch 1 the tower's kernels are small and many (32 layers of norms, products, rotary, attention): the
GPU waits on the host launching them. A scorer serves screenshots at fixed pixel bounds, so most requests
hold the same grid (a 1280×720 screenshot is one grid, eight of them another), and with its packing read
from the grid before the layers (:mod:`keyshot.infer.model.vision_packing`) the tower's forward reads
nothing back from the device: it can be captured once per grid and replayed, one launch per forward.

:func:`use_tower_cuda_graphs` captures the grids it is given (inference only: a forward that records
gradients, or another grid, runs the tower as before) and refuses in one line where it cannot (no CUDA, no
Qwen2.5-VL tower). The graphs share one memory pool and hold their input and output buffers; the tower's
weights are read in place (no copy). Replays return copies of the outputs, so a later replay cannot
overwrite what a caller holds.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from keyshot.infer.model.patch_rules import qwen25_vl_class
from keyshot.infer.model.vision_packing import Grid, grid_of, use_grid_packing

logger = logging.getLogger(__name__)


class TowerGraphsUnavailable(RuntimeError):
    """The tower cannot be captured here (no CUDA device, no Qwen2.5-VL tower); the message says which."""


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    pixels: torch.Tensor  # the static input the replay reads
    output: object  # the static output (BaseModelOutputWithPooling) the replay writes


def _tower(model: torch.nn.Module) -> torch.nn.Module:
    cls = qwen25_vl_class("Qwen2_5_VisionTransformerPretrainedModel")
    towers = [m for m in model.modules() if cls is not None and isinstance(m, cls)]
    if len(towers) != 1:
        raise TowerGraphsUnavailable(
            f"CUDA graphs of the vision tower: {type(model).__name__} holds {len(towers)} Qwen2.5-VL vision "
            "towers, expected one (nothing captured)"
        )
    return towers[0]


def _copy(output):
    fields = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in output.items()}
    return type(output)(**fields)


def _graphed_forward(self, hidden_states, grid_thw=None, **kwargs):
    captured = self._keyshot_graphs.get(grid_of(grid_thw)) if grid_thw is not None else None
    usable = (
        captured is not None
        and not torch.is_grad_enabled()
        and hidden_states.shape == captured.pixels.shape
        and hidden_states.device == captured.pixels.device
    )
    if not usable:
        return type(self).forward(self, hidden_states, grid_thw, **kwargs)
    captured.pixels.copy_(hidden_states.to(captured.pixels.dtype), non_blocking=True)
    captured.graph.replay()
    return _copy(captured.output)


def captured_grids(model: torch.nn.Module) -> set[Grid]:
    """The grids ``model``'s vision tower has a CUDA graph for (none before :func:`use_tower_cuda_graphs`)."""
    return set(_tower(model).__dict__.get("_keyshot_graphs", {}))


def use_tower_cuda_graphs(model: torch.nn.Module, grids: Iterable[Grid], channels: int | None = None) -> int:
    """Capture ``model``'s vision tower as a CUDA graph for each grid of ``grids`` (each a tuple of
    ``(t, h, w)`` rows: one per image of a batch); returns how many grids have a graph (those captured by an
    earlier call included). ``channels``: a pixel row's width (default: the patch embedding's input)."""
    tower = _tower(model)
    device = next(tower.parameters()).device
    if device.type != "cuda":
        raise TowerGraphsUnavailable(
            f"CUDA graphs of the vision tower need a CUDA device; the tower is on {device.type} (nothing captured)"
        )
    use_grid_packing(tower)  # the forward must read nothing back: its packing comes from the grid
    graphs: dict[Grid, _Captured] = tower.__dict__.setdefault("_keyshot_graphs", {})
    pool = next(iter(graphs.values())).graph.pool() if graphs else None
    dtype = next(tower.parameters()).dtype
    width = channels or tower.patch_embed.proj.weight[0].numel()
    for grid in grids:
        grid = tuple(tuple(int(v) for v in row) for row in grid)
        if grid in graphs:
            continue
        rows = sum(t * h * w for t, h, w in grid)
        pixels = torch.zeros(rows, width, device=device, dtype=dtype)
        host_grid = torch.tensor(grid)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(2):  # warm-up off the capture: kernels chosen, MLPs padded, the packing computed
                tower(pixels, grid_thw=host_grid)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph, pool=pool):
            output = tower(pixels, grid_thw=host_grid)
        pool = pool or graph.pool()
        graphs[grid] = _Captured(graph, pixels, output)
        logger.info("vision tower: CUDA graph captured for grid %s (%d patches)", grid, rows)
    if not isinstance(tower.__dict__.get("forward"), types.MethodType):
        tower.forward = types.MethodType(_graphed_forward, tower)
    return len(graphs)
