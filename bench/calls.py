"""Judge calls, tokens and dollars per trajectory: keyshot (a scorer scores) vs the reference configuration.

    python -m bench.calls                          # 40 trajectories at Online-Mind2Web length (27 shots avg)
    python -m bench.calls runs/agentlab --json runs/bench/calls.json
    python -m bench.calls --fixtures               # the test fixtures (3.4 screenshots each)

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
import logging
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench import record
from bench.record import REPO, Headline, Rows, Table, ratio_table
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.judge.pipeline import PipelineConfig, WebJudge
from keyshot.infer.judge.scorers import JUDGE_SCORES, OpenAIScorer
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.images import DEFAULT_POLICY
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.worlds import synthetic_trajectories

#: USD per million tokens (input, output), list prices
PRICES = {"gpt-4o": (2.50, 10.00), "o4-mini": (1.10, 4.40)}
#: The scorer's compute per screenshot at Qwen2.5-VL-7B shape (prefill of one 1280×720 request):
#: 2 · 7.6e9 LM parameters · ~1,300 tokens (1,196 visual + the prompt) + 2 · 0.67e9 vision parameters ·
#: 4,784 patches, and the answer's ~60 generated tokens at 2 · 7.6e9 each. Divided by an H100's dense
#: bf16 peak (989 TFLOP/s) it is a ceiling: no server reaches it (see bench/RESULTS-gpu.md for measured).
SCORER_FLOPS_PER_SCREENSHOT = 2 * 7.6e9 * 1300 + 2 * 0.67e9 * 4784 + 2 * 7.6e9 * 60
H100_BF16_FLOPS = 989e12
TEXT_ONLY = "keyshot, text-only outcome (DEVIATION: descriptions, no images; agreement not measured)"

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
            _judge(
                WebJudge(JudgeClient(_endpoint(judge_srv.base_url, "fake-judge")), JUDGE_SCORES), trajectories
            )
        )
        reference_requests = judge_srv.stats.requests - keyshot_requests
        scorer = OpenAIScorer(
            JudgeClient(_endpoint(scorer_srv.base_url, "fake-scorer")), prompts, policy=DEFAULT_POLICY
        )
        text_only = asyncio.run(
            _judge(
                WebJudge(
                    JudgeClient(_endpoint(judge_srv.base_url, "fake-judge")),
                    scorer,
                    PipelineConfig(outcome_images="none"),
                ),
                trajectories,
            )
        )
        text_only_requests = judge_srv.stats.requests - keyshot_requests - reference_requests
    kept_a = [v.kept for v in keyshot]
    kept_b = [v.kept for v in reference]
    if kept_a != kept_b:
        logger.warning("the two configurations kept different screenshots: %s vs %s", kept_a, kept_b)
    return [
        _result("keyshot (scorer scores; judge: key points + outcome)", keyshot, keyshot_requests),
        _result("reference (judge scores every screenshot)", reference, reference_requests),
        _result(TEXT_ONLY, text_only, text_only_requests),
    ]


def table(results: list[Result]) -> str:
    keyshot, reference = results[:2]
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


def realistic_lengths(n: int, mean: float = 27.0, seed: int = 0) -> list[int]:
    """Screenshots per trajectory spread like Online-Mind2Web's (right-skewed, 27 on average)."""
    raw = np.random.default_rng(seed).gamma(shape=3.0, scale=mean / 3.0, size=n)
    lengths = np.clip(np.rint(raw * mean / raw.mean()), 3, 120).astype(int)
    return [int(x) for x in lengths]


def costs(results: list[Result]) -> list[dict]:
    """Dollars per trajectory at each judge's list price, and per 1,000 trajectories."""
    rows = []
    for r in results:
        for model, (price_in, price_out) in PRICES.items():
            per = (
                r.judge_prompt_tokens_per_trajectory * price_in
                + r.judge_completion_tokens_per_trajectory * price_out
            ) / 1e6
            rows.append({"configuration": r.configuration, "judge": model, "usd_per_trajectory": per})
    return rows


def what_a_user_pays(results: list[Result], screenshots: float) -> Table:
    keyshot, reference, *others = results
    scale = 1000
    gpu_s = scale * screenshots * SCORER_FLOPS_PER_SCREENSHOT / H100_BF16_FLOPS
    ceiling = f"{gpu_s:,.0f} on one H100 (compute ceiling, not measured)"
    rows = []
    for r, gpu in (
        (keyshot, ceiling),
        (reference, "none (the judge scores)"),
        *((other, ceiling) for other in others),
    ):
        tokens = r.judge_prompt_tokens_per_trajectory + r.judge_completion_tokens_per_trajectory
        usd = {
            m: scale
            * (r.judge_prompt_tokens_per_trajectory * a + r.judge_completion_tokens_per_trajectory * b)
            / 1e6
            for m, (a, b) in PRICES.items()
        }
        rows.append(
            (
                r.configuration,
                f"{scale * r.judge_calls_per_trajectory:,.0f}",
                f"{scale * tokens:,.0f}",
                f"{usd['gpt-4o']:,.0f}",
                f"{usd['o4-mini']:,.0f}",
                gpu,
            )
        )
    columns = (
        "configuration",
        "judge API calls",
        "judge tokens (prompt + completion)",
        "$ with GPT-4o",
        "$ with o4-mini",
        "scorer GPU-seconds",
    )
    title = f"What a user pays per {scale:,} trajectories of {screenshots:.0f} screenshots:"
    return Table(columns, tuple(rows), title=title)


def rows_of(data: dict) -> Rows:
    keyshot, reference, *others = (Result(**r) for r in data["results"])
    ratios = data["ratios_reference_over_keyshot"]
    shots = (
        f"{keyshot.trajectories} trajectories, {keyshot.screenshots_per_trajectory:.1f} shots each on average"
    )
    deviation = [
        (
            "keyshot / text-only outcome (DEVIATION, outcome_images: none): judge prompt tokens",
            f"{keyshot.judge_prompt_tokens_per_trajectory / o.judge_prompt_tokens_per_trajectory:.2f}×",
            f"{keyshot.judge_prompt_tokens_per_trajectory:.0f} vs {o.judge_prompt_tokens_per_trajectory:.0f} per "
            "trajectory; whether its verdicts agree as often is not measured (needs real judges)",
        )
        for o in others
    ]
    reference_rows = [
        (
            f"reference configuration / keyshot: judge {what}",
            f"{ratios[key]:.2f}×",
            f"{getattr(reference, field):.1f} vs {getattr(keyshot, field):.1f} per trajectory ({shots})",
        )
        for what, key, field in (
            ("calls", "judge_calls", "judge_calls_per_trajectory"),
            ("prompt tokens", "judge_prompt_tokens", "judge_prompt_tokens_per_trajectory"),
            ("completion tokens", "judge_completion_tokens", "judge_completion_tokens_per_trajectory"),
        )
    ]
    headline = Headline(
        "Judge API calls per trajectory: WebJudge's reference configuration (the judge scores every "
        "screenshot) / keyshot (the scorer does)",
        f"{ratios['judge_calls']:.2f}× ({reference.judge_calls_per_trajectory:.1f} vs "
        f"{keyshot.judge_calls_per_trajectory:.1f})",
    )
    pays = what_a_user_pays([keyshot, reference, *others], keyshot.screenshots_per_trajectory)
    return Rows((ratio_table(deviation + reference_rows), pays), (headline,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "paths", nargs="*", type=Path, help="trajectory folders/files (default: synthetic, real length)"
    )
    ap.add_argument(
        "--fixtures", action="store_true", help="the test fixtures instead (3.4 screenshots each)"
    )
    ap.add_argument("--trajectories", type=int, default=40, help="synthetic trajectories to judge")
    record.json_option(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="keyshot-bench-calls-") as tmp:
        if args.paths or args.fixtures:
            paths = args.paths or DEFAULT_PATHS
        else:
            lengths = realistic_lengths(args.trajectories)
            paths = [synthetic_trajectories(Path(tmp), args.trajectories, lengths, seed=1, size=(1280, 720))]
        trajectories = [t for p in paths for t in load_trajectories(p, on_error="skip")]
        if not trajectories:
            print("no trajectories found", file=sys.stderr)
            return 2
        results = bench(trajectories)
    print(table(results))
    print()
    for row in costs(results):
        print(
            f"{row['configuration']}, judge {row['judge']}: ${row['usd_per_trajectory']:.4f} per trajectory"
        )
    print()
    keyshot, reference = results[:2]
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
        "costs": costs(results),
    }
    return record.finish(args.json, payload, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
