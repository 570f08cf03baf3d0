"""A local OpenAI-compatible chat server for tests, with deterministic judges and injected faults.

In-process::

    with FakeOpenAI(judge_responder, faults=FaultPlan({"429": 0.1, "timeout": 0.05}, seed=0)) as srv:
        client = JudgeClient(EndpointConfig(base_url=srv.base_url, model="fake-judge", api_key_env=None))
        ...
        srv.stats.completions_served

As a subprocess (so a test can kill -9 a judging process while the server keeps counting)::

    python -m keyshot.infer.testing.fake_openai --port 0 --responder judge --fault-rate 0.2 --seed 0

This module is the public face; each job has its own module:

* :mod:`~keyshot.infer.testing.fake_requests`: reading a request (its text, images, WebJudge step);
* :mod:`~keyshot.infer.testing.fake_rules`: the teachers' scoring rules on a screenshot's pixels;
* :mod:`~keyshot.infer.testing.fake_responders`: the judge, teacher and echo responders;
* :mod:`~keyshot.infer.testing.fake_faults`: the injected faults;
* :mod:`~keyshot.infer.testing.fake_server`: :class:`FakeOpenAI`, its routes, counters and completion bodies;
* :mod:`~keyshot.infer.testing.fake_spawn`: the server as a subprocess (this module's ``__main__``).
"""

from __future__ import annotations

import sys

from keyshot.infer.testing.fake_faults import FAULT_KINDS, FaultPlan
from keyshot.infer.testing.fake_requests import (
    ResponderError,
    count_prompt_tokens,
    decode_image,
    identify_step,
    system_text,
    user_parts,
)
from keyshot.infer.testing.fake_responders import (
    GARBAGE_TEXT,
    Responder,
    echo_responder,
    get_responder,
    is_follow_up,
    judge_responder,
    key_points_answer,
    make_judge,
    make_teacher,
    outcome_answer,
)
from keyshot.infer.testing.fake_rules import SCORE_RULES, score_image, stable_fraction
from keyshot.infer.testing.fake_server import FakeOpenAI, ServerStats
from keyshot.infer.testing.fake_spawn import fetch_stats, main, spawn_fake_openai

__all__ = [
    "FAULT_KINDS",
    "GARBAGE_TEXT",
    "SCORE_RULES",
    "FakeOpenAI",
    "FaultPlan",
    "Responder",
    "ResponderError",
    "ServerStats",
    "count_prompt_tokens",
    "decode_image",
    "echo_responder",
    "fetch_stats",
    "get_responder",
    "identify_step",
    "is_follow_up",
    "judge_responder",
    "key_points_answer",
    "main",
    "make_judge",
    "make_teacher",
    "outcome_answer",
    "score_image",
    "spawn_fake_openai",
    "stable_fraction",
    "system_text",
    "user_parts",
]


if __name__ == "__main__":
    sys.exit(main())
