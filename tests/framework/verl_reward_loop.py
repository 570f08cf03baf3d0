"""keyshot's compute_score through verl 0.9.1's own reward loop; run in the verl venv (tools/setup_verl.sh) by
tests/reward/test_verl.py and bench/reward.py: ``python tests/framework/verl_reward_loop.py SPEC.json``.

For each case of the spec: configs/reward/verl_trainer.yaml composed with verl's ppo_trainer by Hydra (and
the case's own overrides: the reward manager, the function's name, the number of reward workers), verl's
RewardLoopManager (its Ray reward-loop workers load the reward file with get_custom_reward_fn and call
compute_score once per sample, concurrently), then the trainer's validation metrics over the extra keys
(``extract_reward``, ``RayPPOTrainer._val_metrics_update``). The samples reach the reward in one of verl's
three ways:

- ``batch`` (default): the batch as verl's rollout hands it over, scored by ``compute_rm_score``
  (``assemble_rm_scores``: the scores become the ``rm_scores`` tensor);
- ``stream``: verl's AgentLoopWorker runs an agent loop per sample (``generate_sequences``: the loop, its
  ``_agent_loop_postprocess``, the reward workers called as each rollout ends, ``_postprocess``), as the
  trainer does without a reward model or with one in its own resource pool;
- ``after``: the same agent loops, without reward workers (a reward model sharing the rollout's GPUs), then
  ``compute_rm_score`` over the post-processed batch, as the trainer scores after the batch.

The agent loop (``ReplayAgentLoop``) is a web agent as a user writes one, without the LLM: it records an
Episode of the pages it "saw" (a trajectory folder replayed) and puts it in its output's ``extra_fields``;
a sample marked ``elsewhere`` has its episode's folder removed before the reward reads it (an episode
recorded on a node the reward worker cannot see); a sample marked ``turns`` answers in turns, one policy
token and one environment token (response mask 0) per action it replayed, as many as the response holds.

Only the reward model's vLLM servers are stood in for: a case with ``router`` runs verl's own naive router
in front of the given OpenAI server, and RewardModelManager (which would start vLLM on GPUs) just reports
that router's address.

The spec: ``{"workdir", "reward_file", "cases": [{"name", "keyshot_config", "samples": [{"trajectory",
"index", "answer"} | {"replay": FOLDER, "index", "answer", "elsewhere": bool}], "router": null |
{"upstream": URL}, "path": "batch" | "stream" | "after", "overrides": [Hydra overrides], "warmup":
optional samples scored first, as a trainer's earlier step, "reward_file": optional, else the spec's; null:
the config's own}], "compose": [{"config_dir", "config_name", "overrides"}]}`` (``compose``: docs/reward.md's
commands, composed by Hydra); the last stdout line is ``VERL_RESULT {...}`` with, per case, the rm_scores row
sums, the extra keys, their values, the validation metrics, the seconds in all and in scoring (``score_s``:
the workers started, as in a trainer's step), the episodes' folders still on disk, each row's nonzero rm_scores as ``[position, value]``, or the error
verl raised.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from itertools import zip_longest
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
import verl.experimental.reward_loop.reward_loop as reward_loop
from hydra import compose, initialize_config_dir, initialize_config_module
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    AgentLoopWorker,
    register,
)
from verl.experimental.reward_loop import RewardLoopManager
from verl.experimental.reward_loop.router.naive_router import launch_router_process
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import extract_reward

from keyshot.infer.loaders import load_trajectory
from keyshot.reward.episode import Episode

REPO = Path(__file__).resolve().parents[2]
WORDS = ["done", "answer", "the", "price", "is", "found", "page", "open", "task"]
PROMPT_LEN, RESPONSE_LEN = 4, 6
AGENT = "keyshot_replay_agent"
#: every episode the agent loops recorded here, to see which folders the reward left behind
RECORDED: list[Episode] = []


def tiny_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer saved as a Hugging Face folder (the policy's and the reward model's path),
    with a one-layer model config beside it (verl's agent loop reads the policy's config)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)
    LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(folder)
    return folder


class ServedRewardModel:
    """Stands in for verl's RewardModelManager, which would start the reward model's vLLM servers and
    verl's router in front of them: here the router (verl's own) is in front of the test's OpenAI server."""

    address: str = ""

    def __init__(self, config, resource_pool=None):
        self.config = config

    def get_router_address(self) -> str:
        return self.address

    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass


@register(AGENT)
class ReplayAgentLoop(AgentLoopBase):
    """A web agent's loop as a user writes one, without the LLM: it records an Episode of the pages of its
    row's ``replay`` folder, answers the row's ``answer``, and leaves the episode in ``extra_fields``."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        row = kwargs["extra_info"]
        seen = load_trajectory(Path(row["replay"]))
        episode = Episode(seen.task, task_id=seen.task_id)
        for shot, action in zip_longest(seen.screenshots, seen.actions):
            episode.add_step(shot.path if shot is not None else None, action=action)
        episode.finish(row["answer"])
        RECORDED.append(episode)
        if row.get("elsewhere"):  # recorded on a node this reward worker cannot see
            shutil.rmtree(episode.root)
        response = self.tokenizer(row["answer"], add_special_tokens=False)["input_ids"][: RESPONSE_LEN - 1]
        response = [*response, self.tokenizer.eos_token_id]
        mask = [1] * len(response)
        if row.get("turns"):  # an action a turn: the policy's token, then the page's
            act, page = (
                self.tokenizer.convert_tokens_to_ids("open"),
                self.tokenizer.convert_tokens_to_ids("page"),
            )
            turns = min(len(seen.actions), (RESPONSE_LEN - 1) // 2)
            response = [*[act, page] * turns, self.tokenizer.eos_token_id]
            mask = [*[1, 0] * turns, 1]
        return AgentLoopOutput(
            prompt_ids=[self.tokenizer.convert_tokens_to_ids("task")] * PROMPT_LEN,
            response_ids=response,
            response_mask=mask,
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={"episode": episode},
        )


def trainer_config(tokenizer: Path, case: dict, reward_file: str | None):
    routed = case.get("router") is not None
    overrides = [
        f"actor_rollout_ref.model.path={tokenizer}",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.prompt_length={PROMPT_LEN}",
        f"actor_rollout_ref.rollout.response_length={RESPONSE_LEN}",
        f"reward.custom_reward_function.reward_kwargs.keyshot_config={case['keyshot_config']}",
        f"reward.reward_model.enable={str(routed).lower()}",
        f"reward.reward_model.model_path={tokenizer}",
        "reward.num_workers=1",
        *([f"reward.custom_reward_function.path={reward_file}"] if reward_file else []),
        *case.get("overrides", []),
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs" / "reward"), version_base=None):
        return compose(config_name="verl_trainer", overrides=overrides)


def batch_of(samples: list[dict], tokenizer: PreTrainedTokenizerFast) -> DataProto:
    """What verl's rollout hands the reward loop: left-padded prompts, right-padded responses."""
    prompts, responses, masks = [], [], []
    for sample in samples:
        ids = tokenizer(sample["answer"], add_special_tokens=False)["input_ids"][: RESPONSE_LEN - 1]
        ids = [*ids, tokenizer.eos_token_id]
        responses.append(ids + [tokenizer.pad_token_id] * (RESPONSE_LEN - len(ids)))
        prompts.append([tokenizer.convert_tokens_to_ids("task")] * PROMPT_LEN)
        masks.append([1] * PROMPT_LEN + [1] * len(ids) + [0] * (RESPONSE_LEN - len(ids)))
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(responses),
            "attention_mask": torch.tensor(masks),
        },
        non_tensors=dataset_columns(samples),
    )


def dataset_columns(samples: list[dict]) -> dict[str, np.ndarray]:
    """The dataset's columns of each sample (``extra_info``: what the row carries; ``uid``: its prompt)."""

    def objects(values: list) -> np.ndarray:
        column = np.empty(len(values), dtype=object)
        column[:] = values
        return column

    return {
        "data_source": objects(["om2w"] * len(samples)),
        "reward_model": objects([{"ground_truth": None} for _ in samples]),
        "extra_info": objects([dict(s) for s in samples]),
        "uid": objects([f"prompt-{s['index']}" for s in samples]),
        "index": np.array([s["index"] for s in samples]),
        "raw_prompt": objects([[{"role": "user", "content": "task"}] for _ in samples]),
        "agent_name": objects([AGENT] * len(samples)),
    }


def validation_metrics(output: DataProto, data: DataProto) -> dict[str, float]:
    """The trainer's validation metrics of one batch, as ``RayPPOTrainer._validate`` collects them."""
    reward_tensor, extra = extract_reward(output)
    infos: dict[str, list] = {"reward": reward_tensor.sum(-1).cpu().tolist()}
    for key, values in extra.items():
        infos[key] = values.tolist() if isinstance(values, np.ndarray) else list(values)
    metrics = RayPPOTrainer._val_metrics_update(
        None, data.non_tensor_batch["data_source"], list(data.non_tensor_batch["uid"]), infos, []
    )
    return {k: float(v) for k, v in metrics.items()}


def scored(case: dict, config, manager: RewardLoopManager, data: DataProto) -> DataProto:
    """The batch's rewards the way the case's path gets them (see the module docstring)."""
    path = case.get("path", "batch")
    if path == "batch":
        return manager.compute_rm_score(data)
    prompts = DataProto(
        non_tensor_batch=data.non_tensor_batch, meta_info={"validate": False, "global_steps": 1}
    )
    # verl hands the agent loops its reward workers only when it scores as the rollouts end
    agents = AgentLoopWorker(
        config, llm_client=None, reward_loop_worker_handles=manager.reward_loop_worker_handles
    )
    if (manager.reward_loop_worker_handles is not None) != (path == "stream"):
        raise ValueError(
            f"case {case['name']}: path {path} does not match the config's reward model settings"
        )
    output = asyncio.run(agents.generate_sequences(prompts))
    return output if path == "stream" else manager.compute_rm_score(output)


def run_case(case: dict, tokenizer_dir: Path, tokenizer, reward_file: str | None) -> dict:
    config = trainer_config(tokenizer_dir, case, reward_file)
    router = None
    if case.get("router") is not None:
        ServedRewardModel.address, router = launch_router_process(worker_urls=[case["router"]["upstream"]])
    data = batch_of(case["samples"], tokenizer)
    manager = None
    recorded = len(RECORDED)
    started = time.perf_counter()
    try:
        manager = RewardLoopManager(config)
        warm = manager.compute_rm_score(batch_of(case["warmup"], tokenizer)) if case.get("warmup") else None
        scoring = time.perf_counter()
        output = scored(case, config, manager, data)
        score_s = time.perf_counter() - scoring
    except Exception as exc:  # what verl raises is the case's answer
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - started}
    finally:
        for worker in manager.reward_loop_workers if manager else []:
            ray.kill(worker)
        if router is not None:
            router.terminate()
            router.join(10)
    seconds = time.perf_counter() - started
    keys = output.meta_info["reward_extra_keys"]
    return {
        "seconds": seconds,
        "score_s": score_s,
        "rm_scores": output.batch["rm_scores"].sum(-1).tolist(),
        "rm_scores_dtype": str(output.batch["rm_scores"].dtype),
        "extra_keys": keys,
        "extra": {k: output.non_tensor_batch[k].tolist() for k in keys},
        "extra_dtypes": {k: str(output.non_tensor_batch[k].dtype) for k in keys},
        "metrics": validation_metrics(output, data),
        "warmup_judge_calls": float(sum(warm.non_tensor_batch["keyshot_judge_calls"])) if warm else 0.0,
        "episodes_left": [str(e.root) for e in RECORDED[recorded:] if e.root.exists()],
        "rm_nonzero": [
            [[p, v] for p, v in enumerate(row) if v] for row in output.batch["rm_scores"].tolist()
        ],
    }


def composed(command: dict) -> dict:
    """A documented command's Hydra overrides composed on its config (verl's own ppo_trainer when it names
    no config folder): the reward keys verl reads, or the error Hydra gives."""
    try:
        if command.get("config_dir"):
            with initialize_config_dir(config_dir=command["config_dir"], version_base=None):
                cfg = compose(config_name=command["config_name"], overrides=command["overrides"])
        else:
            with initialize_config_module(config_module="verl.trainer.config", version_base=None):
                cfg = compose(config_name="ppo_trainer", overrides=command["overrides"])
    except Exception as exc:  # the command's answer
        return {"error": f"{type(exc).__name__}: {exc}"}
    function, model, manager = (
        cfg.reward.custom_reward_function,
        cfg.reward.reward_model,
        cfg.reward.reward_manager,
    )
    return {
        "path": function.path,
        "name": function.name,
        "reward_kwargs": dict(function.get("reward_kwargs") or {}),
        "manager": {"source": manager.source, "name": manager.name, "path": manager.module.path},
        "enable": model.enable,
        "model_path": model.model_path,
        "rollout": model.rollout.name,
    }


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    workdir = Path(spec["workdir"])
    commands = [composed(c) for c in spec.get("compose", [])]
    tokenizer_dir = tiny_tokenizer(workdir / "tokenizer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    reward_loop.RewardModelManager = ServedRewardModel
    # a cluster of its own (never one the machine already runs, which ray.init() without an address joins):
    # its own temp folder, and ports Ray picks free
    ray_temp = tempfile.mkdtemp(prefix="ksray-verl-", dir="/tmp")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True, _temp_dir=ray_temp)
    try:
        results = {
            c["name"]: run_case(c, tokenizer_dir, tokenizer, c.get("reward_file", spec["reward_file"]))
            for c in spec["cases"]
        }
    finally:
        ray.shutdown()
        shutil.rmtree(ray_temp, ignore_errors=True)
    print("VERL_RESULT " + json.dumps({**results, "compose": commands}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
