"""keyshot's reward inside OpenRLHF 0.11.2's own released code.

Each slow test runs tests/framework/openrlhf_rollouts.py in the OpenRLHF venv (``make setup-openrlhf``;
``$KEYSHOT_OPENRLHF_PYTHON``), where OpenRLHF's executors load keyshot's files by path, its rollout actor
calls them, its VLM utilities load the images, and its samples generator turns every response into the
tensors a trainer builds (only the vLLM engine is a stand-in answering a fixed action). The fake judge and
scorer and ``keyshot reward serve`` run here; what reaches OpenRLHF is checked against one process scoring
the same folders. Every way an agent's episode ends (done, the token budget, an exception, the batch
cancelled) is checked to close its environment once; on the budget path with live MiniWoB pages, no
browser process of the episodes is left.
"""

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from keyshot.frameworks.openrlhf.reward import UNFINISHED_KEY
from keyshot.infer.testing import frameworks
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, identify_step, make_judge
from keyshot.infer.testing.launch import OutputLines, start_reward_serve
from keyshot.reward import shared as reward_shared
from keyshot.reward.logs import SAMPLE_KEYS
from keyshot.reward.model import RewardModel
from tests.support import paths
from tests.support import reward as support
from tests.support.frameworks import python_or_skip

REPO = paths.REPO
DRIVER = REPO / "tests" / "framework" / "openrlhf_rollouts.py"
RESULT = "keyshot-openrlhf-result "  # the driver's answer lines
OM2W_V1 = support.OM2W_V1
REWARD_FILE = REPO / "frameworks" / "openrlhf" / "reward.py"
AGENT_FILE = REPO / "examples" / "reward" / "openrlhf_agent.py"
REPLAY_AGENT_FILE = REPO / "tests" / "framework" / "openrlhf_replay_agent.py"
slow = pytest.mark.slow  # every test that runs the OpenRLHF driver


class OpenRLHFRunner:
    """The driver in the OpenRLHF venv, started once for the module: one job per line, one answer each."""

    def __init__(self, folder: Path, python: str):
        self.stderr = (folder / "stderr.log").open("w")
        self.proc = subprocess.Popen(
            [python, str(DRIVER), "--tiny", str(folder / "tiny")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=REPO,
        )
        self.answers = OutputLines(self.proc, "the OpenRLHF driver")

    def run(self, tmp_path: Path, config: Path, **job) -> dict:
        tmp = tmp_path / "tmp"
        tmp.mkdir(exist_ok=True)
        self.proc.stdin.write(json.dumps({**job, "config": str(config), "tmp": str(tmp)}) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.answers.wait_for(RESULT, 300)
        except RuntimeError as exc:
            self.stderr.flush()
            pytest.fail(f"{exc}; its stderr: {Path(self.stderr.name).read_text()[-4000:]}")
        out = json.loads(line[len(RESULT) :])
        assert "error" not in out, out["error"]
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def openrlhf(tmp_path_factory):
    runner = OpenRLHFRunner(tmp_path_factory.mktemp("openrlhf"), python_or_skip("openrlhf"))
    yield runner
    runner.close()


#: the configs here (``servers``: tests/conftest.py): OpenRLHF needs a number for every sample
write_config = functools.partial(support.write_config, timeout_s=5, on_failure="zero")


def calls(judge: FakeOpenAI, scorer: FakeOpenAI) -> dict[str, int]:
    steps = [identify_step(r) for r in judge.requests]
    return {
        "key_points": steps.count("key_points"),
        "outcome": steps.count("outcome"),
        "scorer": len(scorer.requests),
    }


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> tuple[list[float], dict[str, int]]:
    """The two folders scored once by one RewardModel here: their rewards and the calls it paid."""
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        rm = RewardModel.from_config(write_config(tmp_path_factory.mktemp("ref") / "r.yaml", judge, scorer))
        try:
            results = rm.score_sync([str(f) for f in OM2W_V1])
        finally:
            rm.close()
        return [r.reward for r in results], calls(judge, scorer)


def check_tensors(out: dict, n: int, extra: tuple[str, ...] = ()) -> None:
    """Every sample became numbers in OpenRLHF's Experience: rewards, scores and each log field."""
    assert out["responses"] == n and len(out["rewards"]) == n and len(out["scores"]) == n
    for key in (*SAMPLE_KEYS, *extra):
        assert len(out["info"][key]) == n, key
        assert out["info_means"][key] == pytest.approx(sum(out["info"][key]) / n)


# ---------------------------------------------------------------------------- the reward-function file
LABELS = [str(f) for f in OM2W_V1]


@slow
def test_single_turn_executor_loads_the_reward_file_by_path(tmp_path, servers, openrlhf, one_process):
    import yaml

    reward_file = REWARD_FILE
    config = write_config(tmp_path / "reward.yaml", *servers)
    cfg = yaml.safe_load(config.read_text())  # the rewards per step asked too: the verdicts stay the same
    cfg["pipeline"]["step_rewards"] = True
    config.write_text(yaml.safe_dump(cfg))
    out = openrlhf.run(tmp_path, config, mode="single", reward=str(reward_file), labels=LABELS)
    assert out["executor"] == "openrlhf.utils.agent.SingleTurnAgentExecutor"
    check_tensors(out, 2)
    assert out["rewards"] == one_process[0] and out["info"]["keyshot_failed"] == [0.0, 0.0]
    assert out["info"]["reward"] == out["rewards"]
    # the steps in OpenRLHF's extra_logs, as the numbers it takes (each one tensor of one value)
    assert out["info"]["keyshot_has_credited_steps"] == [1.0, 1.0] and out["info"][
        "keyshot_has_progress"
    ] == [1.0, 1.0]
    assert all(n >= 1.0 for n in out["info"]["keyshot_credited_steps"])


@slow
def test_per_sample_threads_pay_what_one_process_pays(tmp_path, servers, openrlhf, one_process):
    """64 samples of 2 tasks (32 copies of each folder), one reward_func call per sample on OpenRLHF's
    threads, cost the judge and the scorer what scoring the two folders once costs."""
    config = write_config(tmp_path / "reward.yaml", *servers)
    out = openrlhf.run(tmp_path, config, mode="single", reward=str(REWARD_FILE), labels=LABELS, samples=32)
    check_tensors(out, 64)
    assert out["rewards"] == [one_process[0][0]] * 32 + [one_process[0][1]] * 32
    assert calls(*servers) == one_process[1]
    paid = one_process[1]["key_points"] + one_process[1]["outcome"]
    assert (
        sum(out["info"]["keyshot_judge_calls"]) == paid
    )  # each call counted once, by the sample that paid it


@slow
def test_single_turn_with_a_dead_judge_gets_counted_zeros(tmp_path, openrlhf):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer)
        out = openrlhf.run(tmp_path, config, mode="single", reward=str(REWARD_FILE), labels=LABELS, samples=2)
    check_tensors(out, 4)
    assert out["rewards"] == [0.0] * 4 and out["info"]["keyshot_failed"] == [1.0] * 4
    assert out["info_means"]["keyshot_failed"] == 1.0 and out["info_means"]["keyshot_success"] == 0.0


@slow
def test_a_malformed_label_is_one_counted_failure_named_and_never_read_as_a_path(
    tmp_path, servers, openrlhf, one_process
):
    bad = '{"task": "Find a flight", "screenshots": ["a.png"]'  # JSON cut short
    config = write_config(tmp_path / "reward.yaml", *servers)
    out = openrlhf.run(tmp_path, config, mode="single", reward=str(REWARD_FILE), labels=[bad, LABELS[0]])
    check_tensors(out, 2)
    assert out["rewards"] == [0.0, one_process[0][0]] and out["info"]["keyshot_failed"] == [1.0, 0.0]
    named = [w for w in out["warnings"] if "Find a flight" in w]
    assert len(named) == 1 and "label 0" in named[0] and "not JSON" in named[0], out["warnings"]
    assert "exist" not in named[0] and "not found" not in named[0]  # not looked up as a folder


def load_reward_file(name: str):
    """frameworks/openrlhf/reward.py as OpenRLHF loads it: a spec from the file, no sys.modules entry."""
    spec = importlib.util.spec_from_file_location(name, REWARD_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reward_file_loaded_by_path_twice_keeps_one_model(tmp_path, servers, monkeypatch):
    """Two copies of the file (OpenRLHF's load beside a normal import) score through one process-wide
    model: the second copy's samples are paid by nobody, and both copies' rounds are that model's."""
    judge, scorer = servers
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(write_config(tmp_path / "reward.yaml", judge, scorer)))
    first, second = load_reward_file("reward_func"), load_reward_file("reward_func_again")
    assert first is not second and first.reward_func is not second.reward_func
    try:
        a = first.reward_func(["q"], ["p"], [LABELS[0]])
        paid = calls(judge, scorer)
        b = second.reward_func(["q"], ["p"], [LABELS[0]])
        assert calls(judge, scorer) == paid and paid["key_points"] == 1  # one model: nothing paid twice
        assert a["rewards"].tolist() == b["rewards"].tolist()
        assert b["extra_logs"]["keyshot_judge_calls"].tolist() == [0.0]
        assert reward_shared.shared_batcher().batches == 2  # the rounds of both copies, in one batcher
    finally:
        reward_shared.reset_shared()


# ---------------------------------------------------------------------------- keyshot reward serve


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def histogram(metrics: str, route: str) -> list[int]:
    prefix = f'keyshot_reward_request_seconds_bucket{{route="{route}",'
    return [int(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)]


@slow
def test_two_reward_services_answer_numbers_healthy_and_with_the_judge_down(tmp_path, servers, openrlhf):
    """Two `keyshot reward serve` URLs: OpenRLHF's executor shares the samples between them; with the judge
    down every answer is still a number, each counted as failed."""
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
    with contextlib.ExitStack() as started:
        services = [started.enter_context(start_reward_serve(config, paths.FIXTURES)) for _ in range(2)]
        urls = ",".join(f"{service.url}/get_reward" for service in services)
        out = openrlhf.run(tmp_path, config, mode="single", reward=urls, labels=LABELS, samples=2)
        check_tensors(out, 4)
        assert out["info"]["keyshot_failed"] == [0.0] * 4 and set(out["rewards"]) <= {0.0, 1.0}
        before = [get(f"{service.url}/metrics") for service in services]
        assert all(sum(histogram(m, "/get_reward")) > 0 for m in before)  # both URLs were used

        judge.faults = FaultPlan({"500": 1.0})
        shots = [str(p) for p in sorted((OM2W_V1[1] / "trajectory").iterdir())]
        label = json.dumps({"task": "A task never judged before", "screenshots": shots})
        down = openrlhf.run(tmp_path, config, mode="single", reward=urls, labels=[label], samples=2)
        check_tensors(down, 2)
        assert down["rewards"] == [0.0, 0.0] and down["raw_rewards"] == [[0.0], [0.0]]
        assert down["info"]["keyshot_failed"] == [1.0, 1.0]
        after = [get(f"{service.url}/metrics") for service in services]
        for old, new in zip(before, after, strict=True):  # Prometheus counters only grow
            assert all(
                b >= a
                for a, b in zip(histogram(old, "/get_reward"), histogram(new, "/get_reward"), strict=True)
            )


# ---------------------------------------------------------------------------- the multi-turn agent file
@slow
def test_multi_turn_agent_file_shows_the_policy_every_page_and_returns_the_folders_rewards(
    tmp_path, servers, openrlhf, one_process
):
    config = write_config(tmp_path / "reward.yaml", *servers)
    out = openrlhf.run(tmp_path, config, mode="agent", agent_file=str(AGENT_FILE), labels=LABELS, samples=2)
    assert "openrlhf.utils.agent.MultiTurnAgentExecutor" in out["executor_bases"]
    check_tensors(out, 4, (UNFINISHED_KEY,))
    pages = [len(list((folder / "trajectory").iterdir())) for folder in OM2W_V1 for _ in range(2)]
    # every page but the last went through OpenRLHF's load_images into the processor (the first one too)
    assert out["images_shown"] == [n - 1 for n in pages] and out["steps"] == [n - 1 for n in pages]
    assert all(r["images"] >= 1 for r in out["engine_requests"])
    assert out["rewards"] == [one_process[0][0]] * 2 + [one_process[0][1]] * 2
    assert out["info"][UNFINISHED_KEY] == [0.0] * 4 and out["info"]["keyshot_failed"] == [0.0] * 4
    assert calls(*servers) == one_process[1]  # 4 episodes of 2 tasks: what 2 folders cost
    assert out["episode_folders_left"] == 0 and out["closes"] == [1] * 4  # each environment closed once


@slow
def test_an_episode_stopped_by_the_token_budget_is_judged_counted_and_removed(tmp_path, servers, openrlhf):
    config = write_config(tmp_path / "reward.yaml", *servers)
    out = openrlhf.run(
        tmp_path,
        config,
        mode="agent",
        agent_file=str(AGENT_FILE),
        labels=LABELS[1:],
        samples=2,
        max_length=150,
    )
    check_tensors(out, 2, (UNFINISHED_KEY,))
    assert out["steps"] == [1, 1]  # stopped long before the folder's last page: no done step
    assert out["info"][UNFINISHED_KEY] == [1.0, 1.0] and out["info"]["keyshot_failed"] == [0.0, 0.0]
    assert calls(*servers)["outcome"] == 1  # judged (both episodes show the same pages)
    assert out["episode_folders_left"] == 0 and out["closes"] == [1, 1]


def replay_label(folder: Path, **extra) -> str:
    """A label of tests/framework/openrlhf_replay_agent.py: the folder's pages as a JSON dict rollout."""
    shots = [str(p) for p in sorted((folder / "trajectory").iterdir())]
    return json.dumps({"task": f"Replay {folder.name}", "screenshots": shots, **extra})


@slow
def test_an_episode_whose_environment_raises_is_closed_once_and_removed(tmp_path, servers, openrlhf):
    config = write_config(tmp_path / "reward.yaml", *servers)
    label = replay_label(OM2W_V1[1], raise_at=1)
    out = openrlhf.run(
        tmp_path,
        config,
        mode="agent",
        agent_file=str(REPLAY_AGENT_FILE),
        labels=[label],
        samples=2,
        expect_error=True,
    )
    assert out["raised"] == "RuntimeError: the replayed environment failed at step 1"
    assert out["closes"] == [1, 1] and out["closed_unstarted"] == 0
    assert out["episode_folders_left"] == 0 and calls(*servers)["outcome"] == 0  # never judged


@slow
def test_a_cancelled_batch_closes_every_environment_once(tmp_path, servers, openrlhf):
    """The batch cancelled while its rollouts wait for the policy (as a torn-down engine's tasks are):
    each rollout's environment is closed once and its episode removed."""
    config = write_config(tmp_path / "reward.yaml", *servers)
    labels = [replay_label(folder) for folder in OM2W_V1]
    out = openrlhf.run(
        tmp_path,
        config,
        mode="agent",
        agent_file=str(REPLAY_AGENT_FILE),
        labels=labels,
        samples=2,
        cancel_after=4,
    )
    assert out["cancelled"] and len(out["engine_requests"]) >= 4
    assert out["closes"] == [1] * 4 and out["episode_folders_left"] == 0


def live_browser_missing() -> str | None:
    """Why the OpenRLHF venv cannot open a live MiniWoB page here, or None."""
    if not (os.environ.get("KEYSHOT_CHROMIUM") or shutil.which("chromium")):
        return "no Chromium: make setup-browser (or set KEYSHOT_CHROMIUM)"
    if frameworks.missing("openrlhf"):
        return None  # the openrlhf fixture says so
    found = subprocess.run(
        [frameworks.framework_python("openrlhf"), "-c", "import browsergym.miniwob, miniwob"],
        capture_output=True,
        timeout=120,
    )
    return None if found.returncode == 0 else "the OpenRLHF venv has no browser extra: make setup-openrlhf"


@slow
def test_live_episodes_stopped_by_the_token_budget_give_their_browser_back_and_leave_no_process(
    tmp_path, servers, openrlhf
):
    """MiniWoB pages in Chromium through the agent file and OpenRLHF's executor, stopped by the token
    budget long before MiniWoB's 10 steps, three batches one after the other under load (a thread
    spinning beside the rollouts at a 0.1 ms switch interval): each episode is judged, its agent closed
    once and its page given back to the executor's pool once (the pool counts each session's give-back
    once, however often it is asked; the later batches start no Chromium), and once the executor is
    closed none of the worker or Chromium processes is left. (The agents are counted as objects: counted
    by id(), an agent of the first batch freed by then lent its id to one of the next, and each agent's
    one close was seen twice: closes [2, 2, 2, 2].)"""
    if why := live_browser_missing():
        pytest.skip(why)
    config = write_config(tmp_path / "reward.yaml", *servers)
    out = openrlhf.run(
        tmp_path,
        config,
        mode="agent",
        agent_file=str(AGENT_FILE),
        labels=["miniwob:click-button:1"],
        samples=2,
        rounds=3,
        max_length=1000,  # room for the first page (about 480 tokens) and one or two more
        watch_browsers=True,
        busy_threads=1,
    )
    check_tensors(out, 6, (UNFINISHED_KEY,))
    assert all(1 <= n <= 2 for n in out["steps"]) and out["info"][UNFINISHED_KEY] == [1.0] * 6
    assert out["info"]["keyshot_failed"] == [0.0] * 6 and out["closes"] == [1] * 6
    # six sessions given back, one each; none leased or holding a place in a Chromium after the batches
    assert out["pages_given_back_leased_placed"] == [6, 0, 0]
    # one Chromium holds both pages (a browser context each); the later batches opened no other
    assert out["browsers_opened"] == 1
    assert out["browsers_seen"] >= 2  # the worker and its Chromium at least, seen while they ran
    assert out["browsers_left"] == [] and out["episode_folders_left"] == 0


@slow
def test_multi_turn_agent_with_a_dead_judge_gets_counted_zeros(tmp_path, openrlhf):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer)
        out = openrlhf.run(tmp_path, config, mode="agent", agent_file=str(AGENT_FILE), labels=LABELS)
    check_tensors(out, 2, (UNFINISHED_KEY,))
    assert out["rewards"] == [0.0, 0.0] and out["info"]["keyshot_failed"] == [1.0, 1.0]
    assert out["episode_folders_left"] == 0
