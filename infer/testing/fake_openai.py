"""A local OpenAI-compatible chat server for tests, with deterministic judges and injected faults.

In-process::

    with FakeOpenAI(judge_responder, faults=FaultPlan({"429": 0.1, "timeout": 0.05}, seed=0)) as srv:
        client = JudgeClient(EndpointConfig(base_url=srv.base_url, model="fake-judge", api_key_env=None))
        ...
        srv.stats.completions_served

As a subprocess (so a test can kill -9 a judging process while the server keeps counting)::

    python -m keyshot.infer.testing.fake_openai --port 0 --responder judge --fault-rate 0.2 --seed 0

prints ``FAKE_OPENAI_READY http://127.0.0.1:PORT/v1`` once listening; ``GET /stats`` returns the
counters as JSON. :func:`spawn_fake_openai` wraps that for tests.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``, ``GET /stats``.
A responder is a callable ``(request_json) -> completion text``. The built-in ones identify the
WebJudge step from the system prompt (``keyshot.infer.protocol.prompts``) and answer deterministically; the scorer
answer is a real function of the screenshot's pixels.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from random import Random
from typing import IO, Any

import numpy as np
from PIL import Image

from keyshot.infer.protocol.prompts import STEPS, VARIANTS, load_prompt_set

logger = logging.getLogger(__name__)

FAULT_KINDS = ("429", "500", "503", "timeout", "disconnect", "malformed", "garbage")
GARBAGE_TEXT = "I had a look at this and I think it is probably fine, more or less."
READY_PREFIX = "FAKE_OPENAI_READY "

Responder = Callable[[dict], str]


class ResponderError(ValueError):
    """A request the responder cannot answer (answered with HTTP 400, so tests fail loudly)."""


# ---------------------------------------------------------------------------- request helpers
def _content_parts(content: object) -> tuple[str, list[str]]:
    """(joined text, image URLs) of one message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    images: list[str] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            images.append(url.get("url", "") if isinstance(url, dict) else str(url))
    return "\n".join(texts), images


def system_text(request: dict) -> str:
    for msg in request.get("messages", []):
        if msg.get("role") == "system":
            return _content_parts(msg.get("content"))[0]
    return ""


def user_parts(request: dict) -> tuple[str, list[str]]:
    """Text and image URLs of the last user message."""
    for msg in reversed(request.get("messages", [])):
        if msg.get("role") == "user":
            return _content_parts(msg.get("content"))
    return "", []


def identify_step(request: dict) -> str:
    """The WebJudge step ("key_points", "key_screenshot", "outcome") whose system prompt this is."""
    system = system_text(request)
    for variant in VARIANTS:
        prompts = load_prompt_set(variant)
        for step in STEPS:
            if system == prompts.system(step):
                return step
    raise ResponderError(f"system prompt is not a WebJudge prompt (starts {system[:60]!r})")


def decode_data_url(url: str) -> bytes:
    match = re.match(r"data:[\w/+.-]+;base64,(.*)", url, flags=re.DOTALL)
    if not match:
        raise ResponderError(f"image is not a base64 data URL (starts {url[:40]!r})")
    return base64.b64decode(match.group(1))


def decode_image(url: str) -> Image.Image:
    return Image.open(io.BytesIO(decode_data_url(url))).convert("RGB")


# ---------------------------------------------------------------------------- scoring rules
def _bucket(value: float) -> int:
    """Map a value in [0, 1] to a score 1..5."""
    return 1 + min(4, max(0, int(value * 5)))


def _brightness(img: Image.Image) -> tuple[int, str]:
    mean = float(np.asarray(img.convert("L"), dtype=np.float32).mean())
    return _bucket(
        mean / 255.0
    ), f"The page is mostly {'light' if mean >= 128 else 'dark'} (mean brightness {mean:.1f} of 255)."


def _darkness(img: Image.Image) -> tuple[int, str]:
    mean = float(np.asarray(img.convert("L"), dtype=np.float32).mean())
    return _bucket(1.0 - mean / 255.0), f"The page has a darkness of {255 - mean:.1f} of 255."


def _colour_fraction(img: Image.Image, channel: int) -> float:
    arr = np.asarray(img.convert("RGB"), dtype=np.int16)
    main = arr[..., channel]
    others = np.delete(arr, channel, axis=2)
    return float(((main > 150) & (others < 100).all(axis=2)).mean())


def _red_fraction(img: Image.Image) -> tuple[int, str]:
    frac = _colour_fraction(img, 0)
    return _bucket(frac * 2), f"About {frac:.0%} of the page is strongly red."


def _blue_fraction(img: Image.Image) -> tuple[int, str]:
    frac = _colour_fraction(img, 2)
    return _bucket(frac * 2), f"About {frac:.0%} of the page is strongly blue."


SCORE_RULES: dict[str, Callable[[Image.Image], tuple[int, str]]] = {
    "brightness": _brightness,
    "darkness": _darkness,
    "red_fraction": _red_fraction,
    "blue_fraction": _blue_fraction,
}


def score_image(rule: str, img: Image.Image) -> int:
    """The 1..5 score a teacher with ``rule`` gives ``img`` (for tests to compute expectations)."""
    if rule not in SCORE_RULES:
        raise ValueError(f"unknown scoring rule {rule!r}; choose one of {', '.join(SCORE_RULES)}")
    return SCORE_RULES[rule](img)[0]


def stable_fraction(data: bytes, seed: int = 0) -> float:
    """A deterministic number in [0, 1) derived from ``data`` and ``seed``."""
    digest = hashlib.sha256(seed.to_bytes(8, "little", signed=True) + data).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


# ---------------------------------------------------------------------------- responders
def _task_after(label: str, text: str) -> str:
    for line in text.splitlines():
        if line.startswith(label):
            return line[len(label) :].strip()
    return text.strip().splitlines()[0] if text.strip() else ""


def key_points_answer(task: str) -> str:
    pieces = [p.strip(" .") for p in re.split(r",|;|\.\s|\band\b", task)]
    points = [p for p in pieces if p] or [task.strip() or "complete the task"]
    return "**Key Points**:\n" + "\n".join(f"{i + 1}. {p[:1].upper() + p[1:]}" for i, p in enumerate(points))


def outcome_answer(task: str, n_images: int, rule: str) -> str:
    if rule == "any_image":
        success = n_images > 0
        why = f"{n_images} key screenshot(s) show evidence" if success else "no key screenshot shows evidence"
    elif rule == "task_hash":
        success = stable_fraction(task.encode()) < 0.5
        why = "the trajectory covers every key point" if success else "a key point is not met"
    elif rule in ("always_success", "always_failure"):
        success = rule == "always_success"
        why = "fixed verdict"
    else:
        raise ValueError(f"unknown outcome rule {rule!r}")
    status = "success" if success else "failure"
    return f'Thoughts: For the task "{task[:80]}", {why}.\nStatus: "{status}"'


def make_judge(
    outcome_rule: str = "any_image", score_rule: str = "brightness", *, reasoning_words: int = 0
) -> Responder:
    """A deterministic WebJudge judge for all three steps.

    Key points: the task split into clauses. Scorer: ``score_rule`` applied to the screenshot.
    Outcome: ``any_image`` (success iff at least one kept screenshot was attached), ``task_hash``,
    ``always_success`` or ``always_failure``. ``reasoning_words`` makes the scorer verbose: that many
    more words of reasoning before the score (about two tokens each), so a small ``max_tokens`` cuts
    the answer before its score (the server answers ``finish_reason: "length"``).
    """
    outcome_answer("", 0, outcome_rule)  # reject an unknown rule now, not at the first request
    score_image(score_rule, Image.new("RGB", (1, 1)))

    def respond(request: dict) -> str:
        step = identify_step(request)
        text, images = user_parts(request)
        if step == "key_points":
            return key_points_answer(_task_after("Task:", text))
        if step == "outcome":
            return outcome_answer(_task_after("User Task:", text), len(images), outcome_rule)
        return _score_answer(images, score_rule, reasoning_words)

    return respond


def _score_answer(images: list[str], rule: str, reasoning_words: int = 0) -> str:
    if len(images) != 1:
        raise ResponderError(f"a key-screenshot request needs exactly one image, got {len(images)}")
    score, description = SCORE_RULES[rule](decode_image(images[0]))
    more = "".join(f" Region {i + 1} of the page was looked at." for i in range(-(-reasoning_words // 7)))
    return (
        f"**Reasoning**: {description}{more} It is judged by its {rule.replace('_', ' ')}."
        f"\n\n**Score**: {score}"
    )


def make_teacher(rule: str = "brightness", garbage_rate: float = 0.0, seed: int = 0) -> Responder:
    """A teacher for the key-screenshot step with its own scoring rule.

    A share ``garbage_rate`` of screenshots (chosen by a hash of the image bytes and ``seed``, so
    the same screenshot always gets the same kind of answer) is answered without a score. The
    other two steps are answered like :func:`make_judge`.
    """
    if rule not in SCORE_RULES:
        raise ValueError(f"unknown scoring rule {rule!r}; choose one of {', '.join(SCORE_RULES)}")
    judge = make_judge(score_rule=rule)

    def respond(request: dict) -> str:
        if identify_step(request) != "key_screenshot":
            return judge(request)
        _, images = user_parts(request)
        if len(images) == 1 and stable_fraction(decode_data_url(images[0]), seed) < garbage_rate:
            return GARBAGE_TEXT
        return _score_answer(images, rule)

    return respond


judge_responder: Responder = make_judge()


def echo_responder(request: dict) -> str:
    """Answers with the last user message's text."""
    return user_parts(request)[0]


def get_responder(name: str) -> Responder:
    """Built-in responders by name: ``judge``, ``judge:OUTCOME_RULE``, ``teacher:RULE[:GARBAGE_RATE]``, ``echo``."""
    kind, _, rest = name.partition(":")
    if kind == "judge":
        return make_judge(rest) if rest else judge_responder
    if kind == "teacher":
        rule, _, rate = rest.partition(":")
        return make_teacher(rule or "brightness", float(rate) if rate else 0.0)
    if kind == "echo":
        return echo_responder
    raise ValueError(f"unknown responder {name!r}; use judge[:RULE], teacher:RULE[:GARBAGE_RATE] or echo")


# ---------------------------------------------------------------------------- faults and stats
@dataclass
class FaultPlan:
    """Which faults to inject: ``script`` (one entry per chat request, None = no fault) is used
    first, then each request draws from ``rates`` with a seeded RNG."""

    rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    script: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kind in list(self.rates) + [s for s in self.script if s is not None]:
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; choose from {', '.join(FAULT_KINDS)}")
        if sum(self.rates.values()) > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {sum(self.rates.values()):.3f} > 1")
        self._rng = Random(self.seed)
        self._lock = threading.Lock()
        self._scripted = 0

    @classmethod
    def uniform(cls, total_rate: float, seed: int = 0, kinds: tuple[str, ...] = FAULT_KINDS) -> FaultPlan:
        return cls({k: total_rate / len(kinds) for k in kinds}, seed=seed)

    def next_fault(self) -> str | None:
        with self._lock:
            if self._scripted < len(self.script):
                self._scripted += 1
                return self.script[self._scripted - 1]
            draw = self._rng.random()
        acc = 0.0
        for kind in FAULT_KINDS:
            acc += self.rates.get(kind, 0.0)
            if draw < acc:
                return kind
        return None


@dataclass
class ServerStats:
    requests: int = 0  # chat-completion requests received
    completions_served: int = 0  # 200 responses with a well-formed completion body ("paid" calls)
    faults: dict[str, int] = field(default_factory=dict)
    responder_errors: int = 0
    max_in_flight: int = 0
    in_flight: int = 0  # requests being answered now (a snapshot is final only when this is 0)

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())


# ---------------------------------------------------------------------------- tokens
_TOKEN = re.compile(r"\d|[^\W\d_]+|\s+|[^\w\s]")


def count_prompt_tokens(request: dict) -> int:
    """Deterministic stand-in for a tokenizer: len(text)//4 per message, 1000 per image."""
    total = 0
    for msg in request.get("messages", []):
        text, images = _content_parts(msg.get("content"))
        total += len(text) // 4 + 1000 * len(images)
    return max(total, 1)


def _logprobs_for(tokens: list[str], k: int) -> list[dict]:
    """Fake log-probabilities: a score digit gets 0.8 on itself and 0.05 on each other digit 1-5."""
    out = []
    for tok in tokens:
        if tok in "12345" and len(tok) == 1:
            alts = [(tok, 0.8)] + [(d, 0.05) for d in "12345" if d != tok]
        else:
            alts = [(tok, 0.9)] + [(f"{tok}~{i}", 0.1 / max(k, 1)) for i in range(1, max(k, 1))]
        top = [{"token": t, "logprob": float(np.log(p)), "bytes": list(t.encode())} for t, p in alts[:k]]
        out.append(
            {
                "token": tok,
                "logprob": top[0]["logprob"] if top else float(np.log(alts[0][1])),
                "bytes": list(tok.encode()),
                "top_logprobs": top,
            }
        )
    return out


# ---------------------------------------------------------------------------- the server
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib signature)
        logger.debug("fake_openai: " + format, *args)

    def _send_json(self, status: int, obj: object, headers: dict[str, str] | None = None) -> None:
        self._send_raw(status, json.dumps(obj).encode(), headers)

    def _send_raw(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (stdlib name)
        fake = self.server.fake
        if self.path == "/health":
            self._send_json(200, {"status": "ok"})
        elif self.path in ("/v1/models", "/models"):
            fake._record_headers(self.path, self.headers)
            if not fake._key_ok(self.headers.get("Authorization")):
                self._send_json(401, {"error": {"message": "Incorrect API key provided"}})
                return
            self._send_json(
                200,
                {
                    "object": "list",
                    # model None: a server that answers for any model name (lists none, like some proxies)
                    "data": [
                        {"id": m, "object": "model", "owned_by": "keyshot-tests"} for m in [fake.model] if m
                    ],
                },
            )
        elif self.path == "/stats":
            self._send_json(200, asdict(fake.stats))
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802 (stdlib name)
        fake = self.server.fake
        if fake._stopping.is_set():  # stopped: a kept-alive connection dies as a killed server's would
            self._drop()
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if self.path not in ("/v1/chat/completions", "/chat/completions"):
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        fake._enter()
        try:
            self._chat(fake, raw)
        finally:
            fake._leave()

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        fake = self.server.fake
        if fake.leak_auth_in_errors:
            message += f" (request had Authorization: {self.headers.get('Authorization')})"
        self._send_json(status, {"error": {"message": message}}, headers)

    def _chat(self, fake: FakeOpenAI, raw: bytes) -> None:
        fake._record_headers(self.path, self.headers)
        if not fake._key_ok(self.headers.get("Authorization")):
            self._send_json(401, {"error": {"message": "Incorrect API key provided"}})
            return
        fault = fake.faults.next_fault() if fake.faults else None
        if fault is not None:
            fake._count_fault(fault)
        if fault == "429":
            self._error(429, "rate limited (injected)", {"Retry-After": "0"})
            return
        if fault in ("500", "503"):
            self._error(int(fault), f"server error {fault} (injected)")
            return
        if fault == "timeout":
            fake._stopping.wait(fake.timeout_sleep_s)
            self._drop()
            return
        if fault == "disconnect":
            self._drop()
            return
        if fault == "malformed":
            self._send_raw(
                200, b'{"id": "chatcmpl-fake", "object": "chat.completion", "choices": [{"message": {"con'
            )
            return
        try:
            request = json.loads(raw)
            if request.get("stream"):
                raise ResponderError("streaming is not supported by the fake server")
            if fake.record_requests:
                fake._record(request)
            if fake.latency_s:
                time.sleep(fake.latency_s)
            text = GARBAGE_TEXT if fault == "garbage" else fake.responder(request)
        except (ResponderError, json.JSONDecodeError, ValueError, OSError) as exc:
            fake._count_responder_error()
            self._error(400, f"fake server cannot answer: {exc}")
            return
        body = fake.completion_body(request, text)
        fake._count_served()  # before the answer leaves: a client that has it may read the stats at once
        self._send_json(200, body)

    def _drop(self) -> None:
        """Close the connection without any response."""
        self.close_connection = True
        with suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # the default backlog (5) drops bursts of connections: spurious timeouts
    fake: FakeOpenAI

    def handle_error(self, request, client_address) -> None:
        """A client that hung up (its timeout, a killed judge) is normal here; anything else is printed."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FakeOpenAI:
    """An OpenAI-compatible chat server on 127.0.0.1 in a background thread.

    Args:
        responder: ``(request_json) -> completion text``.
        faults: a :class:`FaultPlan`, a ``{kind: rate}`` dict, or None.
        model: the model id ``/v1/models`` lists (None: lists none and answers for any name).
        api_key: when set, requests without ``Authorization: Bearer <api_key>`` get HTTP 401.
        timeout_sleep_s: how long a ``timeout`` fault stalls before dropping the connection.
        latency_s: time each normal answer takes (to make concurrency observable).
        leak_auth_in_errors: error bodies quote the request's Authorization header, like a careless
            proxy, so tests can check that clients redact the key.
    """

    def __init__(
        self,
        responder: Responder = judge_responder,
        faults: FaultPlan | dict[str, float] | None = None,
        *,
        model: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_sleep_s: float = 5.0,
        latency_s: float = 0.0,
        record_requests: bool = True,
        leak_auth_in_errors: bool = False,
        api_key: str | None = None,
    ):
        self.responder = responder
        self.faults = FaultPlan(dict(faults)) if isinstance(faults, dict) else faults
        self.model = model
        self.api_key = api_key
        self.timeout_sleep_s = timeout_sleep_s
        self.latency_s = latency_s
        self.record_requests = record_requests
        self.leak_auth_in_errors = leak_auth_in_errors
        self.requests: list[dict] = []
        self._headers: list[tuple[str, dict[str, str]]] = []  # (path, headers with lower-cased names)
        self._host, self._port = host, port
        self._stats = ServerStats()
        self._in_flight = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> FakeOpenAI:
        self._server = _Server((self._host, self._port), _Handler)
        self._server.fake = self
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.05,),  # poll interval: stop() returns quickly
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("fake server is not running")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- stats
    @property
    def stats(self) -> ServerStats:
        """A snapshot of the counters."""
        with self._lock:
            return ServerStats(
                requests=self._stats.requests,
                completions_served=self._stats.completions_served,
                faults=dict(self._stats.faults),
                responder_errors=self._stats.responder_errors,
                max_in_flight=self._stats.max_in_flight,
                in_flight=self._in_flight,
            )

    def settled_stats(self, timeout_s: float = 30.0) -> ServerStats:
        """The counters once no request is being answered (a client may hold an answer whose count the
        handler thread has not finished recording, or a killed client's request may still be running)."""
        return _settled(lambda: self.stats, timeout_s)

    def _enter(self) -> None:
        with self._lock:
            self._stats.requests += 1
            self._in_flight += 1
            self._stats.max_in_flight = max(self._stats.max_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _count_fault(self, kind: str) -> None:
        with self._lock:
            self._stats.faults[kind] = self._stats.faults.get(kind, 0) + 1

    def _count_served(self) -> None:
        with self._lock:
            self._stats.completions_served += 1

    def _count_responder_error(self) -> None:
        with self._lock:
            self._stats.responder_errors += 1

    def _key_ok(self, authorization: str | None) -> bool:
        return self.api_key is None or authorization == f"Bearer {self.api_key}"

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """Every request's headers (chat completions and model lists), names lower-cased."""
        with self._lock:
            return [headers for _, headers in self._headers]

    @property
    def auth_headers(self) -> list[str | None]:
        """The ``Authorization`` header of every chat completion request (None when it had none)."""
        with self._lock:
            return [h.get("authorization") for path, h in self._headers if path.endswith("/chat/completions")]

    def _record_headers(self, path: str, headers: Any) -> None:
        with self._lock:
            self._headers.append((path, {k.lower(): v for k, v in headers.items()}))

    def _record(self, request: dict) -> None:
        with self._lock:
            self.requests.append(request)

    # -- answers
    def completion_body(self, request: dict, text: str) -> dict:
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        tokens = _TOKEN.findall(text)
        finish = "stop"
        if limit is not None and len(tokens) > int(limit):
            tokens = tokens[: int(limit)]
            text = "".join(tokens)
            finish = "length"
        choice: dict = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish,
            "logprobs": None,
        }
        if request.get("logprobs"):
            choice["logprobs"] = {"content": _logprobs_for(tokens, int(request.get("top_logprobs") or 0))}
        prompt_tokens = count_prompt_tokens(request)
        return {
            "id": "chatcmpl-" + hashlib.sha256(text.encode()).hexdigest()[:24],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", self.model or "fake"),
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max(1, len(tokens)),
                "total_tokens": prompt_tokens + max(1, len(tokens)),
            },
        }


# ---------------------------------------------------------------------------- subprocess use
def _parse_faults(spec: str) -> dict[str, float]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, rate = item.partition("=")
        out[kind.strip()] = float(rate)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m keyshot.infer.testing.fake_openai", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port (printed on the READY line)")
    parser.add_argument(
        "--responder", default="judge", help="judge[:RULE], teacher:RULE[:GARBAGE_RATE] or echo"
    )
    parser.add_argument(
        "--fault-rate", type=float, default=0.0, help="total fault rate, split evenly over all kinds"
    )
    parser.add_argument(
        "--faults", default="", help="per-kind rates, e.g. 429=0.1,timeout=0.05 (overrides --fault-rate)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-sleep", type=float, default=5.0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--model", default=None, help="the model /v1/models lists (default: none, any name)")
    args = parser.parse_args(argv)

    if args.faults:
        plan: FaultPlan | None = FaultPlan(_parse_faults(args.faults), seed=args.seed)
    elif args.fault_rate:
        plan = FaultPlan.uniform(args.fault_rate, seed=args.seed)
    else:
        plan = None
    server = FakeOpenAI(
        get_responder(args.responder),
        plan,
        model=args.model,
        host=args.host,
        port=args.port,
        timeout_sleep_s=args.timeout_sleep,
        latency_s=args.latency,
        record_requests=False,
    ).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"{READY_PREFIX}{server.base_url}", flush=True)
    done.wait()
    server.stop()
    return 0


@contextmanager
def spawn_fake_openai(
    responder: str = "judge",
    *,
    fault_rate: float = 0.0,
    faults: dict[str, float] | None = None,
    seed: int = 0,
    latency_s: float = 0.0,
    timeout_sleep_s: float = 5.0,
    startup_timeout_s: float = 30.0,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run the server as a subprocess; yields ``(base_url, process)`` and terminates it on exit."""
    cmd = [
        sys.executable,
        "-m",
        "keyshot.infer.testing.fake_openai",
        "--port",
        "0",
        "--responder",
        responder,
        "--seed",
        str(seed),
        "--latency",
        str(latency_s),
        "--timeout-sleep",
        str(timeout_sleep_s),
    ]
    if faults:
        cmd += ["--faults", ",".join(f"{k}={v}" for k, v in faults.items())]
    elif fault_rate:
        cmd += ["--fault-rate", str(fault_rate)]
    root = Path(__file__).resolve().parents[2]
    # stderr goes to a file, so a chatty server never blocks on a full pipe
    with tempfile.TemporaryFile(mode="w+") as stderr:
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            base_url = _wait_ready(proc, startup_timeout_s, stderr)
            yield base_url, proc
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _wait_ready(proc: subprocess.Popen, timeout_s: float, stderr: IO[str]) -> str:
    result: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                result.append(line[len(READY_PREFIX) :].strip())
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not result:
        proc.kill()
        proc.wait(timeout=10)
        stderr.seek(0)
        err = stderr.read()
        raise RuntimeError(f"fake OpenAI server did not start within {timeout_s:g}s: {err[-2000:]}")
    return result[0]


def fetch_stats(base_url: str, *, settled: bool = False) -> ServerStats:
    """Counters of a (subprocess) server, read over HTTP; ``settled``: once no request is being answered."""
    import urllib.request

    root = base_url.rstrip("/").removesuffix("/v1")

    def read() -> ServerStats:
        with urllib.request.urlopen(f"{root}/stats", timeout=10) as resp:
            return ServerStats(**json.load(resp))

    return _settled(read, 30.0) if settled else read()


def _settled(read: Callable[[], ServerStats], timeout_s: float) -> ServerStats:
    deadline = time.monotonic() + timeout_s
    stats = read()
    while stats.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
        stats = read()
    return stats


__all__ = [
    "FAULT_KINDS",
    "SCORE_RULES",
    "FakeOpenAI",
    "FaultPlan",
    "ResponderError",
    "ServerStats",
    "count_prompt_tokens",
    "decode_image",
    "echo_responder",
    "fetch_stats",
    "get_responder",
    "identify_step",
    "judge_responder",
    "make_judge",
    "make_teacher",
    "score_image",
    "spawn_fake_openai",
    "stable_fraction",
    "user_parts",
]


if __name__ == "__main__":
    sys.exit(main())
