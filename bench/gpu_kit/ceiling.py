"""The practical ceiling: bf16 products at the language model's shapes."""

from __future__ import annotations

import time

import torch

from bench.gpu_kit.kit import Kit, model_config


# ----------------------------------------------------------------------------- the practical ceiling
def gemm_ceiling(kit: Kit, tokens: int, reps: int = 10) -> dict:
    """bf16 matrix products at the language model's shapes (``tokens`` rows: one micro-batch), forward and
    both backward forms, each timed after a warm-up: the rate the device reaches on this model's own
    products, the practical ceiling for its forward and backward (the data sheet's peak is not)."""
    text = model_config(kit).get_text_config()
    d, ffn = text.hidden_size, text.intermediate_size
    head_dim = getattr(text, "head_dim", None) or d // text.num_attention_heads
    kv = text.num_key_value_heads * head_dim
    shapes = {"q/o projection": (d, d), "k, v projection": (d, kv), "gate, up": (d, ffn), "down": (ffn, d)}
    weight = {"q/o projection": 2, "k, v projection": 2, "gate, up": 2, "down": 1}  # products per layer
    rows, flops_total, seconds_total = [], 0.0, 0.0
    for name, (k, n) in shapes.items():
        x = torch.randn(tokens, k, device=kit.device, dtype=kit.dtype)
        w = torch.randn(k, n, device=kit.device, dtype=kit.dtype)
        dy = torch.randn(tokens, n, device=kit.device, dtype=kit.dtype)
        products = {
            "forward": lambda x=x, w=w: x @ w,
            "input grad": lambda dy=dy, w=w: dy @ w.T,
            "weight grad": lambda x=x, dy=dy: x.T @ dy,
        }
        for form, run in products.items():
            run()
            kit.sync()
            t0 = time.perf_counter()
            for _ in range(reps):
                run()
            kit.sync()
            seconds = (time.perf_counter() - t0) / reps
            flops = 2.0 * tokens * k * n
            rows.append(
                {"shape": name, "form": form, "m_k_n": [tokens, k, n], "tflops_per_s": flops / seconds / 1e12}
            )
            flops_total += weight[name] * flops
            seconds_total += weight[name] * seconds
    return {"tokens": tokens, "rows": rows, "tflops_per_s": flops_total / seconds_total / 1e12}
