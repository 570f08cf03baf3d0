"""What the official ``openai`` client costs as keyshot's transport (infer/client/transport.py).

Baseline, measured in the same run: one shared ``httpx2.AsyncClient`` posting the same JSON body
(what keyshot sent with before). Both send real screenshot-scoring requests (a bundled Online-Mind2Web
screenshot as a JPEG data URL, ~``--kib`` KiB of JSON each) to one fake OpenAI server in its own
process, ``--concurrency`` at a time; the server answers at once, so the client's own cost shows.
Prints requests/s of both and their ratio, and writes JSON with ``--json``.

    .venv/bin/python -m bench.transport [--requests 600] [--concurrency 8] [--json F]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time

import httpx2

from bench import record
from bench.record import REPO, Rows, ratio_table
from keyshot.infer.client.transport import authorization, openai_client
from keyshot.infer.protocol.messages import scorer_messages
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.fake_openai import spawn_fake_openai

SCREENSHOT = REPO / "infer/samples/48c73f3f53e2611c4a1052457c1033db/trajectory/1.jpg"


def _payload() -> dict:
    image = "data:image/jpeg;base64," + base64.b64encode(SCREENSHOT.read_bytes()).decode()
    messages = scorer_messages(load_prompt_set(), "Find a one-way flight", "1. one-way\n2. date", image)
    return {"model": "scorer", "messages": messages, "max_tokens": 512, "temperature": 0.0, "seed": 0}


async def _burst(send, requests: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            response = await send()
            assert response.status_code == 200 and response.json()["choices"], response.text[:200]

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    return time.perf_counter() - start


async def _measure(base_url: str, payload: dict, requests: int, concurrency: int, rounds: int) -> dict:
    body = json.dumps(payload).encode()
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    plain = httpx2.AsyncClient(timeout=60, limits=limits)
    api = openai_client(base_url, timeout_s=60, max_connections=concurrency)
    url = base_url.rstrip("/") + "/chat/completions"

    def send_plain():
        return plain.post(url, content=body, headers={"Content-Type": "application/json"})

    def send_openai():
        return api.post(
            "/chat/completions",
            cast_to=httpx2.Response,
            body=payload,
            options={"headers": authorization(None)},
        )

    times = {"httpx2": [], "openai": []}
    try:
        for _ in range(rounds):  # interleaved, so drift on a noisy machine hits both alike
            times["httpx2"].append(await _burst(send_plain, requests, concurrency))
            times["openai"].append(await _burst(send_openai, requests, concurrency))
    finally:
        await plain.aclose()
        await api.close()
    best = {k: min(v) for k, v in times.items()}
    return {
        "requests_per_s": {k: requests / t for k, t in best.items()},
        "ratio_openai_over_httpx2": best["openai"] / best["httpx2"],
    }


def rows_of(data: dict) -> Rows:
    rps, s = data["requests_per_s"], data["settings"]
    row = (
        "openai client (keyshot's transport) vs bare httpx2 post, wall time of a burst",
        f"{data['ratio_openai_over_httpx2']:.2f}×",
        f"{rps['openai']:.0f} vs {rps['httpx2']:.0f} requests/s; {s['requests']} scoring requests of "
        f"{s['request_kib']} KiB, {s['concurrency']} at a time, to a server answering at once",
    )
    return Rows((ratio_table([row]),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    record.json_option(ap)
    args = ap.parse_args(argv)
    payload = _payload()
    kib = len(json.dumps(payload)) / 1024
    with spawn_fake_openai("judge") as (base_url, _):
        result = asyncio.run(_measure(base_url, payload, args.requests, args.concurrency, args.rounds))
    result["settings"] = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "request_kib": round(kib, 1),
    }
    return record.finish(args.json, result, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    raise SystemExit(main())
