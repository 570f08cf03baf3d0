"""The fake OpenAI-compatible chat server (:class:`FakeOpenAI`): HTTP routes, injected faults, counters,
recorded requests and headers, and completion bodies with token limits and fake log-probabilities.

Endpoints: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``, ``GET /stats``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from keyshot.infer.testing.fake_faults import FaultPlan
from keyshot.infer.testing.fake_requests import ResponderError, count_prompt_tokens
from keyshot.infer.testing.fake_responders import GARBAGE_TEXT, Responder, judge_responder

logger = logging.getLogger(__name__)


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


def wait_settled(read: Callable[[], ServerStats], timeout_s: float) -> ServerStats:
    """``read()`` again until no request is being answered, for at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    stats = read()
    while stats.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
        stats = read()
    return stats


# ---------------------------------------------------------------------------- tokens
_TOKEN = re.compile(r"\d|[^\W\d_]+|\s+|[^\w\s]")


def _logprobs_for(tokens: list[str], k: int) -> list[dict]:
    """Fake log-probabilities: a score digit gets 0.8 on itself and 0.05 on each other digit 1-5; a status
    word 0.8 on itself and 0.2 on the other status word."""
    out = []
    for tok in tokens:
        if tok in "12345" and len(tok) == 1:
            alts = [(tok, 0.8)] + [(d, 0.05) for d in "12345" if d != tok]
        elif tok in ("success", "failure"):  # the status word: 0.8 on itself, 0.2 on the other one
            alts = [(tok, 0.8), ("failure" if tok == "success" else "success", 0.2)]
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

    #: a chat request counted in flight (``max_in_flight``) until its answer starts to leave: a client that
    #: has its answer may send the next request before this handler thread returns
    _counted = False

    def _answered(self) -> None:
        if self._counted:
            self._counted = False
            self.server.fake._leave()

    def _send_raw(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self._answered()
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
        self._counted = True
        try:
            self._chat(fake, raw)
        finally:
            self._answered()  # a request dropped or timed out without an answer

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
            if fake.strict_model and request.get("model") != fake.model:
                fake._count_responder_error()
                self._error(404, f"The model `{request.get('model')}` does not exist.")
                return
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
        strict_model: a request naming another model than ``model`` gets HTTP 404, as vLLM answers.
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
        strict_model: bool = False,
    ):
        self.responder = responder
        self.faults = FaultPlan(dict(faults)) if isinstance(faults, dict) else faults
        self.model = model
        self.strict_model = strict_model
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
        return wait_settled(lambda: self.stats, timeout_s)

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
