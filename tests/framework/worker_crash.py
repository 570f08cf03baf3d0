"""A page that crashes while its worker waits on it (run by tests/env/test_miniwob_live.py with the browser
set-up's environment, as the pool runs env/miniwob/worker.py): two sessions of one Chromium, the first's
renderer crashed (CDP ``Page.crash``) while BrowserGym's ``wait_for_function`` waits on it, as MiniWoB's
setup does; then the second session steps.

    python -I tests/framework/worker_crash.py CHROMIUM

Prints one JSON object: seconds the wait took and what it raised, whether the session knows it crashed,
the worker's answer for it, and the second session's step.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "env" / "miniwob"))
import worker as worker_module  # noqa: E402  (the worker runs by path; so is it imported here)

from keyshot.env.miniwob.settings import SessionSettings  # noqa: E402

SETTINGS = SessionSettings()  # the deadlines the pool gives its workers


def main() -> None:
    worker = worker_module.Worker(sys.argv[1], *(int(a) for a in SETTINGS.worker_arguments()))
    try:
        crashed, other = worker.session("a"), worker.session("b")
        crashed.reset("click-test", 0, None)
        other.reset("click-test", 1, None)
        cdp = crashed.context.new_cdp_session(crashed.page)
        with contextlib.suppress(Exception):  # the crash may end the call itself
            cdp.send("Page.crash")
        started = time.monotonic()
        try:
            crashed.page.wait_for_function("() => window.never_true === 1")
            raised = None
        except Exception as exc:
            raised = f"{type(exc).__name__}: {exc}".splitlines()[0]
        waited = time.monotonic() - started
        with contextlib.suppress(Exception):
            crashed.after_action()
        try:
            crashed.after_action()
            answer = {}
        except Exception as exc:
            answer = worker._failed(7, crashed, exc)
        other.act("click('13')")
        step = other.after_action()
        print(
            json.dumps(
                {
                    "waited_s": waited,
                    "timeout_s": SETTINGS.page_timeout_s,
                    "raised": raised,
                    "crashed": crashed.crashed,
                    "answer": answer,
                    "other_reward": step["reward"],
                    "other_done": step["done"],
                }
            )
        )
    finally:
        worker.close()


if __name__ == "__main__":
    main()
