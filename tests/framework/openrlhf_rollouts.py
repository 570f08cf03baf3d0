"""keyshot's OpenRLHF adapters driven through OpenRLHF 0.11.2's own released code, in the OpenRLHF venv
(tools/setup_openrlhf.sh). tests/test_reward_openrlhf.py and bench/bench_reward.py run it and read the JSON
it prints last::

    python tests/framework/openrlhf_rollouts.py --tiny DIR --job '{"mode": "single", "reward": "FILE.py", ...}'
    python tests/framework/openrlhf_rollouts.py --tiny DIR < jobs.jsonl     # one job per line, one answer each

OpenRLHF's own code does everything it does in a trainer: the executor (``SingleTurnAgentExecutor`` loading
the reward file by path or posting to the URLs; the agent file's ``AgentExecutor`` loaded by the engine
module's ``_load_agent_executor``), the rollout actor's ``generate_responses`` / ``generate`` (the class under
``RolloutRayActor``, called without Ray), its VLM utilities on the tiny Qwen2.5-VL processor, and the samples
generator's ``_process_response_into_experience`` with ``Experience.concat_experiences``; vLLM's
``SamplingParams`` and ``RequestOutput`` are vLLM's. What stands in: the vLLM engine itself (it needs a GPU
build): :class:`FixedActionEngine` answers every request with one action's token ids.
"""

import argparse
import asyncio
import glob
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ACTION = "click('next')"


class FixedActionEngine:
    """vLLM ``AsyncLLM.generate`` as OpenRLHF's rollout actor calls it: one RequestOutput per request, the
    same action each time (cut at the request's ``max_tokens``, finish reason "length" then)."""

    def __init__(self, tokenizer, action: str = ACTION):
        self.tokenizer = tokenizer
        self.ids = tokenizer(action, add_special_tokens=False)["input_ids"]
        self.requests: list[dict] = []

    async def generate(self, prompt, sampling_params, request_id):
        from vllm.outputs import CompletionOutput, RequestOutput

        images = (prompt.get("multi_modal_data") or {}).get("image") or []
        ids = self.ids[: max(sampling_params.max_tokens or len(self.ids), 0)]
        finish = "stop" if len(ids) == len(self.ids) else "length"
        self.requests.append(
            {
                "tokens": len(prompt["prompt_token_ids"]),
                "images": len(images),
                "max_tokens": sampling_params.max_tokens,
                "finish": finish,
            }
        )
        await asyncio.sleep(0)
        completion = CompletionOutput(
            index=0,
            text=self.tokenizer.decode(ids),
            token_ids=ids,
            cumulative_logprob=None,
            logprobs=None,
            finish_reason=finish,
        )
        yield RequestOutput(
            request_id=request_id,
            prompt=None,
            prompt_token_ids=list(prompt["prompt_token_ids"]),
            prompt_logprobs=None,
            outputs=[completion],
            finished=True,
        )


def tiny_processor(folder: str):
    """The tiny Qwen2.5-VL's processor (built into ``folder`` on first use), as OpenRLHF's hf_tokenizer."""
    from transformers import AutoProcessor

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    if not (Path(folder) / "preprocessor_config.json").exists():
        build_tiny_qwen25vl(folder)
    return AutoProcessor.from_pretrained(folder)


def rollout_actor(executor, engine, processor):
    """OpenRLHF's rollout actor class without Ray and without its vLLM engine (``llm`` is the stand-in)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    actor_cls = RolloutRayActor.__ray_metadata__.modified_class
    actor = actor_cls.__new__(actor_cls)
    actor.executor, actor.llm = executor, engine
    actor._mm_pad_token_ids = {processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")}
    return actor


async def generate(actor, processor, prompts: list[str], labels: list[str], samples: int, max_length: int):
    """``generate_responses`` for every prompt at once, as the samples generator dispatches them."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1)
    per_prompt = await asyncio.gather(
        *(
            actor.generate_responses(
                prompt=prompt,
                label=label,
                sampling_params=params,
                max_length=max_length,
                hf_tokenizer=processor,
                num_samples=samples,
                images=None,
            )
            for prompt, label in zip(prompts, labels, strict=True)
        )
    )
    return [response for responses in per_prompt for response in responses]


def experiences_summary(responses: list[dict], processor, max_length: int) -> dict:
    """What OpenRLHF's samples generator makes of the responses: one Experience each, concatenated as the
    experience maker does, and the per-sample info means the actor logs."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    generator = SamplesGenerator.__new__(SamplesGenerator)
    experiences = [generator._process_response_into_experience(r, max_len=max_length) for r in responses]
    batch = Experience.concat_experiences(experiences, processor.tokenizer.pad_token_id)
    info = {k: v.float().flatten().tolist() for k, v in batch.info.items() if isinstance(v, torch.Tensor)}
    return {
        "rewards": batch.rewards.float().flatten().tolist(),
        "scores": batch.scores.float().flatten().tolist(),
        "info": info,
        "info_means": {k: float(torch.tensor(v).mean()) for k, v in info.items()},
        "truncated": batch.truncated.flatten().tolist(),
    }


def image_rows(response: dict) -> int:
    """Images the policy was shown in a response (rows of image_grid_thw in its multimodal inputs)."""
    mm = response.get("mm_train_inputs") or {}
    grid = mm.get("image_grid_thw")
    return 0 if grid is None else int(grid.shape[0])


RESULT = "keyshot-openrlhf-result "  # the prefix of a job's answer line (OpenRLHF logs to stdout too)


def run_job(job: dict, processor) -> dict:
    """One rollout batch through OpenRLHF: ``job`` names the mode ("single": ``reward``, a file or
    comma-separated URLs; "agent": ``agent_file``), ``labels``, ``samples``, ``max_length``, and the
    ``config`` and temporary folder the reward uses."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from keyshot.reward.shared import CONFIG_ENV, reset_shared, shared_batcher, shared_model

    os.environ[CONFIG_ENV] = job["config"]
    tempfile.tempdir = job.get("tmp") or None
    max_length = job.get("max_length", 8192)
    engine = FixedActionEngine(processor.tokenizer)
    if job["mode"] == "single":
        reward = job["reward"]
        executor = SingleTurnAgentExecutor(reward if reward.endswith(".py") else reward.split(","))
    else:
        executor = _load_agent_executor(job["agent_file"])
    # "text_policy": OpenRLHF's text-only path (a tokenizer, no image processor), so that a clock measures the
    # reward's side and not the policy's image processing; "warm": the process-wide model built before the
    # clock starts, as it is in a trainer's process after its first batch.
    policy = processor.tokenizer if job.get("text_policy") else processor
    if job.get("warm"):
        shared_model()
    actor = rollout_actor(executor, engine, processor)
    labels = job["labels"]
    prompts = [f"<|im_start|>user\nTask {i}<|im_end|>\n<|im_start|>assistant\n" for i in range(len(labels))]
    t0 = time.perf_counter()
    try:
        responses = asyncio.run(generate(actor, policy, prompts, labels, job.get("samples", 1), max_length))
        seconds = time.perf_counter() - t0
        rounds = shared_batcher().batches  # the rounds of calls the rollouts' rewards shared
    finally:
        reset_shared()  # each job's model (and its loop thread) ends with the job
    return {
        "executor": f"{type(executor).__module__}.{type(executor).__qualname__}",
        "executor_bases": [f"{b.__module__}.{b.__qualname__}" for b in type(executor).__mro__[1:3]],
        "seconds": seconds,
        "reward_rounds": rounds,
        "responses": len(responses),
        "raw_rewards": [
            r["reward"].tolist() if hasattr(r["reward"], "tolist") else r["reward"] for r in responses
        ],
        "images_shown": [image_rows(r) for r in responses],
        "steps": [len(r["action_ranges"]) for r in responses],
        "engine_requests": engine.requests,
        "episode_folders_left": len(glob.glob(os.path.join(tempfile.gettempdir(), "keyshot-episode-*"))),
        **experiences_summary(responses, processor, max_length),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", required=True, help="folder of the tiny Qwen2.5-VL (built there if missing)")
    ap.add_argument("--job", help="one job as JSON (see run_job); without it, one job per line of stdin")
    args = ap.parse_args()
    processor = tiny_processor(args.tiny)
    jobs = [args.job] if args.job else sys.stdin
    for line in jobs:
        if not line.strip():
            continue
        try:
            out = run_job(json.loads(line), processor)
        except Exception:  # noqa: BLE001 - the test reads the failure and the runner takes the next job
            out = {"error": traceback.format_exc()}
        print(RESULT + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip Ray's and vLLM's exit hooks (seconds of waiting): this process started neither
