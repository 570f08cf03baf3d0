"""The vision tower alone: its variants (batched windows, padded MLP, packing from the grid, CUDA graphs)
at a batch of 1280x720 screenshots."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from bench.gpu_kit.kit import Kit, forward_counts, model_config, screenshots

logger = logging.getLogger("bench.gpu")


# ----------------------------------------------------------------------------- the vision tower
def vision_bench(kit: Kit, batch_sizes: list[int], reps: int) -> dict:
    """The vision tower alone at the shape's size: transformers' per-window loop, then keyshot's changes one
    by one (batched windows, the patch embedding, the padded MLPs, the packing from the grid that leaves
    no host sync in the forward; on CUDA the varlen windows, torch.compile per block and CUDA graphs per
    grid), screenshots/s at each batch of 1280×720 screenshots, the share of the peak (the tower's FLOPs:
    its blocks per patch with their attention, the merger once per merged token: ``forward_counts``), and
    how far each output is from transformers'."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    from keyshot.infer.model.vision_attention import (
        use_batched_window_attention,
        use_linear_patch_embed,
        use_padded_vision_mlp,
    )
    from keyshot.infer.model.vision_packing import grid_of, use_grid_packing

    torch.manual_seed(0)
    config = model_config(kit).vision_config
    with torch.device(kit.device):
        tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(
            config, dtype=kit.dtype, attn_implementation="sdpa"
        ).eval()
    images = [img.pil() for img in screenshots(max(batch_sizes))]
    inputs = kit.processor.image_processor(images=images, return_tensors="pt")
    pixels = inputs["pixel_values"].to(kit.device, kit.dtype)
    host_grid = inputs["image_grid_thw"]  # the processor's: on the host
    grids = {"in use": host_grid.to(kit.device)}  # transformers' own forward reads a grid on the device
    patches_per_image = int(host_grid[0].prod())

    def run(n: int) -> torch.Tensor:
        rows = int(host_grid[:n].prod(dim=-1).sum())
        return tower(pixels[:rows], grid_thw=grids["in use"][:n])

    def unwrap(out):
        return out.pooler_output if hasattr(out, "pooler_output") else out

    def rate(n: int) -> float:
        with torch.inference_mode():
            run(n)  # warm-up
            kit.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                run(n)
            kit.sync()
        return n * reps / (time.perf_counter() - t0)

    result: dict = {"patches_per_image": patches_per_image, "rows": [], "variants": []}
    probe = min(2, max(batch_sizes))
    with torch.inference_mode():
        reference = unwrap(run(probe)).float()
    flops = dataclasses.replace(forward_counts(kit), llm_factor=0.0).batch_flops([0], [patches_per_image], 0)
    result["flops_per_screenshot"] = flops

    def measure(name: str) -> None:
        with torch.inference_mode():
            out = unwrap(run(probe)).float()
        rates = {n: rate(n) for n in batch_sizes}
        result["variants"].append(
            {
                "name": name,
                "max_abs_diff": float((out - reference).abs().max()),
                "rates": rates,
                "mfu": {n: r * flops / (kit.peak_tflops * 1e12) for n, r in rates.items()},
            }
        )

    measure("transformers' per-window loop")
    result["patched_layers"] = use_batched_window_attention(tower)
    measure("batched windows")
    use_linear_patch_embed(tower)
    measure("+ patch embedding as one matrix product")
    use_padded_vision_mlp(tower)
    measure("+ MLP padded to 128, gate and up in one product")
    use_grid_packing(tower)
    grids["in use"] = host_grid  # as the processor made it: the forward then reads nothing back
    measure("+ packing from the grid (no host sync in the forward)")
    # the speed switches of the tower (train/speedups.py: model.vision_attention, model.compile) and its CUDA
    # graphs (vision_graphs.py); CUDA only. A switch that fails is named in the result and the rows above stand.
    if kit.device.type == "cuda":
        from keyshot.infer.model.vision_graphs import use_tower_cuda_graphs
        from keyshot.infer.model.vision_varlen import use_varlen_vision_attention

        def compile_blocks() -> None:
            for block in tower.blocks:
                block.compile()

        def capture() -> None:
            use_tower_cuda_graphs(tower, [grid_of(host_grid[:n]) for n in {*batch_sizes, probe}])

        switches = {
            "+ windows through torch's variable-length attention (model.vision_attention=varlen)": lambda: (
                use_varlen_vision_attention(tower)
            ),
            "+ torch.compile per block (model.compile=inductor)": compile_blocks,
            "+ CUDA graphs per grid (use_tower_cuda_graphs)": capture,
        }
        for name, apply in switches.items():
            try:
                apply()
                measure(name)
            except Exception as exc:  # noqa: BLE001 (reported in the table's notes)
                logger.exception("vision variant %s failed", name)
                result.setdefault("failed", []).append(f"{name}: {type(exc).__name__}: {exc}"[:400])
                break
    result["ref_abs_max"] = float(reference.abs().max())
    if kit.device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(max(batch_sizes))
            kit.sync()
        result["profile"] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=18)
        logger.info("vision tower profile (last variant, batch %d):\n%s", max(batch_sizes), result["profile"])
    if kit.device.type == "cuda":
        result["peak_mem_gib"] = torch.cuda.max_memory_allocated(kit.device) / 2**30
    return result
