"""The vision tower's packing read from its grid before the layers (keyshot.infer.model.vision_packing): a
forward reads nothing back from the device but the grid it is given, and gives transformers' output; the
tower's CUDA graphs refuse a CPU tower in one line (the graphs themselves, and the sync check with CUDA's own
sync debug mode, are the ``gpu`` tests)."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tests.support.tiny_model import pooled, vision_inputs

SIZES = [(1280, 720), (700, 2600), (160, 90)]  # full windows, edge windows, a full-attention image each


class HostReads(TorchFunctionMode):
    """Every read of a tensor's values on the host (what synchronises with a GPU): ``tolist``, ``item``,
    ``cpu``, ``numpy`` and Python's number conversions, with the tensor read."""

    METHODS = {
        torch.Tensor.tolist,
        torch.Tensor.item,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__index__,
        torch.Tensor.__float__,
    }

    def __init__(self):
        super().__init__()
        self.tensors: list[torch.Tensor] = []
        self.scalars = _ScalarReads()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.METHODS:
            self.tensors.append(args[0])
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.scalars.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        super().__exit__(*exc)
        return self.scalars.__exit__(*exc)


class _ScalarReads(TorchDispatchMode):
    """Scalars read inside torch's own operators (a tensor passed where a number is expected)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _model(tiny_model_dir, dtype=torch.float32, device="cpu"):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=dtype, attn_implementation="sdpa"
    ).to(device)


def test_a_tower_forward_reads_back_nothing_but_its_grid(tiny_model_dir):
    """Before, each layer read its windows' bounds back (``cu_seqlens.tolist()``, one sync per layer: 32 a
    forward at the 7B's depth) after transformers' own reads of the grid and the windows; now the forward
    reads the grid once (the key of its packing) and nothing it computed."""
    from keyshot.infer.model.vision_attention import use_fast_vision_tower

    reference, model = _model(tiny_model_dir), _model(tiny_model_dir)
    use_fast_vision_tower(model)
    pixels, grid = vision_inputs(tiny_model_dir, SIZES, max_pixels=200704)
    tower = model.model.visual
    with torch.no_grad():
        want = pooled(reference.model.visual(pixels, grid_thw=grid))
        pooled(tower(pixels, grid_thw=grid))  # the first forward of a grid computes its packing
        with HostReads() as reads:
            got = pooled(tower(pixels, grid_thw=grid))
    assert [t is grid for t in reads.tensors] == [True] and reads.scalars.count == 0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_packing_is_transformers_own_and_kept_per_grid(tiny_model_dir):
    from transformers import vision_utils

    from keyshot.infer.model.vision_packing import CACHED_GRIDS, tower_packing, use_grid_packing

    model = _model(tiny_model_dir)
    config = model.config.vision_config
    _, grid = vision_inputs(tiny_model_dir, SIZES, max_pixels=200704)
    packing = tower_packing(tuple(map(tuple, grid.tolist())), config, "cpu")
    window_index, cu_windows = vision_utils.get_vision_window_index(
        grid, config.spatial_merge_size, config.window_size, config.patch_size
    )
    assert torch.equal(packing.window_index, window_index) and torch.equal(
        packing.cu_window_seqlens, cu_windows
    )
    assert torch.equal(packing.cu_seqlens, vision_utils.get_vision_cu_seqlens(grid))
    lengths = (cu_windows[1:] - cu_windows[:-1]).tolist()
    assert packing.max_window_seqlen == max(lengths) and packing.max_seqlen == int(grid.prod(-1).max())
    assert use_grid_packing(model) == 1 == use_grid_packing(model)  # once: one hook, one cache
    tower = model.model.visual
    assert len(tower._forward_pre_hooks) == 1
    pixels, _ = vision_inputs(tiny_model_dir, [(160, 90)], max_pixels=200704)
    with torch.no_grad():
        for rows in range(1, CACHED_GRIDS + 3):  # more grids than kept: the oldest go
            tower(pixels[: 4 * rows], grid_thw=torch.tensor([[1, 2, 2 * rows]]))
    assert len(tower._keyshot_packings) == CACHED_GRIDS


def test_cuda_graphs_refuse_a_cpu_tower_in_one_line(tiny_model_dir):
    from keyshot.infer.model.vision_graphs import TowerGraphsUnavailable, use_tower_cuda_graphs

    with pytest.raises(
        TowerGraphsUnavailable, match=r"^CUDA graphs of the vision tower need a CUDA device"
    ) as caught:
        use_tower_cuda_graphs(_model(tiny_model_dir), [((1, 4, 4),)])
    assert "\n" not in str(caught.value)
    with pytest.raises(TowerGraphsUnavailable, match="holds 0 Qwen2.5-VL vision towers"):
        use_tower_cuda_graphs(torch.nn.Linear(2, 2), [((1, 4, 4),)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("varlen", [False, True])
def test_a_cuda_tower_forward_never_synchronises(tiny_model_dir, varlen):
    """CUDA's sync debug mode raises at any synchronising call: the tower's forward (batched windows, and
    torch's varlen kernel with max_seqlen from the grid) makes none, its grid held on the host."""
    from keyshot.infer.model.vision_attention import use_fast_vision_tower
    from keyshot.infer.model.vision_varlen import use_varlen_vision_attention

    reference = _model(tiny_model_dir, torch.bfloat16, "cuda")
    model = _model(tiny_model_dir, torch.bfloat16, "cuda")
    use_fast_vision_tower(model)
    if varlen:
        use_varlen_vision_attention(model)
    pixels, grid = vision_inputs(tiny_model_dir, SIZES, max_pixels=200704)
    pixels = pixels.to("cuda", torch.bfloat16)
    with torch.no_grad():
        want = pooled(reference.model.visual(pixels, grid_thw=grid.cuda()))
        pooled(model.model.visual(pixels, grid_thw=grid))  # the packing of this grid
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = pooled(model.model.visual(pixels, grid_thw=grid))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_of_the_tower_give_its_output(tiny_model_dir):
    from keyshot.infer.model.vision_attention import use_fast_vision_tower
    from keyshot.infer.model.vision_graphs import use_tower_cuda_graphs
    from keyshot.infer.model.vision_packing import grid_of

    model = _model(tiny_model_dir, torch.bfloat16, "cuda")
    use_fast_vision_tower(model)
    one, grid1 = vision_inputs(tiny_model_dir, SIZES[:1], max_pixels=200704)
    two, grid2 = vision_inputs(tiny_model_dir, SIZES[:1] * 2, max_pixels=200704)
    tower = model.model.visual
    with torch.no_grad():
        want1 = pooled(tower(one.to("cuda", torch.bfloat16), grid_thw=grid1)).clone()
        want2 = pooled(tower(two.to("cuda", torch.bfloat16), grid_thw=grid2)).clone()
    assert use_tower_cuda_graphs(model, [grid_of(grid1), grid_of(grid2)]) == 2
    assert use_tower_cuda_graphs(model, [grid_of(grid1)]) == 2  # again: nothing new
    replays = []
    for graph in tower._keyshot_graphs.values():
        original = graph.graph.replay
        graph.graph.replay = lambda original=original: (replays.append(1), original())[1]
    with torch.no_grad():
        got1 = pooled(tower(one.to("cuda", torch.bfloat16), grid_thw=grid1))
        got2 = pooled(tower(two.to("cuda", torch.bfloat16), grid_thw=grid2))
    assert len(replays) == 2
    torch.testing.assert_close(got1, want1, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(got2, want2, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_in_process_scorer_replays_its_tower_per_grid_and_answers_as_without(tiny_model_dir):
    """``scorer.tower_cuda_graphs``: the in-process scorer captures the grids it sees, up to the number set,
    and answers as it does without them."""
    from PIL import Image

    from keyshot.infer.judge.local_scorer import TransformersScorer
    from keyshot.infer.model.vision_graphs import captured_grids
    from keyshot.infer.protocol.images import prepare_image
    from keyshot.infer.protocol.prompts import load_prompt_set

    def scorer(graphs: int) -> TransformersScorer:
        return TransformersScorer(
            tiny_model_dir, load_prompt_set(), device="cuda", dtype="float32", max_new_tokens=8,
            batch_size=2, tower_cuda_graphs=graphs,
        )  # fmt: skip

    wide = prepare_image(Image.new("RGB", (1280, 720), "white"), scorer(0).image_policy)
    tall = prepare_image(Image.new("RGB", (720, 1280), "white"), scorer(0).image_policy)
    plain, graphed = scorer(0), scorer(2)
    for images in ([wide], [wide, wide], [tall], [wide]):
        assert [g.text for g in graphed.generate("a task", "1. a point", images)] == [
            g.text for g in plain.generate("a task", "1. a point", images)
        ]
    assert len(captured_grids(graphed.model)) == 2  # the third grid ([tall]) ran as before
