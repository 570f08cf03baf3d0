"""keyshot's reward inside OpenRLHF 0.11.2's own released code.

Each test runs tests/framework/openrlhf_rollouts.py in the OpenRLHF venv (``make setup-openrlhf``;
``$KEYSHOT_OPENRLHF_PYTHON``), where OpenRLHF's executors load keyshot's files by path, its rollout actor
calls them, its VLM utilities load the images, and its samples generator turns every response into the
tensors a trainer builds (only the vLLM engine is a stand-in answering a fixed action). The fake judge and
scorer and ``keyshot reward serve`` run here; what reaches OpenRLHF is checked against one process scoring
the same folders.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, identify_step, make_judge
from keyshot.reward.logs import SAMPLE_KEYS
from keyshot.reward.model import RewardModel
from keyshot.reward.openrlhf import UNFINISHED_KEY

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "framework" / "openrlhf_rollouts.py"
RESULT = "keyshot-openrlhf-result "  # the driver's answer lines
OPENRLHF_PYTHON = os.environ.get("KEYSHOT_OPENRLHF_PYTHON") or str(REPO / ".venv-openrlhf" / "bin" / "python")
OM2W_V1 = sorted((REPO / "tests" / "fixtures" / "trajectories" / "online_mind2web_v1").iterdir())
REWARD_FILE = REPO / "reward" / "openrlhf.py"
AGENT_FILE = REPO / "examples" / "reward" / "openrlhf_agent.py"

if not Path(OPENRLHF_PYTHON).exists():
    pytest.skip(
        f"no OpenRLHF venv at {OPENRLHF_PYTHON}: run `make setup-openrlhf` (or set KEYSHOT_OPENRLHF_PYTHON)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow


class OpenRLHFRunner:
    """The driver in the OpenRLHF venv, started once for the module: one job per line, one answer each."""

    def __init__(self, folder: Path):
        self.stderr = (folder / "stderr.log").open("w")
        self.proc = subprocess.Popen(
            [OPENRLHF_PYTHON, str(DRIVER), "--tiny", str(folder / "tiny")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            cwd=REPO,
        )

    def run(self, tmp_path: Path, config: Path, **job) -> dict:
        tmp = tmp_path / "tmp"
        tmp.mkdir(exist_ok=True)
        self.proc.stdin.write(json.dumps({**job, "config": str(config), "tmp": str(tmp)}) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], deadline - time.monotonic())
            line = self.proc.stdout.readline() if ready else ""
            if not line:
                break
            if line.startswith(RESULT):
                out = json.loads(line[len(RESULT) :])
                assert "error" not in out, out["error"]
                return out
        self.stderr.flush()
        pytest.fail(
            f"the OpenRLHF driver gave no answer; its stderr: {Path(self.stderr.name).read_text()[-4000:]}"
        )

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
    runner = OpenRLHFRunner(tmp_path_factory.mktemp("openrlhf"))
    yield runner
    runner.close()


@pytest.fixture
def servers():
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        yield judge, scorer


def write_config(path: Path, judge: FakeOpenAI, scorer: FakeOpenAI, on_failure: str | None = "zero") -> Path:
    fake_judge_config(
        path,
        judge.base_url,
        {"endpoint": {"base_url": scorer.base_url, "model": "webjudge-7b", "api_key_env": None}},
        judge={"backoff_base_s": 0.01, "max_retries": 1, "timeout_s": 5},
    )
    if on_failure:
        path.write_text(path.read_text() + f"reward:\n  on_failure: {on_failure}\n")
    return path


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


def test_single_turn_executor_loads_the_reward_file_by_path(tmp_path, servers, openrlhf, one_process):
    reward_file = REWARD_FILE
    config = write_config(tmp_path / "reward.yaml", *servers)
    out = openrlhf.run(tmp_path, config, mode="single", reward=str(reward_file), labels=LABELS)
    assert out["executor"] == "openrlhf.utils.agent.SingleTurnAgentExecutor"
    check_tensors(out, 2)
    assert out["rewards"] == one_process[0] and out["info"]["keyshot_failed"] == [0.0, 0.0]
    assert out["info"]["reward"] == out["rewards"]


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


def test_single_turn_with_a_dead_judge_gets_counted_zeros(tmp_path, openrlhf):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer)
        out = openrlhf.run(tmp_path, config, mode="single", reward=str(REWARD_FILE), labels=LABELS, samples=2)
    check_tensors(out, 4)
    assert out["rewards"] == [0.0] * 4 and out["info"]["keyshot_failed"] == [1.0] * 4
    assert out["info_means"]["keyshot_failed"] == 1.0 and out["info_means"]["keyshot_success"] == 0.0


# ---------------------------------------------------------------------------- keyshot reward serve
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def start_service(config: Path, root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "keyshot.infer.cli", "reward", "serve", "--config", str(config)]
        + ["--port", str(port), "--allow-root", str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            get(f"{base}/health")
            return proc, base
        except OSError:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.2)


def histogram(metrics: str, route: str) -> list[int]:
    prefix = f'keyshot_reward_request_seconds_bucket{{route="{route}",'
    return [int(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(prefix)]


def test_two_reward_services_answer_numbers_healthy_and_with_the_judge_down(tmp_path, servers, openrlhf):
    """Two `keyshot reward serve` URLs (a config without on_failure): OpenRLHF's executor shares the samples
    between them; with the judge down every answer is still a number, each counted as failed."""
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer, on_failure=None)
    services = [start_service(config, REPO / "tests" / "fixtures") for _ in range(2)]
    try:
        urls = ",".join(f"{base}/get_reward" for _, base in services)
        out = openrlhf.run(tmp_path, config, mode="single", reward=urls, labels=LABELS, samples=2)
        check_tensors(out, 4)
        assert out["info"]["keyshot_failed"] == [0.0] * 4 and set(out["rewards"]) <= {0.0, 1.0}
        before = [get(f"{base}/metrics") for _, base in services]
        assert all(sum(histogram(m, "/get_reward")) > 0 for m in before)  # both URLs were used

        judge.faults = FaultPlan({"500": 1.0})
        shots = [str(p) for p in sorted((OM2W_V1[1] / "trajectory").iterdir())]
        label = json.dumps({"task": "A task never judged before", "screenshots": shots})
        down = openrlhf.run(tmp_path, config, mode="single", reward=urls, labels=[label], samples=2)
        check_tensors(down, 2)
        assert down["rewards"] == [0.0, 0.0] and down["raw_rewards"] == [[0.0], [0.0]]
        assert down["info"]["keyshot_failed"] == [1.0, 1.0]
        after = [get(f"{base}/metrics") for _, base in services]
        for old, new in zip(before, after, strict=True):  # Prometheus counters only grow
            assert all(
                b >= a
                for a, b in zip(histogram(old, "/get_reward"), histogram(new, "/get_reward"), strict=True)
            )
    finally:
        for proc, _ in services:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in services:
            proc.wait(30)


# ---------------------------------------------------------------------------- the multi-turn agent file
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
    assert out["episode_folders_left"] == 0


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
    assert out["episode_folders_left"] == 0


def test_multi_turn_agent_with_a_dead_judge_gets_counted_zeros(tmp_path, openrlhf):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer)
        out = openrlhf.run(tmp_path, config, mode="agent", agent_file=str(AGENT_FILE), labels=LABELS)
    check_tensors(out, 2, (UNFINISHED_KEY,))
    assert out["rewards"] == [0.0, 0.0] and out["info"]["keyshot_failed"] == [1.0, 1.0]
    assert out["episode_folders_left"] == 0
