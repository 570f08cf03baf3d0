"""keyshot's compute_score through verl 0.9.1's own reward loop; run in the verl venv (tools/setup_verl.sh) by
tests/test_reward_verl.py and bench/bench_reward.py: ``python tests/framework/verl_reward_loop.py SPEC.json``.

For each case of the spec: configs/reward/verl_trainer.yaml composed with verl's ppo_trainer by Hydra,
verl's RewardLoopManager (its Ray reward-loop workers load the reward file with get_custom_reward_fn and
call compute_score once per sample, concurrently), ``compute_rm_score`` (``assemble_rm_scores``: the
scores become the ``rm_scores`` tensor), then the trainer's validation metrics over the extra keys
(``extract_reward``, ``RayPPOTrainer._val_metrics_update``). Only the reward model's vLLM servers are
stood in for: a case with ``router`` runs verl's own naive router in front of the given OpenAI server,
and RewardModelManager (which would start vLLM on GPUs) just reports that router's address.

The spec: ``{"workdir", "reward_file", "cases": [{"name", "keyshot_config", "samples": [{"trajectory",
"index", "answer"}], "router": null | {"upstream": URL}, "warmup": optional samples scored first,
as a trainer's earlier step, "reward_file": optional, else the spec's}], "compose": [{"config_dir", "config_name",
"overrides"}]}`` (``compose``: docs/reward.md's commands, composed by Hydra); the last stdout line is ``VERL_RESULT {...}``
with, per case, the rm_scores row sums, the extra keys, their values, the validation metrics, the
seconds in all and in ``compute_rm_score`` (``score_s``: the workers started, as in a trainer's step), or
the error verl raised.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import ray
import torch
import verl.experimental.reward_loop.reward_loop as reward_loop
from hydra import compose, initialize_config_dir, initialize_config_module
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
from verl import DataProto
from verl.experimental.reward_loop import RewardLoopManager
from verl.experimental.reward_loop.router.naive_router import launch_router_process
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.reward import extract_reward

REPO = Path(__file__).resolve().parents[2]
WORDS = ["done", "answer", "the", "price", "is", "found", "page", "open", "task"]


def tiny_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer saved as a Hugging Face folder (the policy's and the reward model's path)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    fast.save_pretrained(folder)
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


def trainer_config(tokenizer: Path, reward_file: str, keyshot_config: str, routed: bool):
    overrides = [
        f"actor_rollout_ref.model.path={tokenizer}",
        f"reward.custom_reward_function.path={reward_file}",
        f"reward.custom_reward_function.reward_kwargs.keyshot_config={keyshot_config}",
        f"reward.reward_model.enable={str(routed).lower()}",
        f"reward.reward_model.model_path={tokenizer}",
        "reward.num_workers=1",
    ]
    with initialize_config_dir(config_dir=str(REPO / "configs" / "reward"), version_base=None):
        return compose(config_name="verl_trainer", overrides=overrides)


def batch_of(samples: list[dict], tokenizer: PreTrainedTokenizerFast) -> DataProto:
    """What verl's rollout hands the reward loop: left-padded prompts, right-padded responses."""
    prompt_len, response_len = 4, 6
    prompts, responses, masks = [], [], []
    for sample in samples:
        ids = tokenizer(sample["answer"], add_special_tokens=False)["input_ids"][: response_len - 1]
        ids = [*ids, tokenizer.eos_token_id]
        responses.append(ids + [tokenizer.pad_token_id] * (response_len - len(ids)))
        prompts.append([tokenizer.convert_tokens_to_ids("task")] * prompt_len)
        masks.append([1] * prompt_len + [1] * len(ids) + [0] * (response_len - len(ids)))
    indexes = [s["index"] for s in samples]
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor(prompts),
            "responses": torch.tensor(responses),
            "attention_mask": torch.tensor(masks),
        },
        non_tensors={
            "data_source": np.array(["om2w"] * len(samples), dtype=object),
            "reward_model": np.array([{"ground_truth": None} for _ in samples], dtype=object),
            "extra_info": np.array(
                [{"trajectory": s["trajectory"], "index": s["index"]} for s in samples], dtype=object
            ),
            "uid": np.array([f"prompt-{i}" for i in indexes], dtype=object),
        },
    )


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


def run_case(case: dict, tokenizer_dir: Path, tokenizer, reward_file: str) -> dict:
    routed = case.get("router") is not None
    config = trainer_config(tokenizer_dir, reward_file, case["keyshot_config"], routed)
    router = None
    if routed:
        ServedRewardModel.address, router = launch_router_process(worker_urls=[case["router"]["upstream"]])
    data = batch_of(case["samples"], tokenizer)
    manager = None
    started = time.perf_counter()
    try:
        manager = RewardLoopManager(config)
        warm = manager.compute_rm_score(batch_of(case["warmup"], tokenizer)) if case.get("warmup") else None
        scoring = time.perf_counter()
        output = manager.compute_rm_score(data)
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
    function, model = cfg.reward.custom_reward_function, cfg.reward.reward_model
    return {
        "path": function.path,
        "name": function.name,
        "reward_kwargs": dict(function.get("reward_kwargs") or {}),
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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
    try:
        results = {
            c["name"]: run_case(c, tokenizer_dir, tokenizer, c.get("reward_file", spec["reward_file"]))
            for c in spec["cases"]
        }
    finally:
        ray.shutdown()
    print("VERL_RESULT " + json.dumps({**results, "compose": commands}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
