"""keyshot's OpenRLHF adapters driven through OpenRLHF 0.11.2's own released code, in the OpenRLHF venv
(tools/setup_openrlhf.sh). tests/reward/test_openrlhf.py and bench/reward.py run it and read the JSON
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

What a job also reports about the rollouts' ends (:class:`Ends`): how many times each agent's ``close``
ran, the browser processes (MiniWoB workers and Chromium) seen while the rollouts ran and those still
running after, keyshot's warnings, and an exception the rollouts raised or their cancellation.
"""

import argparse
import asyncio
import glob
import json
import logging
import logging.handlers
import os
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import psutil

ACTION = "click('next')"


class FixedActionEngine:
    """vLLM ``AsyncLLM.generate`` as OpenRLHF's rollout actor calls it: one RequestOutput per request, the
    same action each time (cut at the request's ``max_tokens``, finish reason "length" then)."""

    def __init__(self, tokenizer, ends: "Ends", action: str = ACTION):
        self.tokenizer = tokenizer
        self.ends = ends
        self.ids = tokenizer(action, add_special_tokens=False)["input_ids"]
        self.requests: list[dict] = []
        self.arrived = asyncio.Condition()

    async def generate(self, prompt, sampling_params, request_id):
        from vllm.outputs import CompletionOutput, RequestOutput

        images = (prompt.get("multi_modal_data") or {}).get("image") or []
        ids = self.ids[: max(sampling_params.max_tokens or len(self.ids), 0)]
        finish = "stop" if len(ids) == len(self.ids) else "length"
        self.ends.see_browsers()  # the rollouts' environments are open while the policy thinks
        async with self.arrived:
            self.requests.append(
                {
                    "tokens": len(prompt["prompt_token_ids"]),
                    "images": len(images),
                    "max_tokens": sampling_params.max_tokens,
                    "finish": finish,
                }
            )
            self.arrived.notify_all()
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

    async def requests_reached(self, n: int) -> None:
        """Return once ``n`` requests have arrived."""
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.requests) >= n)


class Ends:
    """How a job's rollouts ended: each agent's ``close`` calls (counted on the agent file's own class,
    which the original method still runs), the browser processes below this one seen while the rollouts
    ran, and keyshot's warnings."""

    def __init__(self, watch_browsers: bool = False):
        self.watch_browsers = watch_browsers  # a look at the process tree at every policy request
        # the agents themselves, kept to the end: counted by id() alone, an agent of an earlier batch
        # freed by then could lend its id to one of the next, whose one close would then count as the
        # earlier's second (closes [2, 2, 2, 2] where each agent was closed once)
        self.started: list = []
        self.closed: Counter = Counter()
        self.browsers: dict[int, float] = {}  # pid -> create time (a reused pid is another process)
        self.log = logging.handlers.BufferingHandler(capacity=1_000_000)
        self.log.setLevel(logging.WARNING)

    def watch(self, cls) -> None:
        """Count ``start`` and ``close`` of the agent file's AgentInstance."""
        start, close = cls.start, cls.close

        async def counted_start(agent, label):
            self.started.append(agent)
            return await start(agent, label)

        async def counted_close(agent):
            self.closed[id(agent)] += 1
            await close(agent)

        cls.start, cls.close = counted_start, counted_close

    def see_browsers(self) -> None:
        if not self.watch_browsers:
            return
        for child in psutil.Process().children(recursive=True):
            try:
                command = " ".join(child.cmdline())
                if "worker.py" in command or "chrom" in command:
                    self.browsers[child.pid] = child.create_time()
            except psutil.Error:  # gone between the listing and the look
                continue

    def left(self) -> list[int]:
        """The browser processes seen that still run (a zombie has ended)."""
        running = []
        for pid, created in self.browsers.items():
            try:
                child = psutil.Process(pid)
                if child.create_time() == created and child.status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
            except psutil.Error:
                continue
        return running

    def __enter__(self) -> "Ends":
        logging.getLogger("keyshot").addHandler(self.log)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("keyshot").removeHandler(self.log)

    def report(self) -> dict:
        return {
            "closes": [self.closed[id(agent)] for agent in self.started],
            "closed_unstarted": sum(
                n for agent, n in self.closed.items() if agent not in {id(a) for a in self.started}
            ),
            "browsers_seen": len(self.browsers),
            "browsers_left": self.left(),
            "warnings": [record.getMessage() for record in self.log.buffer],
        }


class Busy:
    """``threads`` threads spinning (pure Python, so each takes the GIL in turn with the rollouts'
    threads) at a switch interval of 0.1 ms, while the block runs."""

    def __init__(self, threads: int):
        self.threads, self.stop = threads, threading.Event()
        self.spinning: list[threading.Thread] = []

    def _spin(self) -> None:
        while not self.stop.is_set():
            sum(range(1000))

    def __enter__(self) -> "Busy":
        if self.threads:
            self.interval = sys.getswitchinterval()
            sys.setswitchinterval(1e-4)
            self.spinning = [threading.Thread(target=self._spin, daemon=True) for _ in range(self.threads)]
            for thread in self.spinning:
                thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.spinning:
            thread.join()
        if self.threads:
            sys.setswitchinterval(self.interval)


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


async def generate(
    actor,
    processor,
    prompts: list[str],
    labels: list[str],
    samples: int,
    max_length: int,
    cancel_after: int | None = None,
) -> list[dict] | None:
    """``generate_responses`` for every prompt at once, as the samples generator dispatches them; with
    ``cancel_after``, the whole batch is cancelled once the engine has had that many requests (None)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1)
    work = asyncio.ensure_future(
        asyncio.gather(
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
    )
    if cancel_after is not None:
        reached = asyncio.ensure_future(actor.llm.requests_reached(cancel_after))
        await asyncio.wait({work, reached}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            work.cancel()
            try:
                await work
            except asyncio.CancelledError:
                return None
    per_prompt = await work
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
    ``config`` and temporary folder the reward uses. ``expect_error``: the rollouts raise (reported as
    ``raised``); ``cancel_after``: the batch is cancelled once the engine has had that many requests;
    ``watch_browsers``: the browser processes below this one are looked for at every policy request;
    ``rounds``: the batch is run that many times, one after the other, by the same executor (which is
    closed after the last); ``busy_threads``: that many threads spin in this process while the batches
    run, with a short switch interval, so that the rollouts' threads and event loop are interrupted
    at many more points (load)."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from keyshot.reward.shared import CONFIG_ENV, reset_shared, shared_batcher, shared_model

    os.environ[CONFIG_ENV] = job["config"]
    tempfile.tempdir = job.get("tmp") or None
    max_length = job.get("max_length", 8192)
    ends = Ends(job.get("watch_browsers", False))
    engine = FixedActionEngine(processor.tokenizer, ends)
    if job["mode"] == "single":
        reward = job["reward"]
        executor = SingleTurnAgentExecutor(reward if reward.endswith(".py") else reward.split(","))
    else:
        executor = _load_agent_executor(job["agent_file"])
        ends.watch(executor.agent_instance_cls)
    # "text_policy": OpenRLHF's text-only path (a tokenizer, no image processor), so that a clock measures the
    # reward's side and not the policy's image processing; "warm": the process-wide model built before the
    # clock starts, as it is in a trainer's process after its first batch.
    policy = processor.tokenizer if job.get("text_policy") else processor
    if job.get("warm"):
        shared_model()
    actor = rollout_actor(executor, engine, processor)
    labels = job["labels"]
    prompts = [f"<|im_start|>user\nTask {i}<|im_end|>\n<|im_start|>assistant\n" for i in range(len(labels))]
    samples = job.get("samples", 1)
    raised = None
    t0 = time.perf_counter()
    busy = Busy(job.get("busy_threads", 0))
    try:
        with ends, busy:
            try:
                responses = []
                for _ in range(job.get("rounds", 1)):  # batches one after the other, one executor
                    batch = asyncio.run(
                        generate(actor, policy, prompts, labels, samples, max_length, job.get("cancel_after"))
                    )
                    responses = None if batch is None else responses + batch
            except Exception as exc:  # noqa: BLE001 - reported: the test says whether it was expected
                if not job.get("expect_error"):
                    raise
                responses, raised = None, f"{type(exc).__name__}: {exc}"
        seconds = time.perf_counter() - t0
        rounds = shared_batcher().batches  # the rounds of calls the rollouts' rewards shared
        pool = getattr(executor, "pool", None)  # the agent file's browser pool, where it has one
        opened = None if pool is None else pool.launched  # Chromium processes the pool started
        # after the batches: every session given back once, none still leased or holding a page's place
        pages = None if pool is None else [pool.given_back, pool.leased, sum(pool.pages().values())]
    finally:
        if callable(getattr(executor, "close", None)):  # keyshot's executor: what it holds (a browser pool)
            executor.close()
        reset_shared()  # each job's model (and its loop thread) ends with the job
    out = {
        "executor": f"{type(executor).__module__}.{type(executor).__qualname__}",
        "executor_bases": [f"{b.__module__}.{b.__qualname__}" for b in type(executor).__mro__[1:3]],
        "seconds": seconds,
        "reward_rounds": rounds,
        "engine_requests": engine.requests,
        "episode_folders_left": len(glob.glob(os.path.join(tempfile.gettempdir(), "keyshot-episode-*"))),
        "cancelled": responses is None and raised is None,
        "browsers_opened": opened,
        "pages_given_back_leased_placed": pages,
        "raised": raised,
        **ends.report(),
    }
    if responses is None:
        return out
    return {
        **out,
        "responses": len(responses),
        "raw_rewards": [
            r["reward"].tolist() if hasattr(r["reward"], "tolist") else r["reward"] for r in responses
        ],
        "images_shown": [image_rows(r) for r in responses],
        "steps": [len(r["action_ranges"]) for r in responses],
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
