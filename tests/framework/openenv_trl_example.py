"""TRL's own BrowserGym example (tests/fixtures/trl_browsergym/browsergym.py, the file as TRL ships it) run
unchanged against ``keyshot reward env``, with only what a CPU machine needs set from outside the file; run
in the OpenEnv venv over .venv's training stack (``.venv-openenv-trl``, tools/setup_openenv.sh) by
tests/env/test_trl_browsergym_example.py and bench/openenv_trl.py.

    python tests/framework/openenv_trl_example.py PLAN_JSON

PLAN: ``{"example": FILE, "policy": DIR, "args": [...], "config": {...}, "call": {...}, "out": FILE}``.
``policy`` is a folder the tiny random Qwen2.5-VL is built into (with TRL's Qwen3-VL chat template: the
same special tokens, and it renders tool calls); ``args`` the example's own command line (``--space-url``
and the rest); ``config`` the GRPOConfig fields set from outside the file (``per_device_train_batch_size``,
``max_steps``; always: on the CPU, no bf16, no trackio, nothing saved); ``call`` the tool call the policy
is made to make every turn (transformers' ``sequence_bias``). The trainer's log history is written to
``out`` (JSON), with the seconds each generation batch took.
"""

from __future__ import annotations

import json
import runpy
import sys
import time
from pathlib import Path


def build_policy(folder: Path):
    """The tiny random Qwen2.5-VL in ``folder``, its processor given TRL's Qwen3-VL chat template."""
    from transformers import AutoProcessor
    from trl.chat_template_utils import qwen3_vl_chat_template

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    if not (folder / "config.json").is_file():
        build_tiny_qwen25vl(folder)
    processor = AutoProcessor.from_pretrained(folder)
    processor.chat_template = qwen3_vl_chat_template
    processor.save_pretrained(folder)
    return processor


def always_calls(processor, call: dict) -> list:
    """``sequence_bias`` making the random policy answer every turn with ``call`` as its tool call."""
    tokenizer = processor.tokenizer
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    ids = tokenizer.encode(
        f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>", add_special_tokens=False
    )
    return [[header + ids[: i + 1], 100.0] for i in range(len(ids))]


def main() -> None:
    plan = json.loads(sys.argv[1])
    import trl

    processor = build_policy(Path(plan["policy"]))
    outside = {
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "generation_kwargs": {"sequence_bias": always_calls(processor, plan["call"])},
        **plan.get("config", {}),
    }
    example_config = trl.GRPOConfig

    def cpu_config(**fields):
        """The example's GRPOConfig with the CPU settings set over its own."""
        return example_config(**{**fields, **outside})

    history: dict = {"generation_s": []}

    class Trainer(trl.GRPOTrainer):
        """TRL's GRPOTrainer, timing each generation batch and keeping its log history."""

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                history["generation_s"].append(time.perf_counter() - start)

        def train(self, *args, **kwargs):
            try:
                return super().train(*args, **kwargs)
            finally:
                history["log_history"] = self.state.log_history
                history["global_step"] = self.state.global_step
                Path(plan["out"]).write_text(json.dumps(history, default=str))

    trl.GRPOConfig, trl.GRPOTrainer = cpu_config, Trainer
    sys.argv = [plan["example"], "--model-id", plan["policy"], *plan["args"]]
    runpy.run_path(plan["example"], run_name="__main__")


if __name__ == "__main__":
    main()
