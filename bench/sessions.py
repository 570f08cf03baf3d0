"""What ``keyshot reward env`` itself holds per OpenEnv session, beside Chromium's page: the figure
``keyshot.env.miniwob.budget.observation_mib`` is made from (MIB_PER_SESSION_1280X720).

    .venv/bin/python -m bench.sessions [--sessions 8,32] [--viewport 1280x720] [--json FILE]

The server (in .venv-openenv, against the fake judge) serves OpenEnv's own clients
(tests/framework/openenv_client.py, run as a file): each count of sessions plays one episode (a reset, ``noop()`` up to
``--max-steps``) and stays connected, as a trainer's sessions wait between their steps, while OpenEnv's
handler keeps each session's last answer. Then the RSS of the server's own Python process is read (its
Chromium and workers are the page budget's). Printed: one JSON line per count, then the slope per session
and its ratio to the recorded figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench import record
from bench.record import REPO, Rows, ratio_table
from keyshot.env.miniwob import budget as recorded
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.frameworks import framework_python
from keyshot.infer.testing.launch import start_reward_env

CLIENT = REPO / "tests" / "framework" / "openenv_client.py"


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def measure(count: int, viewport: str, max_steps: int, tmp: Path) -> dict:
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        scorer_endpoint = {"base_url": scorer.base_url, "model": "webjudge-7b", "api_key_env": None}
        config = fake_judge_config(tmp / "reward.yaml", judge.base_url, {"endpoint": scorer_endpoint})
        extra = ["--miniwob", "click-test", "--max-steps", str(max_steps), "--viewport", viewport]
        python = framework_python("openenv")
        with open(tmp / f"server-{count}.log", "w") as log:
            try:
                served = start_reward_env(
                    python, config, *extra, "--max-sessions", str(count), stderr=log, timeout_s=600
                )
            except RuntimeError as exc:
                raise SystemExit(f"{exc}: {(tmp / f'server-{count}.log').read_text()[-2000:]}") from None
        try:
            idle = rss_mib(served.proc.pid)
            driver = subprocess.Popen(
                [str(python), str(CLIENT), served.url, str(count)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            started = time.monotonic()
            episodes = [{"client": i, "seed": i, "agent": "noop"} for i in range(count)]
            driver.stdin.write(json.dumps(episodes) + "\n")
            driver.stdin.flush()
            played = json.loads(driver.stdout.readline() or "null")
            if not played:
                raise SystemExit(f"the clients ended (exit {driver.wait()}) before their episodes did")
            seconds = time.monotonic() - started
            time.sleep(2)
            held = rss_mib(served.proc.pid)  # the sessions still connected, their last answers held
            driver.stdin.close()
            driver.wait(timeout=120)
        finally:
            served.stop(grace_s=120)
    shape = played[0]["shape"]
    return {
        "sessions": count,
        "idle_mib": round(idle),
        "held_mib": round(held),
        "shape": shape,
        "s": round(seconds, 1),
    }


def rows_of(data: dict) -> Rows:
    counts = data["counts"]
    held = ", ".join(f"{c['sessions']} sessions {c['held_mib']} MiB" for c in counts)
    row = (
        f"OpenEnv's clients, each session one episode (reset, `noop()` to `--max-steps {data['max_steps']}`) at "
        f"{data['viewport']} and left connected, as a trainer's sessions wait: RSS of the server's Python "
        f"process, slope over {' and '.join(str(c['sessions']) for c in counts)} sessions",
        f"{data['mib_per_session']:.1f} MiB a session",
        f"idle {counts[0]['idle_mib']} MiB; {held}; each screenshot {'x'.join(map(str, counts[0]['shape']))}",
    )
    return Rows((ratio_table([row]),))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", default="8,32", help="session counts, comma-separated")
    parser.add_argument("--viewport", default="1280x720")
    parser.add_argument("--max-steps", type=int, default=2)
    record.json_option(parser)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in (int(n) for n in args.sessions.split(",")):
            rows.append(measure(count, args.viewport, args.max_steps, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    (a, b) = rows[0], rows[-1]
    slope = (b["held_mib"] - a["held_mib"]) / (b["sessions"] - a["sessions"])
    print(
        f"server memory per session at {args.viewport}: {slope:.1f} MiB "
        f"({slope / recorded.MIB_PER_SESSION_1280X720:.2f}x the recorded {recorded.MIB_PER_SESSION_1280X720} MiB)"
    )
    data = {
        "viewport": args.viewport,
        "max_steps": args.max_steps,
        "counts": rows,
        "mib_per_session": slope,
    }
    return record.finish(args.json, data, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
