"""A Qwen2.5-VL tower forward without host syncs: its packing read from the grid once, before the layers.

The tower packs every image's patches into one sequence and attends within windows (most layers) or within
each image (the full-attention layers), delimited by ``cu_seqlens``. transformers derives that packing
inside the forward from ``grid_thw``, reading device tensors on the host as it goes (the grid, the windows'
bounds), and under SDPA leaves ``max_seqlen`` unset, so an attention that needs it (torch's varlen kernel,
:mod:`keyshot.infer.model.vision_varlen`) or the windows' bounds (the batched windows,
:mod:`keyshot.infer.model.vision_attention`) read it back once per layer: 32 host syncs a forward at the 7B's
depth, each one stalling the GPU's queue, which at batch 1 is most of the tower's time.

transformers' forward takes the packing precomputed (its ``get_vision_*`` helpers pop ``position_ids``,
``cu_seqlens``, ``max_seqlen``, ``window_index``, ``cu_window_seqlens`` and ``max_window_seqlen`` from the
call's keyword arguments). :func:`use_grid_packing` adds a forward pre-hook that computes them on the host with
those same helpers from the grid (one read of it, none where the caller holds it on the CPU), moves them to
the device without a sync, and hands the batched windows their groups of window starts with the bounds: the
forward then reads nothing back. Packings are kept per grid (a scorer's fixed pixel budget recurs), which is
also what lets a CUDA graph capture the tower (:mod:`keyshot.infer.model.vision_graphs`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import torch

from keyshot.infer.model.patch_rules import nothing_patched, qwen25_vl_class

logger = logging.getLogger(__name__)

#: The keyword arguments transformers' tower forward takes precomputed (and pops before its layers).
PACKING_KEYS = (
    "position_ids",
    "cu_seqlens",
    "max_seqlen",
    "window_index",
    "cu_window_seqlens",
    "max_window_seqlen",
)
#: Attribute of a ``cu_seqlens`` tensor holding its windows grouped by length, ``[(length, index), ...]``
#: with ``index`` a device tensor (windows, length) of packed positions: set by :func:`tower_packing`, read
#: by the batched windows (vision_attention.py), which then read no bounds back from the device.
WINDOW_GROUPS = "_keyshot_window_groups"
CACHED_GRIDS = 16

Grid = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class TowerPacking:
    """Everything a tower forward derives from one grid, on the tower's device."""

    grid: Grid
    position_ids: torch.Tensor
    window_index: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_window_seqlens: torch.Tensor
    max_seqlen: int
    max_window_seqlen: int

    def kwargs(self) -> dict:
        return {key: getattr(self, key) for key in PACKING_KEYS}


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without a sync (pinned, non-blocking, on CUDA)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def window_groups(cu_seqlens: torch.Tensor, device: torch.device) -> list[tuple[int, torch.Tensor]]:
    """The windows grouped by length, each group's packed positions as a (windows, length) index, read from
    ``cu_seqlens`` (a host sync where it lives on a device: :func:`tower_packing` reads its host copy)."""
    bounds = cu_seqlens.tolist()
    by_length: dict[int, list[int]] = defaultdict(list)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        if end > start:
            by_length[end - start].append(start)
    return [
        (length, torch.tensor(starts, device=device)[:, None] + torch.arange(length, device=device)[None, :])
        for length, starts in by_length.items()
    ]


def tower_packing(grid: Grid, config, device: torch.device | str) -> TowerPacking:
    """The packing of ``grid`` for a tower of ``config`` (its vision config), computed on the host by
    transformers' own helpers, then put on ``device``; usable by a forward in inference mode and by one
    that trains alike (made outside inference mode, however it is called)."""
    with torch.inference_mode(False):
        return _tower_packing(grid, config, torch.device(device))


def _tower_packing(grid: Grid, config, device: torch.device) -> TowerPacking:
    from transformers import vision_utils

    host_grid = torch.tensor(grid, dtype=torch.int64)
    merge = config.spatial_merge_size
    position_ids = vision_utils.get_vision_position_ids(host_grid, merge)
    cu_seqlens = vision_utils.get_vision_cu_seqlens(host_grid)
    window_index, cu_window_seqlens = vision_utils.get_vision_window_index(
        host_grid, spatial_merge_size=merge, window_size=config.window_size, patch_size=config.patch_size
    )
    full, windows = cu_seqlens.tolist(), cu_window_seqlens.tolist()  # host tensors: no sync
    packing = TowerPacking(
        grid=grid,
        position_ids=_to_device(position_ids, device),
        window_index=_to_device(window_index, device),
        cu_seqlens=_to_device(cu_seqlens, device),
        cu_window_seqlens=_to_device(cu_window_seqlens, device),
        max_seqlen=max(b - a for a, b in zip(full[:-1], full[1:], strict=True)),
        max_window_seqlen=max(b - a for a, b in zip(windows[:-1], windows[1:], strict=True)),
    )
    for host, placed in ((cu_seqlens, packing.cu_seqlens), (cu_window_seqlens, packing.cu_window_seqlens)):
        groups = [(length, _to_device(index, device)) for length, index in window_groups(host, host.device)]
        setattr(placed, WINDOW_GROUPS, groups)  # the batched windows' groups (vision_attention.py)
    return packing


def grid_of(grid_thw: torch.Tensor) -> Grid:
    """The grid as plain numbers (one host read where ``grid_thw`` lives on a device)."""
    return tuple(tuple(int(v) for v in row) for row in grid_thw.tolist())


def _inject_packing(tower: torch.nn.Module, args: tuple, kwargs: dict):
    hidden = args[0] if args else kwargs.get("hidden_states")
    grid_thw = args[1] if len(args) > 1 else kwargs.get("grid_thw")
    if hidden is None or grid_thw is None or any(kwargs.get(key) is not None for key in PACKING_KEYS):
        return None  # a caller that passes its own packing keeps it
    grid = grid_of(grid_thw)
    cache: OrderedDict = tower._keyshot_packings
    key = (grid, hidden.device)
    packing = cache.get(key)
    if packing is None:
        packing = cache[key] = tower_packing(grid, tower.config, hidden.device)
        while len(cache) > CACHED_GRIDS:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return args, {**kwargs, **packing.kwargs()}


def _takes_packing() -> str | None:
    """Why this transformers' tower would not take a precomputed packing, or None."""
    try:
        from transformers import vision_utils
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen
    except ImportError as exc:
        return f"no transformers.vision_utils ({exc})"
    helpers = ("get_vision_position_ids", "get_vision_attention_seqlens", "get_vision_window_index")
    missing = [h for h in helpers if not hasattr(vision_utils, h) or getattr(qwen, h, None) is None]
    if missing or not hasattr(qwen, "get_max_seqlen"):
        return f"the tower's forward no longer uses {', '.join(missing) or 'get_max_seqlen'}"
    return None


def use_grid_packing(model: torch.nn.Module) -> int:
    """Give every Qwen2.5-VL vision tower of ``model`` its packing from the grid before its forward (see the
    module's docstring); returns how many towers take it (those set up by an earlier call included). Says in a
    warning when a Qwen2.5-VL's forward no longer takes the packing (a transformers upgrade): then nothing is
    changed."""
    what = "tower packing from the grid"
    cls = qwen25_vl_class("Qwen2_5_VisionTransformerPretrainedModel")
    if cls is None:
        return nothing_patched(model, what, "transformers has no Qwen2_5_VisionTransformerPretrainedModel")
    if (why := _takes_packing()) is not None:
        return nothing_patched(model, what, why)
    towers = [m for m in model.modules() if isinstance(m, cls)]
    if not towers:
        return nothing_patched(model, what, "no Qwen2_5_VisionTransformerPretrainedModel module")
    for tower in towers:
        if "_keyshot_packings" not in tower.__dict__:
            tower._keyshot_packings = OrderedDict()
            tower.register_forward_pre_hook(_inject_packing, with_kwargs=True)
    return len(towers)
