"""Judge calls and tokens per trajectory: keyshot (a scorer scores) vs the reference configuration.

    python bench/bench_calls.py                          # the fixture trajectories
    python bench/bench_calls.py runs/agentlab --json runs/bench_calls.json

Both configurations judge the same trajectories with the same WebJudge pipeline, in one process.
The judge is the test suite's deterministic fake OpenAI server (``infer/testing/fake_openai.py``):
it answers all three steps and counts tokens with a stand-in tokenizer (characters / 4, 1,000 per
image: about what GPT-4o bills for a 1280×720 screenshot at high detail). In the keyshot
configuration a second fake server plays the scorer, with the same scoring rule, so both
configurations keep the same screenshots and send the same outcome call; the difference is who
scores the N screenshots. Ratios are reference / keyshot, measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the fake judge lives in tests/support

from infer.client import EndpointConfig, JudgeClient  # noqa: E402
from infer.images import DEFAULT_POLICY  # noqa: E402
from infer.pipeline import WebJudge  # noqa: E402
from infer.prompts import load_prompt_set  # noqa: E402
from infer.scorer import OpenAIScorer  # noqa: E402
from infer.testing.fake_openai import FakeOpenAI, make_judge  # noqa: E402
from infer.trajectory import Trajectory, load_trajectories  # noqa: E402
from infer.verdicts import Verdict  # noqa: E402

logger = logging.getLogger(__name__)

FIXTURES = REPO / "tests" / "fixtures"
DEFAULT_PATHS = [
    FIXTURES / "trajectories" / "agentlab",
    FIXTURES / "agentlab_small",
    FIXTURES / "trajectories" / "online_mind2web_v1",
    FIXTURES / "trajectories" / "online_mind2web_v2",
    FIXTURES / "trajectories" / "jsonl" / "trajectories.jsonl",
]


@dataclass(frozen=True)
class Result:
    configuration: str
    trajectories: int
    screenshots_per_trajectory: float
    judge_calls_per_trajectory: float
    judge_prompt_tokens_per_trajectory: float
    judge_completion_tokens_per_trajectory: float
    scorer_calls_per_trajectory: float
    http_requests_to_judge: int


def _endpoint(url: str, name: str) -> EndpointConfig:
    return EndpointConfig(base_url=url, model=name, api_key_env=None, max_concurrency=16, timeout_s=60)


async def _judge(webjudge: WebJudge, trajectories: list[Trajectory]) -> list[Verdict]:
    try:
        return [await webjudge.judge(t) for t in trajectories]
    finally:
        await webjudge.aclose()


def _result(name: str, verdicts: list[Verdict], requests: int) -> Result:
    n = len(verdicts)
    failed = [v.error for v in verdicts if v.error]
    if failed:
        raise RuntimeError(f"{name}: {len(failed)} trajectories failed, e.g. {failed[0]}")
    return Result(
        configuration=name,
        trajectories=n,
        screenshots_per_trajectory=sum(len(v.screenshots) for v in verdicts) / n,
        judge_calls_per_trajectory=sum(v.usage["judge"].calls for v in verdicts) / n,
        judge_prompt_tokens_per_trajectory=sum(v.usage["judge"].prompt_tokens for v in verdicts) / n,
        judge_completion_tokens_per_trajectory=sum(v.usage["judge"].completion_tokens for v in verdicts) / n,
        scorer_calls_per_trajectory=sum(v.usage["scorer"].calls for v in verdicts) / n,
        http_requests_to_judge=requests,
    )


def bench(trajectories: list[Trajectory]) -> list[Result]:
    prompts = load_prompt_set()
    with (
        FakeOpenAI(make_judge(), model="fake-judge") as judge_srv,
        FakeOpenAI(make_judge(), model="fake-scorer") as scorer_srv,
    ):
        scorer = OpenAIScorer(
            JudgeClient(_endpoint(scorer_srv.base_url, "fake-scorer")), prompts, policy=DEFAULT_POLICY
        )
        keyshot = asyncio.run(
            _judge(WebJudge(JudgeClient(_endpoint(judge_srv.base_url, "fake-judge")), scorer), trajectories)
        )
        keyshot_requests = judge_srv.stats.requests
        reference = asyncio.run(
            _judge(WebJudge(JudgeClient(_endpoint(judge_srv.base_url, "fake-judge")), None), trajectories)
        )
        reference_requests = judge_srv.stats.requests - keyshot_requests
    kept_a = [v.kept for v in keyshot]
    kept_b = [v.kept for v in reference]
    if kept_a != kept_b:
        logger.warning("the two configurations kept different screenshots: %s vs %s", kept_a, kept_b)
    return [
        _result("keyshot (scorer scores; judge: key points + outcome)", keyshot, keyshot_requests),
        _result("reference (judge scores every screenshot)", reference, reference_requests),
    ]


def table(results: list[Result]) -> str:
    keyshot, reference = results
    lines = [
        "| configuration | trajectories | screenshots/traj | judge calls/traj | judge prompt tok/traj | judge completion tok/traj | scorer calls/traj |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.configuration} | {r.trajectories} | {r.screenshots_per_trajectory:.1f} | "
            f"{r.judge_calls_per_trajectory:.1f} | {r.judge_prompt_tokens_per_trajectory:,.0f} | "
            f"{r.judge_completion_tokens_per_trajectory:,.0f} | {r.scorer_calls_per_trajectory:.1f} |"
        )
    lines.append(
        f"| **ratio reference / keyshot** | | | {reference.judge_calls_per_trajectory / keyshot.judge_calls_per_trajectory:.2f}x | "
        f"{reference.judge_prompt_tokens_per_trajectory / keyshot.judge_prompt_tokens_per_trajectory:.2f}x | "
        f"{reference.judge_completion_tokens_per_trajectory / keyshot.judge_completion_tokens_per_trajectory:.2f}x | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "paths", nargs="*", type=Path, help="trajectory folders/files (default: the test fixtures)"
    )
    ap.add_argument("--json", dest="json_out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    trajectories = [t for p in (args.paths or DEFAULT_PATHS) for t in load_trajectories(p, on_error="skip")]
    if not trajectories:
        print("no trajectories found", file=sys.stderr)
        return 2
    results = bench(trajectories)
    print(table(results))
    if args.json_out:
        keyshot, reference = results
        payload = {
            "results": [asdict(r) for r in results],
            "ratios_reference_over_keyshot": {
                "judge_calls": reference.judge_calls_per_trajectory / keyshot.judge_calls_per_trajectory,
                "judge_prompt_tokens": reference.judge_prompt_tokens_per_trajectory
                / keyshot.judge_prompt_tokens_per_trajectory,
                "judge_completion_tokens": reference.judge_completion_tokens_per_trajectory
                / keyshot.judge_completion_tokens_per_trajectory,
            },
            "tokenizer": "fake server stand-in: len(text)//4 per message + 1000 per image",
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
            },
        }
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
