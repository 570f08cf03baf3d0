"""``keyshot reward serve`` as a real process on a free port, against fake judge and scorer servers."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, make_judge
from keyshot.reward.logs import SAMPLE_KEYS
from keyshot.reward.service import Metrics

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

FIXTURES = Path(__file__).parent / "fixtures"
TOKEN = "s3cret-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(
    url: str, body: bytes | dict | None = None, token: str | None = TOKEN
) -> tuple[int, dict | str, dict]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw, headers = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, raw, headers = exc.code, exc.read(), dict(exc.headers)
    text = raw.decode()
    try:
        return status, json.loads(text), headers
    except json.JSONDecodeError:
        return status, text, headers


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    trajectories = FIXTURES / "trajectories" / "online_mind2web_v1"
    folders = []
    for folder in sorted(trajectories.iterdir()):
        target = root / folder.name
        subprocess.run(["cp", "-r", str(folder), str(target)], check=True)
        folders.append(target)
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        config = fake_judge_config(
            root / "reward.yaml",
            judge.base_url,
            {"endpoint": {"base_url": scorer.base_url, "model": "webjudge-7b", "api_key_env": None}},
            judge={"backoff_base_s": 0.01, "max_retries": 1, "timeout_s": 5},
        )
        port = free_port()
        env = {**os.environ, "KEYSHOT_TEST_TOKEN": TOKEN}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "keyshot.infer.cli",
                "reward",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--allow-root",
                str(root),
                "--token-env",
                "KEYSHOT_TEST_TOKEN",
                "--max-screenshots",
                "50",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if call(f"{base}/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the service did not start"
            time.sleep(0.1)
        yield base, proc, folders, judge
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_openrlhf_request_and_response(service):
    base, _, folders, judge = service
    status, body, _ = call(
        f"{base}/get_reward",
        {"query": ["q0", "q1"], "prompts": ["p0", "p1"], "labels": [str(f) for f in folders]},
    )
    assert status == 200, body
    assert set(body) == {"rewards", "scores", "extra_logs"}
    assert len(body["rewards"]) == 2 and all(r in (0.0, 1.0) for r in body["rewards"])
    assert body["scores"] == body["rewards"] and body["extra_logs"]["keyshot_failed"] == [0.0, 0.0]


def test_native_batch(service):
    base, _, folders, _ = service
    trajectory = next(load_trajectories(folders[0]))
    shot = base64.b64encode(trajectory.screenshots[0].read_bytes()).decode()
    rollouts = [
        {"id": f"r{i}", "task": trajectory.task, "screenshots": [shot, str(trajectory.screenshots[1].path)]}
        for i in range(3)
    ]
    status, body, _ = call(f"{base}/v1/reward", {"rollouts": rollouts})
    assert status == 200, body
    assert [r["id"] for r in body["results"]] == ["r0", "r1", "r2"]
    assert all(r["reward"] in (0.0, 1.0) and r["error"] is None for r in body["results"])


def test_bad_requests_get_one_clear_4xx_each_and_the_service_keeps_serving(service, tmp_path):
    base, proc, folders, _ = service
    png = base64.b64encode(next(load_trajectories(folders[0])).screenshots[0].read_bytes()).decode()
    tiny = io.BytesIO()
    Image.new("RGB", (2, 2)).save(tiny, format="PNG")
    tiny_png = base64.b64encode(tiny.getvalue()).decode()
    outside = next(load_trajectories(FIXTURES / "trajectories" / "online_mind2web_v1")).screenshots[0].path
    cases = [
        ({"rollouts": [{"screenshots": [png]}]}, TOKEN, 422, "'task'"),
        (
            {"rollouts": [{"task": "t", "screenshots": [base64.b64encode(b"hello world").decode()]}]},
            TOKEN,
            422,
            "not an image",
        ),
        (
            {"rollouts": [{"task": "t", "screenshots": [str(outside)]}]},
            TOKEN,
            403,
            "outside the allowed root",
        ),
        ({"rollouts": [{"task": "t", "screenshots": [tiny_png] * 10000}]}, TOKEN, 413, "over the limit"),
        (b"{not json", TOKEN, 400, "malformed JSON"),
        ({"rollouts": [{"task": "t", "screenshots": [png]}]}, "wrong", 401, "bearer token"),
    ]
    for body, token, expected, words in cases:
        status, answer, _ = call(f"{base}/v1/reward", body, token=token)
        assert status == expected and words in answer["error"], (status, answer)
        assert "\n" not in answer["error"]
    assert proc.poll() is None
    status, metrics, _ = call(f"{base}/metrics")
    assert status == 200 and 'keyshot_reward_requests_total{route="/v1/reward",code="422"} 2' in metrics
    assert "keyshot_reward_queue_depth" in metrics
    status, health, _ = call(f"{base}/health")
    assert status == 200 and health["status"] == "ok" and health["judge"]["down"] is None


def test_get_reward_answers_numbers_with_the_judge_down_and_no_on_failure(service):
    """OpenRLHF turns every reward into a tensor: with a config without on_failure and the judge down, the
    answer is still numbers, each failure flagged in the same log fields every adapter reports."""
    base, _, folders, judge = service
    shots = [str(s.path) for s in next(load_trajectories(folders[0])).screenshots]
    label = json.dumps({"task": "A task this service never judged", "screenshots": shots})
    judge.faults = FaultPlan({"500": 1.0})
    try:
        status, body, _ = call(f"{base}/get_reward", {"query": ["q"], "prompts": ["p"], "labels": [label]})
    finally:
        judge.faults = None
    assert status == 200, body
    assert body["rewards"] == [0.0] and body["scores"] == [0.0]
    assert set(body["extra_logs"]) == set(SAMPLE_KEYS) and body["extra_logs"]["keyshot_failed"] == [1.0]
    assert all(v is not None for values in body["extra_logs"].values() for v in values)
    status, metrics, _ = call(f"{base}/metrics")
    assert "keyshot_reward_failures_total 1" in metrics


def test_the_latency_histogram_is_cumulative():
    """Prometheus counters only grow: past any number of requests, every bucket counts them all."""
    metrics = Metrics()
    for i in range(12000):
        metrics.observe("/get_reward", 200, 0.2 if i % 2 else 3.0)
    text = metrics.text(0)
    assert 'keyshot_reward_request_seconds_count{route="/get_reward"} 12000' in text
    assert 'keyshot_reward_request_seconds_bucket{route="/get_reward",le="0.25"} 6000' in text
    assert 'keyshot_reward_request_seconds_bucket{route="/get_reward",le="+Inf"} 12000' in text


def test_the_service_does_not_import_the_openrlhf_adapter():
    code = "import sys, keyshot.reward.service; print('keyshot.reward.openrlhf' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_sigterm_drains_and_leaves_no_process(service):
    base, proc, folders, _ = service
    import threading

    answers = []
    thread = threading.Thread(
        target=lambda: answers.append(
            call(f"{base}/get_reward", {"query": ["q"], "prompts": ["p"], "labels": [str(folders[1])]})
        )
    )
    thread.start()
    time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    thread.join(30)
    assert proc.wait(30) in (0, 143, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    assert answers and answers[0][0] == 200 and len(answers[0][1]["rewards"]) == 1  # drained, not dropped
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        call(f"{base}/health")
