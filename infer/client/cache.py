"""A persistent cache of judge/teacher completions, so that no call is ever paid twice.

SQLite in WAL mode: several processes (parallel judging runs, a run that was killed and resumed)
can share one file, and a call one of them is paying for is not sent by another: it waits for the
answer to land in the file (:meth:`CallCache.claim`). The key is the sha256 of the canonical JSON of everything that changes the
answer: model, prompt version, messages (images included, as data URLs) and generation parameters.
Only well-formed completions are stored, and each is committed before the call returns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import pid_alive

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS completions (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    text TEXT NOT NULL,
    finish_reason TEXT,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    logprobs TEXT,
    created REAL NOT NULL
)
"""
# Who is paying for a call right now, so that processes sharing the file send it once (see CallCache.claim).
_CLAIMS = """
CREATE TABLE IF NOT EXISTS claims (
    key TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    claimed REAL NOT NULL
)
"""


class CacheError(KeyshotError, RuntimeError):
    """The cache file cannot be opened or is not a keyshot call cache."""


def cache_key(model: str, prompt_version: str, messages: list[dict], params: dict[str, Any]) -> str:
    """Stable hash of one call. ``params`` holds the generation parameters that change the answer
    (max tokens, temperature, seed, logprobs, extra body); ``None`` values are dropped so that an
    absent and an explicit-null parameter hash the same."""
    payload = {
        "model": model,
        "prompt_version": prompt_version,
        "messages": messages,
        "params": {k: v for k, v in params.items() if v is not None},
    }
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedCompletion:
    key: str
    model: str
    prompt_version: str
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    logprobs: list[dict] | None
    created: float


class CallCache:
    """SQLite-backed completion cache, safe for threads and for concurrent processes."""

    def __init__(self, path: str | Path, timeout_s: float = 60.0):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._host, self._pid = socket.gethostname(), os.getpid()
        self._owner = f"{self._host}:{self._pid}:{uuid.uuid4().hex[:8]}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(self.path), timeout=timeout_s, check_same_thread=False, isolation_level=None
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(_SCHEMA)
            self._conn.execute(_CLAIMS)
        except sqlite3.DatabaseError as exc:
            raise CacheError(f"{self.path}: cannot open as a call cache ({exc})") from exc

    def get(self, key: str) -> CachedCompletion | None:
        with self._lock:
            row = self._conn.execute(
                "SELECT key, model, prompt_version, text, finish_reason, prompt_tokens, completion_tokens,"
                " cost_usd, logprobs, created FROM completions WHERE key = ?",
                (key,),
            ).fetchone()
        if row is None:
            return None
        return CachedCompletion(
            key=row[0],
            model=row[1],
            prompt_version=row[2],
            text=row[3],
            finish_reason=row[4],
            prompt_tokens=row[5],
            completion_tokens=row[6],
            cost_usd=row[7],
            logprobs=json.loads(row[8]) if row[8] is not None else None,
            created=row[9],
        )

    def put(
        self,
        key: str,
        *,
        model: str,
        prompt_version: str,
        text: str,
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
        cost_usd: float,
        logprobs: list[dict] | None = None,
    ) -> None:
        """Store one completion (committed when this returns). An existing key is kept as is."""
        with self._lock:
            self._conn.execute(
                "INSERT OR IGNORE INTO completions (key, model, prompt_version, text, finish_reason,"
                " prompt_tokens, completion_tokens, cost_usd, logprobs, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    key,
                    model,
                    prompt_version,
                    text,
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                    cost_usd,
                    json.dumps(logprobs) if logprobs is not None else None,
                    time.time(),
                ),
            )

    def claim(self, key: str, stale_s: float) -> bool:
        """The right to pay for ``key``: True unless another live process sharing this file holds it.

        A claim is dropped by :meth:`release` when its call ends, answered or not. A claim whose process
        is gone (same host, no such pid) or that is older than ``stale_s`` (a killed process on another
        host) is taken over, so a crash never blocks a call.
        """
        now = time.time()
        with self._lock:
            for _ in range(3):
                cur = self._conn.execute(
                    "INSERT OR IGNORE INTO claims (key, owner, host, pid, claimed) VALUES (?, ?, ?, ?, ?)",
                    (key, self._owner, self._host, self._pid, now),
                )
                if cur.rowcount == 1:
                    return True
                row = self._conn.execute(
                    "SELECT owner, host, pid, claimed FROM claims WHERE key = ?", (key,)
                ).fetchone()
                if row is None:
                    continue  # released meanwhile: claim it
                owner, host, pid, claimed = row
                if owner == self._owner:
                    return True
                if not (now - claimed > stale_s or (host == self._host and not pid_alive(pid))):
                    return False
                cur = self._conn.execute(
                    "UPDATE claims SET owner = ?, host = ?, pid = ?, claimed = ? WHERE key = ? AND owner = ?",
                    (self._owner, self._host, self._pid, now, key, owner),
                )
                if cur.rowcount == 1:
                    logger.info("call %s: taking over the claim of %s (gone)", key[:12], owner)
                    return True
            return False

    def release(self, key: str) -> None:
        """Drop this handle's claim on ``key`` (its answer is stored, or the call failed)."""
        with self._lock:
            self._conn.execute("DELETE FROM claims WHERE key = ? AND owner = ?", (key, self._owner))

    def __len__(self) -> int:
        with self._lock:
            return self._conn.execute("SELECT COUNT(*) FROM completions").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> CallCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CallCache({str(self.path)!r})"
