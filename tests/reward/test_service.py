"""``keyshot reward serve`` as a real process on a free port, against fake judge and scorer servers."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from keyshot.infer.cli import build_parser, parse
from keyshot.infer.common.processes import free_port
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, make_judge
from keyshot.infer.testing.images import png
from keyshot.infer.testing.launch import start_reward_serve
from keyshot.reward.logs import SAMPLE_KEYS
from keyshot.reward.service import Metrics
from tests.support import paths
from tests.support.reward import FIXTURES, write_config

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

TOKEN = "s3cret-token"


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
        config = write_config(root / "reward.yaml", judge, scorer, timeout_s=5, on_failure="zero")
        env = {**os.environ, "KEYSHOT_TEST_TOKEN": TOKEN}
        extra = ("--token-env", "KEYSHOT_TEST_TOKEN", "--max-screenshots", "50")
        # it names the port the kernel chose for --port 0 (it said ":0" before)
        with start_reward_serve(config, root, *extra, env=env) as served:
            assert not served.url.endswith(":0"), served.url
            yield served.url, served.proc, folders, judge, served.output


def test_openrlhf_request_and_response(service):
    base, _, folders, judge, _ = service
    status, body, _ = call(
        f"{base}/get_reward",
        {"query": ["q0", "q1"], "prompts": ["p0", "p1"], "labels": [str(f) for f in folders]},
    )
    assert status == 200, body
    assert set(body) == {"rewards", "scores", "extra_logs"}
    assert len(body["rewards"]) == 2 and all(r in (0.0, 1.0) for r in body["rewards"])
    assert body["scores"] == body["rewards"] and body["extra_logs"]["keyshot_failed"] == [0.0, 0.0]


def test_native_batch(service):
    base, _, folders, _, _ = service
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
    base, proc, folders, _, _ = service
    page = base64.b64encode(next(load_trajectories(folders[0])).screenshots[0].read_bytes()).decode()
    tiny_png = base64.b64encode(png(2, 2, (0, 0, 0))).decode()
    outside = next(load_trajectories(FIXTURES / "trajectories" / "online_mind2web_v1")).screenshots[0].path
    cases = [
        ({"rollouts": [{"screenshots": [page]}]}, TOKEN, 422, "'task'"),
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
        ({"rollouts": [{"task": "t", "screenshots": [page]}]}, "wrong", 401, "bearer token"),
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


def test_get_reward_answers_the_counted_on_failure_number_with_the_judge_down(service):
    """OpenRLHF turns every reward into a tensor: with the judge down the answer is the config's
    on_failure number, each failure flagged in the same log fields every adapter reports and counted as
    the adapters count it (on_failure_applied)."""
    base, _, folders, judge, _ = service
    shots = [str(s.path) for s in next(load_trajectories(folders[0])).screenshots]
    label = json.dumps({"task": "A task this service never judged", "screenshots": shots})
    _, before, _ = call(f"{base}/metrics")
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
    assert "keyshot_reward_on_failure_applied_total 0" in before
    assert "keyshot_reward_failures_total 1" in metrics
    assert "keyshot_reward_on_failure_applied_total 1" in metrics


def test_a_malformed_json_label_is_a_422_naming_it_never_a_path(service):
    base, _, folders, _, _ = service
    labels = [str(folders[0]), '{"task": "t", "screenshots": [']
    status, body, _ = call(
        f"{base}/get_reward", {"query": ["q0", "q1"], "prompts": ["p0", "p1"], "labels": labels}
    )
    assert status == 422 and body["error"].startswith("label 1: ") and "is not JSON" in body["error"], body


def test_a_config_without_a_number_for_get_reward_is_refused_at_start(tmp_path, capsys):
    """The service answers OpenRLHF, which needs a number for every sample: as the adapters do, it refuses a
    config whose failed rollouts would have none, in one line naming the key, before it starts anything."""
    from keyshot.infer.cli import main as keyshot

    with FakeOpenAI(make_judge()) as judge:
        config = write_config(tmp_path / "reward.yaml", judge)
        argv = [
            "reward",
            "serve",
            "--config",
            str(config),
            "--port",
            str(free_port()),
            "--allow-root",
            str(tmp_path),
        ]
        assert keyshot(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(config) in err and "set reward.on_failure: zero" in err, err
    assert judge.requests == []


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
    code = "import sys, keyshot.reward.service; print('keyshot.frameworks.openrlhf.reward' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_sigterm_drains_and_leaves_no_process(service):
    """A request in flight when SIGTERM comes is answered before the process ends: the judge holds its
    first call until the service has said it is stopping."""
    base, proc, folders, judge, output = service
    import threading

    asked, release = threading.Event(), threading.Event()
    answer = judge.responder

    def held(request: dict) -> str:
        asked.set()
        release.wait(60)
        return answer(request)

    judge.responder = held
    answers = []
    shots = [str(s.path) for s in next(load_trajectories(folders[1])).screenshots]
    label = json.dumps({"task": "A task judged while the service stops", "screenshots": shots})
    thread = threading.Thread(
        target=lambda: answers.append(
            call(f"{base}/get_reward", {"query": ["q"], "prompts": ["p"], "labels": [label]})
        )
    )
    try:
        thread.start()
        assert asked.wait(60), "the request never reached the judge"
        proc.send_signal(signal.SIGTERM)
        assert "answering the 1 in flight" in output.wait_for("stopping")
    finally:
        release.set()
        judge.responder = answer
    thread.join(60)
    assert proc.wait(60) in (0, 143, -signal.SIGTERM)  # uvicorn re-raises the signal once drained
    assert answers and answers[0][0] == 200 and len(answers[0][1]["rewards"]) == 1  # drained, not dropped
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        call(f"{base}/health")


def test_the_services_options_default_to_its_limits(tmp_path, capsys):
    """``keyshot reward serve``'s limit options repeated ServiceLimits' defaults by hand (256 MiB, 200, 64,
    600 s): they are read from it, and --help says each."""
    from keyshot.reward.command import LIMIT_OPTIONS, service_limits
    from keyshot.reward.service import ServiceLimits

    args = parse(build_parser(), ["reward", "serve", "--config", "c.yaml", "--allow-root", str(tmp_path)])
    assert service_limits(args) == ServiceLimits(allow_root=str(tmp_path.resolve()))
    defaults = ServiceLimits()
    with pytest.raises(SystemExit):
        parse(build_parser(), ["reward", "serve", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for option, name, unit, _ in LIMIT_OPTIONS:
        value = getattr(defaults, name)
        described = shown.split(f" {option} ")[-1].split(" --")[0]  # its line of the option list
        assert f"(default: {value if unit is None else value // unit})" in described, option
    given = ["--max-body-mb", "3", "--queue-size", "5", "--deadline-s", "7.5", "--token-env", "T"]
    args = parse(
        build_parser(), ["reward", "serve", "--config", "c.yaml", "--allow-root", str(tmp_path), *given]
    )
    assert service_limits(args) == ServiceLimits(
        allow_root=str(tmp_path.resolve()),
        max_body_bytes=3 << 20,
        queue_size=5,
        deadline_s=7.5,
        token_env="T",
    )


def test_the_documented_service_command_line_shows_its_defaults():
    """docs/reward.md's synopsis of ``keyshot reward serve`` shows each option's default (``[--queue-size
    64]``): given as written, they are the options' defaults (ServiceLimits' for the limits)."""
    docs = " ".join((paths.REPO / "docs" / "reward.md").read_text().split())
    synopsis = docs.split("`keyshot reward serve --config FILE ", 1)[1].split("`", 1)[0]
    shown = re.findall(r"\[(--[\w-]+) ([^\]A-Z]+)\]", synopsis)  # DIR, VAR: placeholders
    assert {option for option, _ in shown} >= {"--port", "--max-body-mb", "--queue-size", "--deadline-s"}
    command = ["reward", "serve", "--config", "c.yaml"]
    as_written = parse(build_parser(), [*command, *(word for pair in shown for word in pair)])
    assert vars(as_written) == vars(parse(build_parser(), command)), synopsis
