"""The fake OpenAI server the other tests rely on: its judges answer in the protocol's format,
deterministically, as a function of the screenshots; its routes, limits and subprocess mode work."""

from __future__ import annotations

import base64
import io
import json
import urllib.error
import urllib.request

import pytest
from PIL import Image

from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.protocol.messages import key_points_messages, outcome_messages, scorer_messages
from keyshot.infer.protocol.parsing import parse_key_points, parse_score, parse_status
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.fake_openai import (
    GARBAGE_TEXT,
    FakeOpenAI,
    ResponderError,
    fetch_stats,
    identify_step,
    judge_responder,
    make_judge,
    make_teacher,
    score_image,
    spawn_fake_openai,
    stable_fraction,
)
from keyshot.infer.testing.images import encoded

PROMPTS = load_prompt_set()


def _jpeg(colour, size=(32, 24)) -> tuple[str, Image.Image]:
    jpeg = encoded(Image.new("RGB", size, colour), "JPEG", quality=95)
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode(), Image.open(io.BytesIO(jpeg)).convert(
        "RGB"
    )


def _request(messages: list[dict]) -> dict:
    return {"model": "fake-judge", "messages": messages}


def test_judge_answers_each_step_in_the_protocol_format():
    task = "Find the cheapest flight to Oslo, and book a window seat"
    kp_req = _request(key_points_messages(PROMPTS, task))
    assert identify_step(kp_req) == "key_points"
    key_points = parse_key_points(judge_responder(kp_req))
    assert key_points.strip().splitlines() == ["1. Find the cheapest flight to Oslo", "2. Book a window seat"]

    for colour in [(0, 0, 0), (90, 90, 90), (250, 250, 250)]:
        url, img = _jpeg(colour)
        req = _request(scorer_messages(PROMPTS, task, key_points, url))
        assert identify_step(req) == "key_screenshot"
        result = parse_score(judge_responder(req))
        assert result.valid and result.score == score_image("brightness", img)
        assert parse_score(judge_responder(req), mode="reference").score == result.score
    assert score_image("brightness", _jpeg((0, 0, 0))[1]) == 1
    assert score_image("brightness", _jpeg((250, 250, 250))[1]) == 5

    url, _ = _jpeg((200, 200, 200))
    with_shot = _request(
        outcome_messages(PROMPTS, task, key_points, ["click"], None, [url], ["a flight list"])
    )
    without = _request(outcome_messages(PROMPTS, task, key_points, ["click"], None, [], []))
    assert parse_status(judge_responder(with_shot)).success is True
    assert parse_status(judge_responder(without)).success is False
    hashed = make_judge("task_hash")
    assert parse_status(hashed(without)).success is (stable_fraction(task.encode()) < 0.5)


def test_unknown_prompt_is_rejected():
    with pytest.raises(ResponderError, match="not a WebJudge prompt"):
        judge_responder(_request([{"role": "system", "content": "hi"}, {"role": "user", "content": "x"}]))
    with pytest.raises(ValueError, match="unknown outcome rule"):
        make_judge("coin_flip")


def test_teachers_disagree_by_rule_and_garble_a_fixed_share():
    task, kp = "Buy socks", "1. Buy socks"
    shots = [_jpeg((i * 12, 255 - i * 12, (i * 53) % 256)) for i in range(20)]
    bright, dark = make_teacher("brightness"), make_teacher("darkness")
    for url, img in shots:
        req = _request(scorer_messages(PROMPTS, task, kp, url))
        b, d = parse_score(bright(req)).score, parse_score(dark(req)).score
        assert b == score_image("brightness", img) and d == score_image("darkness", img)
    red = make_teacher("red_fraction")
    url, _ = _jpeg((230, 10, 10))
    assert parse_score(red(_request(scorer_messages(PROMPTS, task, kp, url)))).score == 5

    noisy = make_teacher("brightness", garbage_rate=0.5, seed=7)
    answers = [noisy(_request(scorer_messages(PROMPTS, task, kp, url))) for url, _ in shots]
    garbled = [a == GARBAGE_TEXT for a in answers]
    expected = [stable_fraction(base64.b64decode(url.split(",", 1)[1]), 7) < 0.5 for url, _ in shots]
    assert garbled == expected and 0 < sum(garbled) < len(shots)
    assert all(not parse_score(a).valid for a, g in zip(answers, garbled, strict=True) if g)
    assert answers == [noisy(_request(scorer_messages(PROMPTS, task, kp, url))) for url, _ in shots]


def test_routes_usage_and_max_tokens():
    with FakeOpenAI(judge_responder, model="judge-x") as srv:
        root = srv.base_url.removesuffix("/v1")
        with urllib.request.urlopen(root + "/health", timeout=5) as r:
            assert json.load(r) == {"status": "ok"}
        with urllib.request.urlopen(srv.base_url + "/models", timeout=5) as r:
            assert [m["id"] for m in json.load(r)["data"]] == ["judge-x"]
        url, _ = _jpeg((128, 128, 128))
        msgs = scorer_messages(PROMPTS, "t", "1. t", url)
        body = json.dumps({"model": "judge-x", "messages": msgs, "max_tokens": 5}).encode()
        req = urllib.request.Request(
            srv.base_url + "/chat/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            out = json.load(r)
        assert out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == 5
        assert out["usage"]["prompt_tokens"] >= 1000  # one image
        bad = urllib.request.Request(srv.base_url + "/chat/completions", b"{not json", {})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=5)
        assert err.value.code == 400
        assert (
            srv.stats.requests == 2 and srv.stats.completions_served == 1 and srv.stats.responder_errors == 1
        )


def test_subprocess_server_counts_across_clients():
    with spawn_fake_openai("judge", faults={"429": 0.3, "500": 0.2}, seed=1) as (base_url, proc):
        ep = EndpointConfig(
            base_url=base_url, model="fake-judge", api_key_env=None, backoff_base_s=0.001, max_retries=20
        )
        client = JudgeClient(ep)
        for i in range(4):
            out = client.complete_sync(
                key_points_messages(PROMPTS, f"task {i}"), prompt_version=PROMPTS.version
            )
            assert out.text.startswith("**Key Points**:")
        stats = fetch_stats(base_url)
        assert stats.completions_served == 4
        assert stats.requests == 4 + stats.total_faults == client.ledger.usage("fake-judge").requests
        assert proc.poll() is None
    assert proc.poll() is not None  # stopped on exit
