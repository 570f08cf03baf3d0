"""GRPO on web tasks with keyshot's WebJudge as the reward, in TRL's ``environment_factory`` form.

Modeled on TRL's ``examples/scripts/openenv/browsergym.py``: one environment per rollout whose tools
(click, fill, send_keys, scroll, noop) return the page's screenshot with its text (``keyshot.frameworks.trl.env``).
Every environment records its episode and ``keyshot.frameworks.trl.reward.environment_reward`` scores the whole
batch at once (key points once per task, all scorer calls in flight together).

On a cluster (a BrowserGym server through OpenEnv, a judge API and a served keyshot scorer; docs/reward.md)::

    python examples/reward/trl_browsergym_grpo.py --keyshot-config configs/reward/trl.yaml \\
        --space-url https://YOUR-BROWSERGYM-SERVER --task-name TASK --use-vllm

Here, on live MiniWoB pages in headless Chromium (``make setup-browser``) and no GPU, the tiny random
policy at the script's own batch (4 generations × 32 accumulation steps: 128 pages at once); MiniWoB's own
reward is logged beside keyshot's (``miniwob/reward``, ``miniwob/agreement``)::

    python examples/reward/trl_browsergym_grpo.py --keyshot-config configs/reward/local.yaml \\
        --miniwob click-button --tiny-model --train-steps 1

With no browser, recorded trajectories replayed stand in for the pages: ``--replay FOLDER``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from datetime import datetime
from pathlib import Path

from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.settings import SessionSettings
from keyshot.env.replay import ReplayBrowser
from keyshot.frameworks.trl.env import (
    BrowserGymWebEnv,
    MiniWoBEnv,
    ReplayEnv,
    miniwob_rows,
    prompt,
    with_miniwob_reward,
)
from keyshot.frameworks.trl.reward import environment_reward
from keyshot.infer.common.errors import KeyshotError
from keyshot.reward import shared_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GRPO on web tasks with keyshot's WebJudge as the reward.")
    p.add_argument("--keyshot-config", required=True, help="a keyshot judge config (configs/reward/trl.yaml)")
    p.add_argument(
        "--model-id", default="Qwen/Qwen3.5-2B", help="the policy (a VLM with a tool-calling template)"
    )
    p.add_argument("--tiny-model", action="store_true", help="the tiny random Qwen2.5-VL as the policy (CPU)")
    p.add_argument("--replay", help="a folder of recorded trajectories replayed instead of a browser")
    p.add_argument("--miniwob", help="live MiniWoB pages here: task names, comma-separated (rows are seeds)")
    p.add_argument("--max-pages", type=int, help="live pages this machine may hold (default: measured)")
    p.add_argument(
        "--space-url", default="https://openenv-browsergym-env.hf.space", help="OpenEnv BrowserGym server"
    )
    p.add_argument("--task-name", default="click-test", help="BrowserGym task name passed to reset()")
    p.add_argument("--dataset-prompt", default="Complete the web task successfully.")
    p.add_argument("--dataset-size", type=int, default=1000)
    p.add_argument("--keep-episodes", help="keep every episode there (keyshot judge reads it)")
    p.add_argument("--max-steps", type=int, default=SessionSettings.max_steps, help="actions per episode")
    p.add_argument("--max-completion-length", type=int, default=1024)
    p.add_argument("--max-tool-calling-iterations", type=int)
    p.add_argument("--image-size", type=int, default=512, help="resize screenshots for the policy; 0: keep")
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--per-device-train-batch-size", type=int)
    p.add_argument("--gradient-accumulation-steps", type=int, default=32)
    p.add_argument("--learning-rate", type=float, default=5e-6)
    p.add_argument("--num-epochs", type=int, default=1)
    p.add_argument("--train-steps", type=int, default=-1, help="stop after this many optimizer steps")
    p.add_argument("--output-dir")
    p.add_argument("--report-to", default="none")
    p.add_argument("--use-vllm", action="store_true", help="generate with vLLM")
    p.add_argument("--vllm-mode", choices=("colocate", "server"), default="colocate")
    p.add_argument("--vllm-server-url", default="http://localhost:8000")
    return p.parse_args(argv)


def tiny_policy(out: Path):
    """The tiny random Qwen2.5-VL with TRL's Qwen3-VL chat template (Qwen2.5-VL's renders no tool calls)."""
    from transformers import AutoProcessor
    from trl.chat_template_utils import qwen3_vl_chat_template

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    folder = build_tiny_qwen25vl(out)
    processor = AutoProcessor.from_pretrained(folder)
    processor.chat_template = qwen3_vl_chat_template
    return str(folder), processor


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    output_dir = Path(args.output_dir or f"outputs/keyshot-grpo-{datetime.now():%Y-%m-%d_%H-%M-%S}")
    config = GRPOConfig(
        output_dir=str(output_dir),
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        vllm_server_base_url=args.vllm_server_url if args.use_vllm and args.vllm_mode == "server" else None,
        num_train_epochs=args.num_epochs,
        max_steps=args.train_steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.per_device_train_batch_size or args.num_generations,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
        logging_steps=1,
        log_completions=True,
        report_to=args.report_to,
        use_cpu=args.tiny_model,
        save_strategy="no",
        chat_template_kwargs={"enable_thinking": False},
    )
    # TRL resets one environment per rollout of a generation batch before generating: that many live pages
    pages = config.per_device_train_batch_size * config.steps_per_generation
    settings = {"max_steps": args.max_steps, "image_size": args.image_size, "keep_dir": args.keep_episodes}
    pool = None
    if args.miniwob:  # a batch beyond what the machine holds stops here, before anything is opened
        budget = BrowserBudget.for_machine(args.max_pages)
        budget.require(
            pages,
            f"a generation batch of {pages} rollouts (per-device batch {config.per_device_train_batch_size} × "
            f"--gradient-accumulation-steps {config.steps_per_generation})",
            f"lower --num-generations or --gradient-accumulation-steps until their product is at most "
            f"{budget.max_pages}, or serve the pages from another machine (keyshot reward env --miniwob "
            f"{args.miniwob} there) and pass its URL as --space-url",
        )
    reward_model = shared_model(args.keyshot_config)  # built now so that a bad config stops here
    reward = environment_reward(args.keyshot_config)
    try:
        if args.replay:
            root = Path(args.replay)
            one = (root / "result.json").exists() or root.suffix == ".jsonl"
            folders = [root] if one else sorted(p for p in root.iterdir() if not p.name.startswith("."))
            rows = [{"trajectory": str(f), "prompt": prompt(ReplayBrowser(f).task)} for f in folders]
            env = functools.partial(ReplayEnv, **settings)
        elif args.miniwob:
            tasks = [t.strip() for t in args.miniwob.split(",") if t.strip()]
            pool = BrowserPool(budget, tasks[0], max_steps=args.max_steps)
            pool.warm(pages)  # Chromium launched while the policy loads
            rows, reward = miniwob_rows(tasks, args.dataset_size), with_miniwob_reward(reward)
            env = functools.partial(MiniWoBEnv, pool=pool, **settings)
        else:
            rows = [{"prompt": prompt(args.dataset_prompt)}] * args.dataset_size
            env = functools.partial(
                BrowserGymWebEnv, space_url=args.space_url, task_name=args.task_name, **settings
            )
        model, processor = (
            tiny_policy(output_dir / "tiny-policy") if args.tiny_model else (args.model_id, None)
        )
        trainer = GRPOTrainer(
            model=model,
            processing_class=processor,
            reward_funcs=[reward],
            train_dataset=Dataset.from_list(rows),
            args=config,
            environment_factory=env,
        )
        trainer.train()
    finally:
        if pool is not None:
            pool.close()
        reward_model.close()
    summary = {"steps": trainer.state.global_step, "log": trainer.state.log_history}
    if pool is not None:
        summary["pages"] = {"budget": budget.max_pages, "most_leased": pool.max_leased}
        summary["browsers"] = {
            "launched": pool.launched,
            "most_open": pool.max_browsers,
            "replaced": pool.replaced,
        }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
