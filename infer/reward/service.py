"""``keyshot reward serve``: the reward model over HTTP (FastAPI on uvicorn), shared by trainer processes.

- ``POST /v1/reward``: ``{"rollouts": [{task, screenshots, actions, final_answer, id}, ...]}`` →
  ``{"results": [RewardResult.to_dict(), ...]}`` (or a rollout may be a trajectory folder's path);
- ``POST /get_reward``: OpenRLHF's ``--remote_rm_url``: ``{"query": [...], "prompts": [...], "labels":
  [...]}`` → ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``; a label is a trajectory folder's
  path or a JSON dict rollout;
- ``GET /health``: the judge's and scorer's breaker state and the queue; 503 when an endpoint is down;
- ``GET /metrics``: Prometheus text.

Every bad request is a 4xx with one ``{"error": "..."}`` line; the service keeps serving. Screenshot and
trajectory paths must lie inside ``--allow-root``. At most ``queue_size`` requests are admitted at once
(the others get 429 with ``Retry-After``); SIGTERM stops accepting and finishes the requests in flight.
"""

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keyshot.infer.loaders import load_trajectory
from keyshot.infer.loaders.common import InputScope
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.reward.model import RewardModel, RewardResult
from keyshot.infer.reward.openrlhf import label_rollout
from keyshot.infer.reward.rollouts import RolloutError, from_dict

logger = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass
class ServiceLimits:
    allow_root: str = "."
    max_body_bytes: int = 256 * 1024 * 1024
    max_screenshots: int = 200
    max_rollouts: int = 1024
    queue_size: int = 64
    deadline_s: float = 600.0
    token_env: str | None = None


class BadRequest(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


@dataclass
class Metrics:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)
    latency: dict[str, list[float]] = field(default_factory=dict)
    rollouts: int = 0
    failures: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests[(route, status)] = self.requests.get((route, status), 0) + 1
        self.latency.setdefault(route, []).append(seconds)
        self.latency[route] = self.latency[route][-10000:]

    def count(self, results: list[RewardResult]) -> None:
        self.rollouts += len(results)
        self.failures += sum(r.error is not None for r in results)
        for r in results:
            for role, n in r.calls.items():
                self.calls[role] = self.calls.get(role, 0) + n
            for role, n in r.cached_calls.items():
                self.cached[role] = self.cached.get(role, 0) + n

    def text(self, queue_depth: int) -> str:
        lines = ["# TYPE keyshot_reward_requests_total counter"]
        for (route, status), n in sorted(self.requests.items()):
            lines.append(f'keyshot_reward_requests_total{{route="{route}",code="{status}"}} {n}')
        lines.append("# TYPE keyshot_reward_request_seconds histogram")
        for route, values in sorted(self.latency.items()):
            for bound in LATENCY_BUCKETS:
                count = sum(v <= bound for v in values)
                lines.append(f'keyshot_reward_request_seconds_bucket{{route="{route}",le="{bound}"}} {count}')
            lines.append(f'keyshot_reward_request_seconds_bucket{{route="{route}",le="+Inf"}} {len(values)}')
            lines.append(f'keyshot_reward_request_seconds_sum{{route="{route}"}} {sum(values):.6f}')
            lines.append(f'keyshot_reward_request_seconds_count{{route="{route}"}} {len(values)}')
        lines += [
            "# TYPE keyshot_reward_rollouts_total counter",
            f"keyshot_reward_rollouts_total {self.rollouts}",
        ]
        lines += [
            "# TYPE keyshot_reward_failures_total counter",
            f"keyshot_reward_failures_total {self.failures}",
        ]
        lines.append("# TYPE keyshot_reward_calls_total counter")
        for role, n in sorted(self.calls.items()):
            lines.append(f'keyshot_reward_calls_total{{role="{role}"}} {n}')
        lines.append("# TYPE keyshot_reward_cache_hits_total counter")
        for role, n in sorted(self.cached.items()):
            lines.append(f'keyshot_reward_cache_hits_total{{role="{role}"}} {n}')
        lines += ["# TYPE keyshot_reward_queue_depth gauge", f"keyshot_reward_queue_depth {queue_depth}"]
        return "\n".join(lines) + "\n"


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

    def rollout(self, value: Any, position: int) -> Trajectory:
        """One rollout of a request, read and checked (a 4xx naming it otherwise)."""
        where = f"rollout {position}"
        if isinstance(value, str):
            path = Path(value)
            if not self.scope.contains(path):
                raise BadRequest(403, f"{where}: {value} is outside the allowed root ({self.scope.roots[0]})")
            try:
                trajectory = load_trajectory(path, allow_outside=())
            except TrajectoryError as exc:
                raise BadRequest(422, f"{where}: {exc}") from None
        elif isinstance(value, dict):
            shots = value.get("screenshots")
            if isinstance(shots, list) and len(shots) > self.limits.max_screenshots:
                raise BadRequest(
                    413,
                    f"{where}: {len(shots):,} screenshots, over the limit of {self.limits.max_screenshots}",
                )
            try:
                trajectory = from_dict(value, where, self.limits.allow_root)
            except RolloutError as exc:
                status = 403 if "outside the allowed root" in str(exc) else 422
                raise BadRequest(status, str(exc)) from None
        else:
            raise BadRequest(422, f"{where}: a rollout is an object or a trajectory folder's path")
        if trajectory.num_screenshots > self.limits.max_screenshots:
            raise BadRequest(
                413,
                f"{where}: {trajectory.num_screenshots:,} screenshots, over the limit of {self.limits.max_screenshots}",
            )
        return trajectory

    def rollouts(self, values: Any, what: str) -> list[Trajectory]:
        if not isinstance(values, list) or not values:
            raise BadRequest(422, f"'{what}' must be a non-empty list")
        if len(values) > self.limits.max_rollouts:
            raise BadRequest(413, f"{len(values):,} rollouts, over the limit of {self.limits.max_rollouts}")
        return [self.rollout(v, i) for i, v in enumerate(values)]

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
        try:
            rollouts = [label_rollout(label) for label in labels]
        except json.JSONDecodeError as exc:
            raise BadRequest(422, f"a label is neither a trajectory path nor a JSON rollout: {exc}") from None
        trajectories = await asyncio.to_thread(self.rollouts, rollouts, "labels")
        results = await self.rm.score(trajectories)
        self.metrics.count(results)
        rewards = [r.reward for r in results]
        return {
            "rewards": rewards,
            "scores": rewards,
            "extra_logs": {
                "keyshot_failed": [float(r.error is not None) for r in results],
                "keyshot_progress": [r.progress if r.progress is not None else -1.0 for r in results],
            },
        }

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

    config = uvicorn.Config(
        create_app(rm, limits),
        host=host,
        port=port,
        log_level="warning",
        timeout_graceful_shutdown=int(limits.deadline_s),
        lifespan="on",
    )
    server = uvicorn.Server(config)
    print(
        f"keyshot reward serve: listening on http://{host}:{port} (allow root {Path(limits.allow_root).resolve()})",
        flush=True,
    )
    server.run()
