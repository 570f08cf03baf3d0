"""``keyshot reward serve``: the reward model over HTTP (FastAPI on uvicorn), shared by trainer processes.

- ``POST /v1/reward``: ``{"rollouts": [{task, screenshots, actions, final_answer, id}, ...]}`` →
  ``{"results": [RewardResult.to_dict(), ...]}`` (or a rollout may be a trajectory folder's path);
- ``POST /get_reward``: OpenRLHF's ``--reward.remote_url``: ``{"query": [...], "prompts": [...], "labels":
  [...]}`` → ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``; a label is a trajectory folder's
  path or a JSON dict rollout (:func:`~keyshot.reward.rollouts.label_rollout`). OpenRLHF turns every reward
  into a tensor and has no "no reward", so ``keyshot reward serve``, like the OpenRLHF and verl adapters,
  refuses at start a config without ``reward: {on_failure: zero}`` (:mod:`keyshot.reward.command` calls
  :func:`~keyshot.reward.shared.require_number_on_failure`): a rollout without a verdict is the model's
  counted 0.0 on both routes (``error``, ``kind`` and ``on_failure_applied`` in ``/v1/reward``'s results;
  ``extra_logs.keyshot_failed``, the log fields of :func:`~keyshot.reward.logs.sample_logs`, in
  ``/get_reward``'s), counted in ``/metrics`` and logged;
- ``GET /health``: the judge's and scorer's breaker state and the queue; 503 when an endpoint is down;
- ``GET /metrics``: Prometheus text (:class:`~keyshot.reward.logs.Metrics`, its families named in
  :data:`~keyshot.reward.logs.PROMETHEUS`).

Every bad request is a 4xx with one ``{"error": "..."}`` line; the service keeps serving. Screenshot and
trajectory paths must lie inside ``--allow-root``. A screenshot larger than a screenshot can be, or a
request whose screenshots decode more than ``max_decoded_pixels`` in all, is a 413 read from the
headers, before anything is decoded (:mod:`keyshot.infer.protocol.decode`). At most ``queue_size`` requests are admitted at once
(the others get 429 with ``Retry-After``); SIGTERM stops accepting and finishes the requests in flight.
The service prints one line once it listens (its port bound, its signal handlers in place) and one when a
signal stops it.
"""

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshot.infer.loaders.common import InputScope
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.decode import ImageError, ImageTooLarge
from keyshot.infer.protocol.images import check_screenshot
from keyshot.reward.logs import Metrics, sample_logs
from keyshot.reward.model import RewardModel
from keyshot.reward.rollouts import RolloutError, label_rollout, read_rollout

logger = logging.getLogger(__name__)


@dataclass
class ServiceLimits:
    allow_root: str = "."
    max_body_bytes: int = 256 * 1024 * 1024
    max_screenshots: int = 200
    max_rollouts: int = 1024
    queue_size: int = 64
    deadline_s: float = 600.0
    token_env: str | None = None
    #: pixels all the screenshots of one request may decode (2^34: ~18,000 screenshots of 1280×720)
    max_decoded_pixels: int = 1 << 34


class BadRequest(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


class RewardService:
    """The request handling, apart from the web framework (so every rule is plain code)."""

    def __init__(self, rm: RewardModel, limits: ServiceLimits):
        self.rm, self.limits = rm, limits
        self.scope = InputScope.of(limits.allow_root)
        self.metrics = Metrics()
        self.in_flight = 0

    # ------------------------------------------------------------------ checks
    def check_token(self, authorization: str | None) -> None:
        if not self.limits.token_env:
            return
        token = os.environ.get(self.limits.token_env)
        if not token:
            raise BadRequest(503, f"the service's token variable {self.limits.token_env} is not set")
        if authorization != f"Bearer {token}":
            raise BadRequest(401, "missing or wrong bearer token (Authorization: Bearer <token>)")

    def parse_body(self, body: bytes) -> dict:
        if len(body) > self.limits.max_body_bytes:
            raise BadRequest(
                413, f"body of {len(body):,} bytes is over the limit of {self.limits.max_body_bytes:,}"
            )
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(400, f"malformed JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadRequest(400, "the body must be a JSON object")
        return data

    def rollout(self, value: Any, position: int, labels: bool = False) -> Trajectory:
        """One rollout of a request (``labels``: an OpenRLHF label), read and checked (a 4xx naming it
        otherwise)."""
        try:
            if labels:
                value = label_rollout(value, position)
            return read_rollout(
                value, position, scope=self.scope, max_screenshots=self.limits.max_screenshots
            )
        except RolloutError as exc:
            raise BadRequest(exc.status, str(exc)) from None

    def rollouts(self, values: Any, what: str) -> list[Trajectory]:
        """The rollouts of a request's list ``what`` ('rollouts', or OpenRLHF's 'labels')."""
        if not isinstance(values, list) or not values:
            raise BadRequest(422, f"'{what}' must be a non-empty list")
        if len(values) > self.limits.max_rollouts:
            raise BadRequest(413, f"{len(values):,} rollouts, over the limit of {self.limits.max_rollouts}")
        trajectories = [self.rollout(v, i, labels=what == "labels") for i, v in enumerate(values)]
        self.check_pixels(trajectories)
        return trajectories

    def check_pixels(self, trajectories: list[Trajectory]) -> None:
        """413 for a screenshot larger than a screenshot can be, or for a request whose screenshots
        decode more than ``max_decoded_pixels`` in all: read from their headers, nothing is decoded
        (under keyshot's default policy; preparing each screenshot checks it again under the scorer's).
        An unreadable screenshot is left to the judge, which lists it with its reason."""
        total = 0
        for trajectory in trajectories:
            for shot in trajectory.screenshots:
                try:
                    total += check_screenshot(shot.data if shot.data is not None else shot.path)[1]
                except ImageTooLarge as exc:
                    raise BadRequest(413, f"{shot.name}: {exc.problem}") from None
                except ImageError:
                    continue
        if total > self.limits.max_decoded_pixels:
            raise BadRequest(
                413,
                f"the request's screenshots decode {total:,} pixels, over the limit of "
                f"{self.limits.max_decoded_pixels:,} per request: send fewer rollouts per request",
            )

    # ------------------------------------------------------------------ handling
    async def admitted(
        self, route: str, authorization: str | None, body: bytes, handle
    ) -> tuple[int, Any, dict]:
        t0 = time.perf_counter()
        status, payload, headers = 200, None, {}
        try:
            self.check_token(authorization)
            if self.in_flight >= self.limits.queue_size:
                raise BadRequest(
                    429, f"the queue is full ({self.limits.queue_size} requests); retry", {"Retry-After": "1"}
                )
            self.in_flight += 1
            try:
                data = self.parse_body(body)
                payload = await asyncio.wait_for(handle(data), self.limits.deadline_s)
            finally:
                self.in_flight -= 1
        except BadRequest as exc:
            status, payload, headers = exc.status, {"error": exc.message}, exc.headers
        except asyncio.TimeoutError:
            status, payload = (
                504,
                {"error": f"the request took longer than its deadline of {self.limits.deadline_s:g} s"},
            )
        seconds = time.perf_counter() - t0
        self.metrics.observe(route, status, seconds)
        logger.info("%s %d %.3fs%s", route, status, seconds, f" {payload['error']}" if status >= 400 else "")
        return status, payload, headers

    async def reward(self, data: dict) -> dict:
        unknown = sorted(set(data) - {"rollouts"})
        if unknown:
            raise BadRequest(422, f'unknown field(s) {unknown}; the body is {{"rollouts": [...]}}')
        trajectories = await asyncio.to_thread(self.rollouts, data.get("rollouts"), "rollouts")
        results = await self.rm.score(trajectories)
        for r, value in zip(results, data["rollouts"], strict=True):
            if isinstance(value, dict) and value.get("id") is not None:
                r.id = str(value["id"])
        self.metrics.count(results)
        return {"results": [r.to_dict() for r in results]}

    async def get_reward(self, data: dict) -> dict:
        labels = data.get("labels")
        if not isinstance(labels, list):
            raise BadRequest(422, "'labels' must be a list (OpenRLHF sends query, prompts and labels)")
        queries = data.get("query")
        if queries is not None and (not isinstance(queries, list) or len(queries) != len(labels)):
            raise BadRequest(422, f"'query' must be a list as long as 'labels' ({len(labels)})")
        trajectories = await asyncio.to_thread(self.rollouts, labels, "labels")
        results = await self.rm.score(trajectories)
        self.metrics.count(results)
        rewards = [r.reward for r in results]  # numbers: the service runs with on_failure: zero
        return {"rewards": rewards, "scores": rewards, "extra_logs": sample_logs(results)}

    def health(self) -> tuple[int, dict]:
        state = self.rm.health()
        down = any(part.get("down") for part in state.values())
        return (503 if down else 200), {
            "status": "down" if down else "ok",
            **state,
            "in_flight": self.in_flight,
            "queue_size": self.limits.queue_size,
        }


def create_app(rm: RewardModel, limits: ServiceLimits):
    """The FastAPI application (fastapi is imported here: the core install works without it)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse

    service = RewardService(rm, limits)
    app = FastAPI(title="keyshot reward", docs_url=None, redoc_url=None)
    app.state.service = service

    async def serve(route: str, request: Request, handle) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limits.max_body_bytes:
            message = f"body of {int(declared):,} bytes is over the limit of {limits.max_body_bytes:,}"
            service.metrics.observe(route, 413, 0.0)
            return JSONResponse({"error": message}, status_code=413)
        body = await request.body()
        status, payload, headers = await service.admitted(
            route, request.headers.get("authorization"), body, handle
        )
        return JSONResponse(payload, status_code=status, headers=headers)

    @app.post("/v1/reward")
    async def reward(request: Request):
        return await serve("/v1/reward", request, service.reward)

    @app.post("/get_reward")
    async def get_reward(request: Request):
        return await serve("/get_reward", request, service.get_reward)

    @app.get("/health")
    async def health():
        status, payload = service.health()
        return JSONResponse(payload, status_code=status)

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(
            service.metrics.text(service.in_flight), media_type="text/plain; version=0.0.4"
        )

    @app.on_event("shutdown")
    async def close() -> None:
        await rm.aclose()

    return app


def run_service(rm: RewardModel, limits: ServiceLimits, host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn stops accepting and finishes the requests in flight)."""
    import uvicorn

    app = create_app(rm, limits)
    service: RewardService = app.state.service
    allowed = Path(limits.allow_root).resolve()

    class Server(uvicorn.Server):
        """uvicorn's server, saying when it listens (on the port it bound: ``--port 0`` lets the kernel
        choose) and when it stops."""

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:  # bound, and serve() put its signal handlers in place before startup
                bound = [s.getsockname() for server in self.servers for s in server.sockets]
                where = f"http://{host}:{bound[0][1] if bound else port}"
                print(f"keyshot reward serve: listening on {where} (allow root {allowed})", flush=True)

        async def shutdown(self, sockets=None) -> None:
            print(
                f"keyshot reward serve: stopping: no new requests; answering the {service.in_flight} in flight",
                flush=True,
            )
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(limits.deadline_s),
        lifespan="on",
    )
    Server(config).run()
