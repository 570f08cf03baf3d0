"""The judge client: payloads, cache keys, retries against injected faults, cache, budget, secrets."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import time

import httpx2
import pytest
from PIL import Image

from keyshot.infer.client.cache import CallCache, cache_key
from keyshot.infer.client.judge_client import (
    BudgetExceededError,
    EndpointConfig,
    JudgeCallError,
    JudgeClient,
    MissingAPIKeyError,
    build_payload,
    is_reasoning_model,
)
from keyshot.infer.client.preflight import preflight
from keyshot.infer.client.replies import retry_after_s
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.protocol.messages import key_points_messages, scorer_messages
from keyshot.infer.protocol.parsing import parse_score
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.fake_openai import (
    FAULT_KINDS,
    FakeOpenAI,
    FaultPlan,
    ResponderError,
    echo_responder,
    judge_responder,
    score_image,
)
from keyshot.infer.testing.images import encoded

PROMPTS = load_prompt_set()
VERSION = PROMPTS.version


def _data_url(colour: tuple[int, int, int], size=(40, 30)) -> str:
    jpeg = encoded(Image.new("RGB", size, colour), "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def _local(srv: FakeOpenAI, **kw) -> EndpointConfig:
    defaults = dict(
        base_url=srv.base_url,
        model="fake-judge",
        api_key_env=None,
        timeout_s=2.0,
        backoff_base_s=0.001,
        backoff_max_s=0.01,
    )
    defaults.update(kw)
    return EndpointConfig(**defaults)


def _score_error(text: str) -> str | None:
    return parse_score(text).error


# ---------------------------------------------------------------------------- payloads (no network)
@pytest.mark.parametrize(
    ("model", "reasoning"),
    [
        ("o1-mini", True),
        ("o3", True),
        ("o4-mini-2025-04-16", True),
        ("gpt-5-mini", True),
        ("openai/o4-mini", True),
        ("gpt-4o-2024-11-20", False),
        ("gpt-4.1-mini", False),
        ("Qwen/Qwen2.5-VL-72B-Instruct", False),
        ("claude-3-7-sonnet", False),
    ],
)
def test_reasoning_models_get_max_completion_tokens_and_no_temperature(model, reasoning):
    ep = EndpointConfig(base_url="https://api.example.com/v1", model=model, max_tokens=777)
    body = build_payload(ep, [{"role": "user", "content": "hi"}])
    assert is_reasoning_model(model) is reasoning
    if reasoning:
        assert body["max_completion_tokens"] == 777
        assert "max_tokens" not in body and "temperature" not in body
    else:
        assert body["max_tokens"] == 777 and body["temperature"] == 0.0
        assert "max_completion_tokens" not in body
    assert body["seed"] == 0 and body["model"] == model


def test_payload_override_logprobs_seed_and_extra_body():
    ep = EndpointConfig(
        base_url="http://localhost:8000/v1",
        model="my-served-reasoner",
        reasoning_model=True,
        seed=None,
        extra_body={"top_p": 0.5},
    )
    body = build_payload(ep, [], max_tokens=12, logprobs=5)
    assert body["max_completion_tokens"] == 12 and "temperature" not in body
    assert "seed" not in body
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    assert body["top_p"] == 0.5
    plain = build_payload(EndpointConfig(base_url="http://x", model="o3", reasoning_model=False), [])
    assert plain["max_tokens"] == 1024 and plain["temperature"] == 0.0


def test_cache_key_is_stable_and_sensitive_to_what_changes_the_answer():
    msgs = scorer_messages(PROMPTS, "Buy milk", "1. milk", _data_url((10, 20, 30)))
    params = {"max_tokens": 1024, "temperature": 0.0, "seed": 0}
    base = cache_key("gpt-4o", VERSION, msgs, params)
    # Same content built again, and params given in another order: same key.
    again = scorer_messages(PROMPTS, "Buy milk", "1. milk", _data_url((10, 20, 30)))
    assert cache_key("gpt-4o", VERSION, again, dict(reversed(params.items()))) == base
    changed = [
        cache_key("gpt-4o-mini", VERSION, msgs, params),
        cache_key("gpt-4o", "general@0000000000", msgs, params),
        cache_key(
            "gpt-4o",
            VERSION,
            scorer_messages(PROMPTS, "Buy milk!", "1. milk", _data_url((10, 20, 30))),
            params,
        ),
        cache_key(
            "gpt-4o",
            VERSION,
            scorer_messages(PROMPTS, "Buy milk", "1. milk", _data_url((10, 20, 90))),
            params,
        ),
        cache_key("gpt-4o", VERSION, msgs, {**params, "max_tokens": 512}),
        cache_key("gpt-4o", VERSION, msgs, {**params, "temperature": 0.7}),
        cache_key("gpt-4o", VERSION, msgs, {**params, "seed": 1}),
        cache_key("gpt-4o", VERSION, msgs, {**params, "logprobs": True, "top_logprobs": 5}),
    ]
    assert len(set(changed)) == len(changed) and base not in changed


def test_client_key_follows_payload_params():
    client = JudgeClient(EndpointConfig(base_url="http://localhost:1/v1", model="m"))
    msgs = key_points_messages(PROMPTS, "t")
    k = client.key_for(msgs, prompt_version=VERSION)
    assert k == client.key_for(msgs, prompt_version=VERSION)
    assert k != client.key_for(msgs, prompt_version=VERSION, max_tokens=10)
    assert k != client.key_for(msgs, prompt_version=VERSION, logprobs=3)


def test_retry_after_parsing_and_backoff_bounds():
    assert retry_after_s(httpx2.Headers({"Retry-After": "2"})) == 2.0
    assert retry_after_s(httpx2.Headers({"retry-after-ms": "1500", "Retry-After": "9"})) == 1.5
    assert retry_after_s(httpx2.Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    assert retry_after_s(httpx2.Headers({})) is None
    ep = EndpointConfig(base_url="http://x", model="m", backoff_base_s=1.0, backoff_max_s=5.0)
    client = JudgeClient(ep)
    for n, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (10, 5.0)]:
        d = client._delay(n, None)
        assert ceiling / 2 <= d <= ceiling
    assert client._delay(3, 30.0) == 5.0  # Retry-After honoured but capped
    assert client._delay(3, 0.0) == 0.0


def test_endpoint_needs_key_only_when_remote(monkeypatch):
    monkeypatch.delenv("KEYSHOT_TEST_NO_SUCH_KEY", raising=False)
    remote = EndpointConfig(
        base_url="https://api.openai.com/v1", model="gpt-4o", api_key_env="KEYSHOT_TEST_NO_SUCH_KEY"
    )
    with pytest.raises(MissingAPIKeyError, match="KEYSHOT_TEST_NO_SUCH_KEY"):
        JudgeClient(remote).complete_sync(key_points_messages(PROMPTS, "t"), prompt_version=VERSION)
    for url in (
        "http://127.0.0.1:8000/v1",
        "http://localhost:8000/v1",
        "http://gpu-node-3:8000/v1",
        "http://10.1.2.3/v1",
    ):
        ep = EndpointConfig(base_url=url, model="m", api_key_env="KEYSHOT_TEST_NO_SUCH_KEY")
        assert ep.api_key() is None, url


# ---------------------------------------------------------------------------- against the fake server
def test_injected_faults_are_retried_and_a_second_run_is_served_from_cache(tmp_path):
    colours = [(i * 10 % 256, i * 37 % 256, i * 91 % 256) for i in range(24)]
    urls = [_data_url(c) for c in colours]
    messages = [scorer_messages(PROMPTS, f"task {i}", "1. a point", u) for i, u in enumerate(urls)]
    # Every fault kind once up front, then 25% faults spread over the kinds that cost no waiting
    # (a timeout costs timeout_s, generous so that a loaded CI machine causes no extra timeouts).
    rates = {k: 0.25 / (len(FAULT_KINDS) - 1) for k in FAULT_KINDS if k != "timeout"}
    plan = FaultPlan(rates, seed=3, script=list(FAULT_KINDS))
    with FakeOpenAI(judge_responder, plan, timeout_sleep_s=8.0) as srv:
        ep = _local(
            srv,
            timeout_s=4.0,
            max_retries=10,
            max_concurrency=4,
            price_input_per_mtok=2.5,
            price_output_per_mtok=10,
        )

        async def run(client: JudgeClient):
            async with client:
                return await asyncio.gather(
                    *(client.complete(m, prompt_version=VERSION, validate=_score_error) for m in messages)
                )

        with CallCache(tmp_path / "calls.sqlite") as cache:
            client = JudgeClient(ep, cache)
            t0 = time.monotonic()
            first = asyncio.run(run(client))
            elapsed = time.monotonic() - t0
            stats = srv.settled_stats()
            usage = client.ledger.usage(ep.name)

            assert all(c.valid and not c.cached for c in first)
            for c, url in zip(first, urls, strict=True):
                img = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
                assert parse_score(c.text).score == score_image("brightness", img)
            assert set(stats.faults) == set(FAULT_KINDS)
            assert stats.total_faults >= len(FAULT_KINDS)
            # one retry per injected fault, one HTTP request per server-side request
            assert usage.retries == stats.total_faults == sum(c.attempts - 1 for c in first)
            assert usage.requests == stats.requests
            assert stats.completions_served == len(messages) + stats.faults["garbage"]
            assert usage.calls == len(messages) and usage.failures == 0 and usage.invalid == 0
            assert usage.cost_usd == pytest.approx(sum(c.cost_usd for c in first)) and usage.cost_usd > 0
            assert stats.max_in_flight <= 4
            assert elapsed < 30
            assert len(cache) == len(messages)

            second = JudgeClient(ep, cache)
            again = asyncio.run(run(second))
            assert srv.stats.requests == stats.requests  # zero new HTTP requests
            assert all(c.cached and c.cost_usd == 0 and c.attempts == 0 for c in again)
            assert [c.text for c in again] == [c.text for c in first]
            u2 = second.ledger.usage(ep.name)
            assert u2.cache_hits == len(messages) and u2.requests == 0
            # saved = what the cached answers cost; less than the first run, which also paid for garbage
            assert u2.saved_cost_usd == pytest.approx(sum(c.saved_cost_usd for c in again))
            assert 0 < u2.saved_cost_usd < usage.cost_usd


def test_cache_survives_a_new_process_handle_and_keeps_logprobs(tmp_path):
    msgs = scorer_messages(PROMPTS, "task", "1. x", _data_url((250, 250, 250)))
    with FakeOpenAI(judge_responder) as srv:
        ep = _local(srv)
        with CallCache(tmp_path / "c.sqlite") as cache:
            fresh = JudgeClient(ep, cache).complete_sync(msgs, prompt_version=VERSION, logprobs=3)
        assert fresh.logprobs is not None and len(fresh.logprobs[-1]["top_logprobs"]) == 3
        assert fresh.logprobs[-1]["token"] == str(parse_score(fresh.text).score) == "5"
        with CallCache(tmp_path / "c.sqlite") as reopened:  # as another process would
            hit = JudgeClient(ep, reopened).complete_sync(msgs, prompt_version=VERSION, logprobs=3)
            miss = JudgeClient(ep, reopened).complete_sync(
                msgs, prompt_version=VERSION
            )  # no logprobs: other key
        assert hit.cached and hit.text == fresh.text and hit.logprobs == fresh.logprobs
        assert not miss.cached
        assert srv.stats.requests == 2


def test_malformed_answers_are_asked_again_then_returned_invalid(tmp_path):
    calls = {"n": 0}

    def flaky(request: dict) -> str:
        calls["n"] += 1
        return "I think it is relevant." if calls["n"] <= 2 else "**Reasoning**: ok\n\n**Score**: 4"

    msgs = key_points_messages(PROMPTS, "t")
    with FakeOpenAI(flaky) as srv, CallCache(tmp_path / "c.sqlite") as cache:
        client = JudgeClient(_local(srv, max_invalid_retries=2), cache)
        good = client.complete_sync(msgs, prompt_version=VERSION, validate=_score_error)
        assert good.valid and good.attempts == 3 and parse_score(good.text).score == 4

    with FakeOpenAI(lambda r: "no score at all") as srv, CallCache(tmp_path / "c2.sqlite") as cache:
        client = JudgeClient(_local(srv, max_invalid_retries=2), cache)
        bad = client.complete_sync(msgs, prompt_version=VERSION, validate=_score_error)
        assert not bad.valid and bad.error and bad.attempts == 3 and bad.text == "no score at all"
        assert client.ledger.usage("fake-judge").invalid == 1
        assert len(cache) == 0  # never cache a malformed answer
        again = client.complete_sync(msgs, prompt_version=VERSION, validate=_score_error)
        assert not again.cached and srv.stats.requests == 6


def test_client_errors_are_not_retried():
    def reject(request: dict) -> str:
        raise ResponderError("bad request")

    with FakeOpenAI(reject) as srv:
        client = JudgeClient(_local(srv))
        with pytest.raises(JudgeCallError) as err:
            client.complete_sync(key_points_messages(PROMPTS, "t"), prompt_version=VERSION)
        assert err.value.status == 400 and err.value.attempts == 1 and "bad request" in str(err.value)
        assert srv.stats.requests == 1
        assert client.ledger.usage("fake-judge").failures == 1


def test_a_hanging_server_does_not_hang_the_caller():
    with FakeOpenAI(echo_responder, FaultPlan({"timeout": 1.0}), timeout_sleep_s=30) as srv:
        client = JudgeClient(_local(srv, timeout_s=0.2, max_retries=2))
        t0 = time.monotonic()
        with pytest.raises(JudgeCallError, match="gave up after 3 attempts"):
            client.complete_sync(key_points_messages(PROMPTS, "t"), prompt_version=VERSION)
        assert time.monotonic() - t0 < 3
        assert srv.stats.faults == {"timeout": 3}


def test_concurrency_is_bounded_by_the_semaphore():
    msgs = [key_points_messages(PROMPTS, f"task {i}") for i in range(12)]
    with FakeOpenAI(judge_responder, latency_s=0.05) as srv:
        client = JudgeClient(_local(srv, max_concurrency=3))

        async def run():
            async with client:
                return await asyncio.gather(*(client.complete(m, prompt_version=VERSION) for m in msgs))

        out = asyncio.run(run())
        assert len(out) == 12 and all(c.text.startswith("**Key Points**:") for c in out)
        assert 2 <= srv.stats.max_in_flight <= 3


def test_budget_cap_stops_before_the_next_call():
    # $1 per prompt token: a call's cost equals its prompt tokens.
    msgs = [key_points_messages(PROMPTS, f"task {i:03d}") for i in range(10)]
    with FakeOpenAI(echo_responder) as srv:
        probe = JudgeClient(_local(srv, price_input_per_mtok=1e6))
        cost = probe.complete_sync(msgs[0], prompt_version=VERSION).cost_usd
        assert cost > 0
        before = srv.stats.requests

        ep = _local(srv, price_input_per_mtok=1e6, budget_usd=2.5 * cost)
        client = JudgeClient(ep)
        for m in msgs[:3]:
            client.complete_sync(m, prompt_version=VERSION)
        with pytest.raises(BudgetExceededError, match="budget"):
            client.complete_sync(msgs[3], prompt_version=VERSION)
        assert srv.stats.requests - before == 3
        usage = client.ledger.usage(ep.name)
        assert usage.cost_usd == pytest.approx(3 * cost) and usage.budget_stops == 1

        # Concurrent calls: calls in flight count against the budget, so at most one call overshoots.
        conc = JudgeClient(ep)
        before = srv.stats.requests

        async def burst():
            async with conc:
                return await asyncio.gather(
                    *(conc.complete(m, prompt_version=VERSION) for m in msgs), return_exceptions=True
                )

        results = asyncio.run(burst())
        sent = srv.stats.requests - before
        assert sum(isinstance(r, BudgetExceededError) for r in results) == len(msgs) - sent
        assert sent <= 3 and conc.ledger.usage(ep.name).cost_usd <= ep.budget_usd + cost


def test_api_key_never_leaks(monkeypatch, caplog, tmp_path):
    secret = "sk-keyshot-TEST-0123456789abcdef"
    monkeypatch.setenv("KEYSHOT_TEST_API_KEY", secret)
    caplog.set_level(logging.DEBUG)

    def responder(request: dict) -> str:
        if "boom" in str(request["messages"]):
            raise ResponderError("cannot answer boom")
        return "**Reasoning**: fine\n\n**Score**: 3"

    plan = FaultPlan(script=["500", "429", "disconnect", "timeout", "malformed"])
    with (
        FakeOpenAI(responder, plan, timeout_sleep_s=5, leak_auth_in_errors=True) as srv,
        CallCache(tmp_path / "c.sqlite") as cache,
    ):
        ep = _local(srv, api_key_env="KEYSHOT_TEST_API_KEY", timeout_s=0.8)
        client = JudgeClient(ep, cache)
        ok = client.complete_sync(key_points_messages(PROMPTS, "fine"), prompt_version=VERSION)
        assert ok.valid and ok.attempts == 6
        with pytest.raises(JudgeCallError) as err:
            client.complete_sync(key_points_messages(PROMPTS, "boom"), prompt_version=VERSION)
        assert srv.auth_headers and all(h == f"Bearer {secret}" for h in srv.auth_headers)  # it was sent
    texts = [
        str(err.value),
        repr(err.value),
        caplog.text,
        repr(ep),
        repr(client),
        str(client.ledger.as_dict()),
    ]
    assert "***" in str(err.value)  # the server echoed the header; the client redacted it
    for text in texts:
        assert secret not in text
    assert secret.encode() not in (tmp_path / "c.sqlite").read_bytes()
    for extra in tmp_path.glob("c.sqlite-*"):
        assert secret.encode() not in extra.read_bytes()


def test_nothing_from_the_environment_reaches_an_endpoint(monkeypatch):
    """The openai library reads keys, organisation, project and extra headers from the environment;
    keyshot sends an endpoint only the key its config names, whatever else is set."""
    ambient = {
        "OPENAI_API_KEY": "sk-ambient-api-key",
        "OPENAI_ADMIN_KEY": "sk-ambient-admin-key",
        "OPENAI_ORG_ID": "org-ambient",
        "OPENAI_PROJECT_ID": "proj-ambient",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
        "OPENAI_CUSTOM_HEADERS": "X-Gateway-Token: ambient-token\nAuthorization: Bearer sk-ambient-auth",
    }
    for name, value in ambient.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KEYSHOT_TEST_KEY", "sk-configured")
    messages = key_points_messages(PROMPTS, "a task")
    with FakeOpenAI() as keyless, FakeOpenAI(api_key="sk-configured") as keyed:
        for srv, env in ((keyless, None), (keyed, "KEYSHOT_TEST_KEY")):
            ep = _local(srv, api_key_env=env)
            preflight([ep])  # GET /models
            assert JudgeClient(ep).complete_sync(messages, prompt_version=VERSION).valid
        assert len(keyless.request_headers) == len(keyed.request_headers) == 2
        assert all("authorization" not in h for h in keyless.request_headers)
        assert all(h["authorization"] == "Bearer sk-configured" for h in keyed.request_headers)
        for headers in keyless.request_headers + keyed.request_headers:
            assert not {"openai-organization", "openai-project", "x-gateway-token"} & set(headers)
            assert not any("ambient" in value for value in headers.values()), headers


def test_ledger_summary_table_and_dict():
    ledger = UsageLedger()
    assert ledger.begin_request("judge", None, is_retry=False)
    ledger.end_request("judge", paid=True, prompt_tokens=1000, completion_tokens=100, cost_usd=0.0035)
    ledger.record_cache_hit("judge", 0.0035)
    assert ledger.begin_request("scorer", None, is_retry=True)
    ledger.end_request("scorer")
    d = ledger.as_dict()
    assert d["judge"]["cost_usd"] == pytest.approx(0.0035) and d["judge"]["saved_cost_usd"] == pytest.approx(
        0.0035
    )
    assert d["scorer"]["retries"] == 1 and d["scorer"]["paid_requests"] == 0
    table = ledger.table().splitlines()
    assert table[0].startswith("| endpoint |") and len(table) == 5  # header, rule, 2 endpoints, total
    assert table[-1].startswith("| **total** |") and "1,000" in table[-1] and "0.0035" in table[-1]


def test_identical_requests_in_flight_are_sent_once():
    from keyshot.infer.testing.fake_openai import FakeOpenAI

    messages = [
        {"role": "system", "content": "You are a judge."},
        {"role": "user", "content": "Is the sky blue? Answer yes or no."},
    ]
    with FakeOpenAI(lambda request: "yes", latency_s=0.3) as server:
        client = JudgeClient(EndpointConfig(base_url=server.base_url, model="m", api_key_env=None))

        async def eight() -> list:
            try:
                return await asyncio.gather(
                    *(client.complete(messages, prompt_version="v") for _ in range(8))
                )
            finally:
                await client.aclose()

        answers = asyncio.run(eight())
        assert server.stats.requests == 1  # one paid, seven waited for it
    assert [a.text for a in answers] == ["yes"] * 8
    assert sum(not a.cached for a in answers) == 1 and sum(a.cost_usd > 0 for a in answers) <= 1
    assert client.ledger.usage("m").cache_hits == 7


_SHARED_CACHE_CALLER = """
import asyncio, sys
from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
messages = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
client = JudgeClient(EndpointConfig(base_url=sys.argv[1], model="m", api_key_env=None), cache=CallCache(sys.argv[2]))
async def eight():
    try:
        return await asyncio.gather(*(client.complete(messages, prompt_version="v") for _ in range(8)))
    finally:
        await client.aclose()
answers = asyncio.run(eight())
print(sum(not a.cached for a in answers), "paid", " ".join(a.text for a in answers))
"""


def test_processes_sharing_a_cache_send_an_identical_call_once(tmp_path):
    """Two processes, eight identical concurrent requests each, one cache file: one request is paid."""
    import subprocess
    import sys

    from keyshot.infer.testing.fake_openai import FakeOpenAI

    cache = tmp_path / "calls.sqlite"
    with FakeOpenAI(lambda request: "yes", latency_s=1.0) as server:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _SHARED_CACHE_CALLER, server.base_url, str(cache)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
        assert server.stats.requests == 1
    paid = sorted(int(out.split()[0]) for out, _ in outs)
    assert paid == [0, 1] and all(out.strip().endswith(" ".join(["yes"] * 8)) for out, _ in outs)


def test_a_claim_left_by_a_killed_process_does_not_block_the_call(tmp_path):
    import subprocess
    import sys

    from keyshot.infer.client.cache import CallCache
    from keyshot.infer.testing.fake_openai import FakeOpenAI

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid no longer runs: the claim it "left" is stale at once
    messages = [{"role": "user", "content": "Is the sky blue?"}]
    with FakeOpenAI(lambda request: "yes") as server, CallCache(tmp_path / "calls.sqlite") as cache:
        client = JudgeClient(
            EndpointConfig(base_url=server.base_url, model="m", api_key_env=None), cache=cache
        )
        key = client.key_for(messages, prompt_version="v")
        cache._conn.execute(
            "INSERT INTO claims (key, owner, host, pid, claimed) VALUES (?, ?, ?, ?, ?)",
            (key, "dead", cache._host, gone.pid, time.time()),
        )

        async def one():
            try:
                return await asyncio.wait_for(client.complete(messages, prompt_version="v"), 10)
            finally:
                await client.aclose()

        answer = asyncio.run(one())
        assert answer.text == "yes" and not answer.cached and server.stats.requests == 1
        assert cache._conn.execute("SELECT COUNT(*) FROM claims").fetchone()[0] == 0  # released
