"""keyshot's verl reward (frameworks/verl/reward.py).

In .venv: ``compute_score`` called as verl's reward manager calls it (one call per sample, concurrently).
In the verl venv (tools/setup_verl.sh; ``$KEYSHOT_VERL_PYTHON``, default .venv-verl): verl 0.9.1's own
released code, by tests/framework/verl_reward_loop.py: configs/reward/verl_trainer.yaml composed with verl's
ppo_trainer, its RewardLoopManager and Ray workers loading the file with get_custom_reward_fn, the scores
assembled into ``rm_scores``, and the trainer's validation metrics; with a healthy judge, a dead one, a
config verl cannot use, verl's reward router in front of a scorer that answers only its own name, verl's
remote reward manager (``compute_score_sync``), and an agent loop's episodes through verl's AgentLoopWorker,
scored as each rollout ends and after the batch (8 workers, one episode's folder gone),
with the fake judge counting the key-point calls (one per task).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.server
import importlib.util
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from keyshot.frameworks.verl import reward as verl_reward
from keyshot.frameworks.verl.reward import compute_score, compute_score_sync
from keyshot.frameworks.verl.state import VerlState
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.reward import logs as reward_logs
from keyshot.reward import shared as reward_shared
from keyshot.reward.episode import Episode
from tests.support import paths
from tests.support.frameworks import python_or_skip
from tests.support.reward import write_config

pytestmark = pytest.mark.usefixtures("no_shared_model")

REPO = paths.REPO
OM2W_V1 = sorted((paths.FIXTURES / "trajectories" / "online_mind2web_v1").iterdir())
SAMPLE_KEYS = {"score", *reward_logs.SAMPLE_KEYS}
DRIVER = REPO / "tests" / "framework" / "verl_reward_loop.py"
CONSTANT_WARNING = "every sample of a prompt is scored on the same rollout"


def documented_verl_commands() -> list[dict]:
    """docs/reward.md's ``python -m verl.trainer.main_ppo`` commands as Hydra compositions: the config they
    name (verl's own ppo_trainer when none) and their overrides, with this checkout for ``$PWD``;
    placeholders (``...``) left out."""
    text = (REPO / "docs" / "reward.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if "verl.trainer.main_ppo" not in command:
                continue
            command = command.replace("$PWD", str(REPO))
            words = shlex.split(command.split("verl.trainer.main_ppo", 1)[1])
            found = {"config_dir": None, "config_name": None, "overrides": []}
            while words:
                word = words.pop(0)
                if word in ("--config-path", "--config-name"):
                    found["config_dir" if word == "--config-path" else "config_name"] = words.pop(0)
                elif "=" in word and not word.endswith("=..."):
                    found["overrides"].append(word)
            commands.append(found)
    return commands


def copies(tmp_path: Path, per_prompt: int) -> list[tuple[int, str]]:
    """``(prompt index, folder)`` per sample: each sample's own trajectory folder, as an agent loop writes
    one per rollout (copies of the two fixture folders)."""
    out = []
    for prompt, folder in enumerate(OM2W_V1):
        for k in range(per_prompt):
            dest = tmp_path / "rollouts" / f"{folder.name}-{k}"
            shutil.copytree(folder, dest)
            out.append((prompt, str(dest)))
    return out


def loaded_by_path(name: str) -> ModuleType:
    """frameworks/verl/reward.py as verl loads ``custom_reward_function.path`` (``load_module``: a module object of its
    own, under a name of its own, not in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "frameworks" / "verl" / "reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_samples(
    config: Path,
    samples: list[tuple[int, str]],
    router: str | None = None,
    functions: tuple = (compute_score,),
) -> list[dict]:
    """One compute_score per sample, concurrently, as verl's reward-loop worker runs them (sample i through
    ``functions[i % len(functions)]``)."""

    async def batch():
        return await asyncio.gather(
            *(
                functions[i % len(functions)](
                    data_source="om2w",
                    solution_str=f"done {i}",
                    ground_truth=None,
                    extra_info={"trajectory": path, "index": prompt},
                    reward_router_address=router,
                    reward_model_tokenizer=None,
                    keyshot_config=str(config),
                )
                for i, (prompt, path) in enumerate(samples)
            )
        )

    return asyncio.run(batch())


def test_every_sample_gets_the_same_numeric_keys_and_the_router_is_asked_for_its_model(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    served = "/checkpoints/webjudge-7b/final"
    with (
        FakeOpenAI(make_judge()) as judge,
        FakeOpenAI(make_judge()) as scorer,
        FakeOpenAI(make_judge(), model=served, strict_model=True) as router,
    ):
        config = write_config(
            tmp_path / "verl.yaml", judge.base_url, scorer.base_url, timeout_s=5, on_failure="zero"
        )
        samples = copies(tmp_path, 2)
        # half the samples through two more copies of the file, loaded by path as verl loads it
        functions = (
            compute_score,
            loaded_by_path("custom_a").compute_score,
            loaded_by_path("custom_b").compute_score,
        )
        routed = run_samples(config, samples, router=f"127.0.0.1:{router.port}", functions=functions)
        assert all(set(r) == SAMPLE_KEYS and all(isinstance(v, float) for v in r.values()) for r in routed)
        assert [r["keyshot_failed"] for r in routed] == [0.0] * 4
        assert {r["score"] for r in routed} <= {0.0, 1.0}
        chats = [r for r in router.requests if "messages" in r]
        assert chats and {r["model"] for r in chats} == {served}  # the name the router serves
        assert len(router.request_headers) - len(chats) == 1  # /v1/models: once, whichever copy asked
        assert router.stats.responder_errors == 0
        assert not scorer.requests and "key_screenshot" not in {identify_step(r) for r in judge.requests}
    assert CONSTANT_WARNING not in caplog.text  # each sample scored its own folder


def test_a_router_listing_no_model_is_refused_and_one_not_answering_is_a_counted_failure(tmp_path):
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as router:  # lists no model
        config = write_config(
            tmp_path / "verl.yaml", judge.base_url, judge.base_url, timeout_s=5, on_failure="zero"
        )
        with pytest.raises(verl_reward.RouterModelError, match="lists 0 models"):
            run_samples(config, copies(tmp_path, 1)[:1], router=f"127.0.0.1:{router.port}")
        down = run_samples(config, copies(tmp_path / "down", 1)[:1], router="127.0.0.1:9")
    assert (down[0]["score"], down[0]["keyshot_failed"]) == (0.0, 1.0)  # a router that does not answer


class GatedRouter:
    """A router whose ``/v1/models`` answers only once ``release`` is set (a slow one), counting the asks."""

    def __init__(self, model: str):
        self.model, self.asked, self.release = model, 0, threading.Event()
        gate = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (stdlib name)
                gate.asked += 1
                gate.release.wait()
                body = json.dumps(
                    {"object": "list", "data": [{"id": gate.model, "object": "model"}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> GatedRouter:
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_slow_router_holds_up_only_its_own_samples_and_each_router_is_asked_once():
    with GatedRouter("slow-scorer") as slow, FakeOpenAI(make_judge(), model="fast-scorer") as fast:

        async def resolve() -> None:
            state = VerlState("test")
            waiting = [asyncio.ensure_future(state.served_model(slow.address)) for _ in range(4)]
            fast_names = await asyncio.gather(
                *(state.served_model(f"127.0.0.1:{fast.port}") for _ in range(4))
            )
            assert fast_names == ["fast-scorer"] * 4 and not any(w.done() for w in waiting)
            slow.release.set()
            assert await asyncio.gather(*waiting) == ["slow-scorer"] * 4
            assert await state.served_model(f"http://{slow.address}/v1") == "slow-scorer"  # remembered

        asyncio.run(resolve())
        assert slow.asked == 1 and len(fast.request_headers) == 1


def test_a_dataset_column_rollout_warns_once_and_a_dead_judge_is_a_counted_zero(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with FakeOpenAI(make_judge()) as judge:
        config = write_config(
            tmp_path / "verl.yaml", judge.base_url, judge.base_url, timeout_s=5, on_failure="zero"
        )
        column = [(p, str(folder)) for p, folder in enumerate(OM2W_V1) for _ in range(3)]
        results = run_samples(config, column)
    assert caplog.text.count(CONSTANT_WARNING) == 1 and "record an Episode per rollout" in caplog.text
    assert [r["score"] for r in results[:3]] == [results[0]["score"]] * 3
    dead = write_config(
        tmp_path / "dead.yaml",
        "http://127.0.0.1:9/v1",
        "http://127.0.0.1:9/v1",
        timeout_s=5,
        on_failure="zero",
    )
    failed = run_samples(dead, copies(tmp_path, 1))
    assert [(r["score"], r["keyshot_failed"]) for r in failed] == [(0.0, 1.0), (0.0, 1.0)]
    assert all(set(r) == SAMPLE_KEYS for r in failed)
    unreadable = asyncio.run(compute_score("om2w", "x", None, extra_info={}, keyshot_config=str(dead)))
    assert unreadable["score"] == 0.0 and unreadable["keyshot_failed"] == 1.0
    assert "extra_info holds neither" in caplog.text


def test_compute_score_sync_scores_on_the_shared_model_from_any_thread(tmp_path):
    """verl's remote manager calls the function from threads of Ray actors; it must not be a coroutine
    function, and its samples meet in the same model (key points once per task)."""
    assert not inspect.iscoroutinefunction(compute_score_sync)
    with FakeOpenAI(make_judge()) as judge:
        config = write_config(
            tmp_path / "verl.yaml", judge.base_url, judge.base_url, timeout_s=5, on_failure="zero"
        )

        def one(sample: tuple[int, str]) -> dict:
            extra_info = {"trajectory": sample[1], "index": sample[0]}
            return compute_score_sync("om2w", "done", None, extra_info, keyshot_config=str(config))

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(one, copies(tmp_path, 2)))
        assert [r["keyshot_failed"] for r in results] == [0.0] * 4
        assert [identify_step(r) for r in judge.requests].count("key_points") == 2


def test_a_rollout_not_readable_on_the_worker_is_a_counted_failure_naming_the_fix(tmp_path, caplog):
    """verl's reward workers run on any node, an Episode's files on the node that recorded it: a sample
    whose files are not here gets no verdict and no call, counted, never a crash."""
    caplog.set_level(logging.WARNING)
    shot = next((OM2W_V1[0] / "trajectory").iterdir())
    elsewhere = Episode("find the price")  # unfinished: the reward writes its trajectory file
    elsewhere.add_step(shot, action="click")
    shutil.rmtree(elsewhere.root)
    with FakeOpenAI(make_judge()) as judge:
        config = write_config(
            tmp_path / "verl.yaml", judge.base_url, judge.base_url, timeout_s=5, on_failure="zero"
        )

        async def both():
            return await asyncio.gather(
                compute_score("om2w", "done", None, {"episode": elsewhere}, keyshot_config=str(config)),
                compute_score(
                    "om2w", "done", None, {"trajectory": str(tmp_path / "gone")}, keyshot_config=str(config)
                ),
            )

        results = asyncio.run(both())
        assert not judge.requests
    assert [(r["score"], r["keyshot_failed"]) for r in results] == [(0.0, 1.0), (0.0, 1.0)]
    assert (
        caplog.text.count("is not readable on this reward worker") == 2
        and "Episode(keep_dir=DIR)" in caplog.text
    )


def test_a_config_without_on_failure_zero_is_refused_at_the_first_call(tmp_path):
    config = write_config(
        tmp_path / "verl.yaml", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", timeout_s=5, on_failure=None
    )
    with pytest.raises(reward_shared.RewardConfigError, match="reward.on_failure: zero"):
        run_samples(config, copies(tmp_path, 1)[:1])


# ------------------------------------------------------------------ verl's own code, in the verl venv
def replays(per_task: int, elsewhere: tuple[int, ...] = ()) -> list[dict]:
    """Agent-loop rows: ``per_task`` rollouts of each fixture task (the driver's agent loop records an
    Episode replaying the folder); the rows at ``elsewhere`` have their episode's folder removed before the
    reward reads it (recorded on another node)."""
    rows = [
        {"index": p, "replay": str(folder), "answer": "the price is found"}
        for p, folder in enumerate(OM2W_V1)
        for _ in range(per_task)
    ]
    for i in elsewhere:
        rows[i]["elsewhere"] = True
    return rows


def dark_then_bright(tmp: Path) -> Path:
    """A trajectory whose first page is dark and the two after its actions bright: the fake judge (key point
    k at the k-th screenshot scored >= 3, by brightness) meets its two key points at screenshots 1 and 2."""
    from PIL import Image

    from keyshot.infer.loaders.jsonl import write_jsonl
    from keyshot.infer.loaders.trajectory import Screenshot, Trajectory

    folder = tmp / "dark-then-bright"
    folder.mkdir()
    shots = []
    for i, level in enumerate((0, 255, 255)):
        Image.new("RGB", (320, 200), (level,) * 3).save(folder / f"step_{i}.png")
        shots.append(Screenshot(path=folder / f"step_{i}.png", index=i))
    task = "Find the page number 7 and open its settings"
    trajectory = Trajectory(
        task_id="dark-then-bright",
        task=task,
        actions=["click('1')", "click('2')"],
        screenshots=shots,
        agent="a",
    )
    write_jsonl([trajectory], folder / "trajectory.jsonl")
    return folder / "trajectory.jsonl"


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory):
    """One Ray session of verl's reward loop over its cases (tests/framework/verl_reward_loop.py): verl's
    batch, its agent loops scored as each rollout ends and after the batch (8 reward workers), its remote
    reward manager. A case whose judge calls are counted has its own fake judge."""
    python = python_or_skip("verl")
    tmp = tmp_path_factory.mktemp("verl")
    served = str(tmp / "tokenizer")  # the reward model's path: what verl's vLLM would serve it as
    counted = ("column", "stream", "after", "remote")
    with contextlib.ExitStack() as servers:
        judges = {name: servers.enter_context(FakeOpenAI(make_judge())) for name in (*counted, "steps")}
        scorer = servers.enter_context(FakeOpenAI(make_judge()))
        upstream = servers.enter_context(FakeOpenAI(make_judge(), model=served, strict_model=True))
        router = {"upstream": upstream.base_url.removesuffix("/v1")}

        def healthy(name: str, scorer_url: str = scorer.base_url) -> str:  # its workers share a cache file
            path = write_config(
                tmp / f"{name}.yaml", judges[name].base_url, scorer_url, timeout_s=5, on_failure="zero"
            )
            path.write_text(path.read_text() + f"cache: {tmp / name}-calls.sqlite\n")
            return str(path)

        dead = write_config(
            tmp / "dead.yaml",
            "http://127.0.0.1:9/v1",
            "http://127.0.0.1:9/v1",
            timeout_s=5,
            on_failure="zero",
        )
        unset = write_config(
            tmp / "none.yaml", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", timeout_s=5, on_failure=None
        )
        own = [{"index": p, "trajectory": t, "answer": "the price is found"} for p, t in copies(tmp, 2)]
        column = [
            {"index": p, "trajectory": str(f), "answer": "done"}
            for p, f in enumerate(OM2W_V1)
            for _ in range(4)
        ]
        stock_naive = ["reward.reward_manager.source=register", "reward.reward_manager.name=naive"]
        stepped = healthy("steps")
        with_steps = yaml.safe_load(Path(stepped).read_text())
        with_steps["pipeline"]["step_rewards"] = True
        Path(stepped).write_text(yaml.safe_dump(with_steps))
        spec = {
            "compose": documented_verl_commands(),
            "workdir": str(tmp),
            "reward_file": str(REPO / "frameworks" / "verl" / "reward.py"),
            "cases": [
                {
                    "name": "column",
                    "keyshot_config": healthy("column"),
                    "samples": column,
                    "overrides": stock_naive,
                },
                {"name": "dead", "keyshot_config": str(dead), "samples": own},
                {  # KeyshotStepRewardManager after the batch: r_t at the last token of each agent turn
                    "name": "steps",
                    "keyshot_config": stepped,
                    "samples": [
                        {"index": 0, "replay": str(dark_then_bright(tmp)), "answer": "done", "turns": True}
                    ]
                    * 2,
                    "path": "after",
                    "router": router,
                    "overrides": [
                        "reward.reward_manager.source=importlib",
                        "reward.reward_manager.name=KeyshotStepRewardManager",
                        f"reward.reward_manager.module.path={REPO / 'frameworks' / 'verl' / 'reward.py'}",
                    ],
                },
                {"name": "unset", "keyshot_config": str(unset), "samples": own[:1]},
                {
                    "name": "remote",
                    "keyshot_config": healthy("remote"),
                    "samples": own,
                    "overrides": [
                        "reward.reward_manager.name=KeyshotRemoteRewardManager",
                        "reward.custom_reward_function.name=compute_score_sync",
                    ],
                },
                {
                    "name": "stream",
                    "keyshot_config": healthy("stream"),
                    "samples": replays(2),
                    "path": "stream",
                },
                {  # configs/reward/verl_trainer.yaml as it is: its reward file, manager and 8 reward workers,
                    # verl's router in front of the scorer; the configured scorer is down (a sample scored
                    # there would fail)
                    "name": "after",
                    "keyshot_config": healthy("after", scorer_url="http://127.0.0.1:9/v1"),
                    "samples": replays(4, elsewhere=(2,)),
                    "path": "after",
                    "router": router,
                    "reward_file": None,
                    "overrides": ["reward.num_workers=8"],
                },
            ],
        }
        (tmp / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}
        proc = subprocess.run(
            [python, str(DRIVER), str(tmp / "spec.json")],
            capture_output=True,
            text=True,
            env=env,
            timeout=900,
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("VERL_RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
        results = json.loads(lines[-1].removeprefix("VERL_RESULT "))
        yield {
            "results": results,
            "log": proc.stdout + proc.stderr,
            "judge": {name: [identify_step(r) for r in judge.requests] for name, judge in judges.items()},
            "upstream": [r.get("model") for r in upstream.requests if "messages" in r],
            "upstream_errors": upstream.stats.responder_errors,
            "served": served,
        }


@pytest.mark.slow
def test_verls_reward_loop_turns_keyshot_scores_into_its_tensors_and_metrics(verl_run):
    column = verl_run["results"]["column"]
    assert "error" not in column, column
    scores = column["rm_scores"]
    assert len(scores) == 8 and set(scores) <= {0.0, 1.0} and column["rm_scores_dtype"] == "torch.float32"
    assert scores[:4] == [scores[0]] * 4 and scores[4:] == [scores[4]] * 4  # one rollout per prompt
    assert set(column["extra_keys"]) == SAMPLE_KEYS
    assert column["extra"]["score"] == scores and column["extra"]["keyshot_failed"] == [0.0] * 8
    assert all(dtype == "float64" for dtype in column["extra_dtypes"].values())
    metrics = column["metrics"]
    assert metrics["val-core/om2w/reward/mean@4"] == pytest.approx(sum(scores) / 8)
    assert metrics["val-aux/om2w/keyshot_failed/mean@4"] == 0.0
    assert verl_run["judge"]["column"].count("key_points") == 2  # once per task, for 8 samples
    assert verl_run["log"].count(CONSTANT_WARNING) == 1 and "record an Episode per rollout" in verl_run["log"]


@pytest.mark.slow
def test_the_step_manager_puts_each_steps_reward_at_the_last_token_of_its_agent_turn(verl_run):
    """Two actions, two key points met at screenshots 1 and 2: r = (0, 0.5, 0.5) per screenshot, the first
    page's and the first action's on the first turn's last token (0), the second action's on the second's
    (2), nothing on the final answer's (4); a row sums to the episode's progress (GRPO's reward)."""
    steps = verl_run["results"]["steps"]
    assert "error" not in steps, steps
    assert steps["rm_nonzero"] == [[[0, 0.5], [2, 0.5]]] * 2
    assert steps["rm_scores"] == steps["extra"]["keyshot_progress"] == steps["extra"]["score"] == [1.0, 1.0]
    assert steps["extra"]["keyshot_credited_steps"] == [2.0, 2.0] and set(steps["extra_keys"]) == SAMPLE_KEYS
    assert steps["extra"]["keyshot_first_credited_step"] == [1.0, 1.0]


@pytest.mark.slow
def test_verls_reward_loop_with_a_dead_judge_and_a_config_verl_cannot_use(verl_run):
    dead = verl_run["results"]["dead"]
    assert "error" not in dead, dead
    assert dead["rm_scores"] == [0.0] * 4 and dead["extra"]["keyshot_failed"] == [1.0] * 4
    assert dead["metrics"]["val-aux/om2w/keyshot_failed/mean@2"] == 1.0
    unset = verl_run["results"]["unset"]
    assert "reward.on_failure: zero" in unset["error"]


@pytest.mark.slow
def test_verls_reward_router_gets_the_scorer_requests_under_the_name_it_serves(verl_run):
    routed = verl_run["results"]["after"]
    assert "error" not in routed, routed
    assert sum(routed["extra"]["keyshot_failed"]) == 1.0 and set(routed["rm_scores"]) <= {0.0, 1.0}
    assert verl_run["upstream"] and set(verl_run["upstream"]) == {verl_run["served"]}
    assert verl_run["upstream_errors"] == 0


@pytest.mark.slow
def test_verls_remote_reward_manager_runs_compute_score_sync(verl_run):
    remote = verl_run["results"]["remote"]  # verl's RemoteRewardManager asserts a synchronous function
    assert "error" not in remote, remote
    assert remote["extra"]["keyshot_failed"] == [0.0] * 4 and set(remote["extra_keys"]) == SAMPLE_KEYS
    assert remote["extra"]["score"] == remote["rm_scores"] and set(remote["rm_scores"]) <= {0.0, 1.0}
    assert verl_run["judge"]["remote"].count("key_points") == 2


@pytest.mark.slow
def test_an_agent_loops_episodes_reach_the_reward_as_each_rollout_ends(verl_run):
    stream = verl_run["results"]["stream"]  # verl's AgentLoopWorker calling the reward worker
    assert "error" not in stream, stream
    assert stream["extra"]["keyshot_failed"] == [0.0] * 4 and set(stream["extra_keys"]) == SAMPLE_KEYS
    assert stream["extra"]["score"] == stream["rm_scores"] and set(stream["rm_scores"]) <= {0.0, 1.0}
    assert verl_run["judge"]["stream"].count("key_points") == 2
    assert stream["episodes_left"] == []  # each episode's temporary folder removed once scored


@pytest.mark.slow
def test_after_the_batch_8_reward_workers_ask_key_points_once_per_task_and_an_unreadable_episode_counts(
    verl_run,
):
    after = verl_run["results"]["after"]  # configs/reward/verl_trainer.yaml as shipped (pkg://, the manager)
    assert "error" not in after, after
    failed = [0.0] * 8
    failed[2] = 1.0  # its episode's folder is not on the reward worker's machine
    assert after["extra"]["keyshot_failed"] == failed and after["rm_scores"][2] == 0.0
    assert after["extra"]["keyshot_judge_calls"][2] == 0.0  # nothing paid for it
    assert after["metrics"]["val-aux/om2w/keyshot_failed/mean@4"] == pytest.approx(1 / 8)
    assert verl_run["judge"]["after"].count("key_points") == 2  # 8 workers, one call per task
    assert "is not readable on this reward worker" in verl_run["log"] and "keep_dir" in verl_run["log"]
    assert after["episodes_left"] == []


@pytest.mark.slow
def test_the_documented_verl_commands_compose_with_verls_own_config(verl_run):
    commands = verl_run["results"]["compose"]
    assert len(commands) == 2, "docs/reward.md: one verl command in its section, one in the cluster examples"
    for composed in commands:
        assert "error" not in composed, composed
        assert (
            composed["path"] == "pkg://keyshot.frameworks.verl.reward" and composed["name"] == "compute_score"
        )
        assert composed["manager"] == {
            "source": "importlib",
            "name": "KeyshotRewardManager",
            "path": "pkg://keyshot.frameworks.verl.reward",
        }
        assert composed["reward_kwargs"] == {"keyshot_config": str(REPO / "configs" / "reward" / "verl.yaml")}
        assert composed["enable"] is True and composed["model_path"] and composed["rollout"] == "vllm"


def test_the_documented_verl_snippet_runs_here(tmp_path):
    """docs/reward.md's "Here" snippet, as written, against a fake judge (its config in place of local.yaml)."""
    text = (REPO / "docs" / "reward.md").read_text()
    snippet = re.search(r"# verl: compute_score.*?<<'PY'\n(.*?)\nPY\n", text, re.S).group(1)
    with FakeOpenAI(make_judge()) as judge:
        config = write_config(
            tmp_path / "local.yaml", judge.base_url, judge.base_url, timeout_s=5, on_failure="zero"
        )
        env = {**os.environ, reward_shared.CONFIG_ENV: str(config)}
        done = subprocess.run(
            [sys.executable, "-c", snippet], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("'keyshot_failed': 0.0") == 2 and "'score': 1.0" in done.stdout
