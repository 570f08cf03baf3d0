"""The threshold sweep's cost (``keyshot sweep``) against judging each δ again: calls, tokens and seconds.

    python -m bench.sweep                      # 24 trajectories of 8 screenshots, δ = 2,3,4
    python -m bench.sweep --trajectories 40 --screenshots 12 --latency 0.1 --json runs/bench/sweep.json

Three ways to get verdicts at δ = 2, 3, 4 for the same trajectories, all in this run, all through keyshot's
own code (``keyshot judge``'s run, ``keyshot sweep``'s run) against two local fake OpenAI servers (judge and
scorer, ``infer/testing/fake_openai.py``; each answer waits ``--latency`` seconds, a stand-in for a model's
time; tokens counted by the fake's stand-in tokenizer: characters / 4, 1,000 per image):

* ``scratch``: ``keyshot judge`` with threshold=δ into a new folder with a new call cache, once per δ (a user
  who knows nothing of the cache): key points, every screenshot's score and the outcome, three times;
* ``judge again, shared cache``: ``keyshot judge`` with threshold=δ into a new folder, the δ=3 run's cache
  given (``cache=``): key points and scores come from the cache; the screenshots are read and prepared
  again, and the outcome is asked;
* ``sweep``: ``keyshot sweep`` over the δ=3 run: key points and scores from the verdicts, only the outcome.

The last two each start from a copy of the first run's call cache, so neither answers the other's calls.

The first judged run (δ = 3, the paper's) is what the last two start from; its cost is printed apart and in
neither. Ratios are scratch / sweep and shared-cache / sweep, measured in this run.
"""

from __future__ import annotations

import argparse
import logging
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import record
from bench.record import Headline, Rows, Table
from keyshot.infer.common.config import load_config
from keyshot.infer.judge.command import run_judge
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.threshold_sweep import run_sweep
from keyshot.infer.testing.fake_openai import FakeOpenAI, count_prompt_tokens, identify_step, make_judge
from keyshot.infer.testing.worlds import synthetic_trajectories

logger = logging.getLogger(__name__)
DELTAS = (2, 3, 4)


class Counting:
    """A fake responder that counts requests and prompt tokens by WebJudge step."""

    def __init__(self, responder) -> None:
        self.responder = responder
        self.calls: Counter = Counter()
        self.tokens: Counter = Counter()

    def __call__(self, request: dict) -> str:
        step = identify_step(request)
        self.calls[step] += 1
        self.tokens[step] += count_prompt_tokens(request)
        return self.responder(request)

    def snapshot(self) -> tuple[Counter, Counter]:
        return Counter(self.calls), Counter(self.tokens)


def _config(judge_url: str, scorer_url: str, out: Path, delta: int, cache: Path | None) -> JudgeRunConfig:
    overrides = [
        f"judge.base_url={judge_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        f"scorer.endpoint.base_url={scorer_url}",
        "scorer.endpoint.model=fake-scorer",
        "scorer.endpoint.api_key_env=null",
        f"pipeline.threshold={delta}",
        "pipeline.outcome_logprobs=5",
        f"out={out}",
        "concurrency=8",
    ]
    if cache is not None:
        overrides.append(f"cache={cache}")
    return load_config(JudgeRunConfig, None, overrides)


def _arm(judge: Counting, scorer: Counting, job) -> dict:
    j0, jt0 = judge.snapshot()
    s0, st0 = scorer.snapshot()
    t0 = time.perf_counter()
    job()
    seconds = time.perf_counter() - t0
    j1, jt1 = judge.snapshot()
    s1, st1 = scorer.snapshot()
    calls = (j1 - j0) + (s1 - s0)
    tokens = (jt1 - jt0) + (st1 - st0)
    return {
        "calls": sum(calls.values()),
        "calls_by_step": dict(sorted(calls.items())),
        "prompt_tokens": sum(tokens.values()),
        "prompt_tokens_by_step": dict(sorted(tokens.items())),
        "seconds": seconds,
    }


def bench(n: int, screenshots: int, latency: float, root: Path) -> dict:
    source = synthetic_trajectories(root / "trajectories", n, screenshots, seed=3, size=(640, 400))
    judge = Counting(make_judge("evidence"))
    scorer = Counting(make_judge())
    with (
        FakeOpenAI(judge, latency_s=latency) as judge_srv,
        FakeOpenAI(scorer, latency_s=latency) as scorer_srv,
    ):
        urls = (judge_srv.base_url, scorer_srv.base_url)
        base = root / "judged_d3"
        first = _arm(
            judge, scorer, lambda: run_judge([str(source)], _config(*urls, base, 3, None), progress=False)
        )

        def cache_copy(name: str) -> Path:
            """The first run's call cache as it was after it, for one arm alone."""
            folder = root / name
            folder.mkdir()
            for f in base.glob("calls.sqlite*"):
                shutil.copy2(f, folder / f.name)
            return folder / "calls.sqlite"

        shared_cache, sweep_cache = cache_copy("shared_cache"), cache_copy("sweep_cache")

        def scratch() -> None:
            for d in DELTAS:
                run_judge([str(source)], _config(*urls, root / f"scratch_d{d}", d, None), progress=False)

        def shared() -> None:
            for d in DELTAS:
                cfg = _config(*urls, root / f"shared_d{d}", d, shared_cache)
                run_judge([str(source)], cfg, progress=False)

        sweep_result: dict = {}

        def sweep() -> None:
            cfg = _config(*urls, root / "unused", 3, sweep_cache)
            sweep_result.update(run_sweep(base, cfg, list(DELTAS), root / "sweep", progress=False))

        arms = {
            "scratch": _arm(judge, scorer, scratch),
            "judge again, shared cache": _arm(judge, scorer, shared),
            "sweep": _arm(judge, scorer, sweep),
        }
    arms["sweep"]["sent_by_delta"] = [r["outcome_sent"] for r in sweep_result["per_delta"]]
    arms["sweep"]["calls_saved"] = sweep_result["totals"]["calls_saved"]
    return {
        "trajectories": n,
        "screenshots_per_trajectory": screenshots,
        "latency_s": latency,
        "deltas": list(DELTAS),
        "first_judged_run_d3": first,
        "arms": arms,
        "machine": platform.platform(),
    }


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b else "—"


def rows_of(result: dict) -> Rows:
    arms, first = result["arms"], result["first_judged_run_d3"]
    sweep = arms["sweep"]
    ways = {
        "scratch": "`keyshot judge` per δ from scratch (a new cache each)",
        "judge again, shared cache": "`keyshot judge` per δ with the δ=3 run's cache",
        "sweep": "`keyshot sweep` over the δ=3 run",
    }
    rows = []
    for name, a in arms.items():
        by = a["calls_by_step"]
        ratios = [_ratio(a[k], sweep[k]) for k in ("calls", "prompt_tokens", "seconds")]
        rows.append(
            (
                ways.get(name, name),
                f"{a['calls']} ({by.get('key_screenshot', 0)} / {by.get('key_points', 0)} / {by.get('outcome', 0)})",
                f"{a['prompt_tokens']:,}",
                f"{a['seconds']:.1f}",
                "1×" if name == "sweep" else " / ".join(ratios),
            )
        )
    columns = (
        "way",
        "calls sent (scorer / key points / outcome)",
        "prompt tokens sent",
        "seconds",
        "vs sweep: calls / tokens / seconds",
    )
    notes = (
        f"{result['trajectories']} synthetic trajectories of {result['screenshots_per_trajectory']} screenshots, "
        f"δ = {', '.join(map(str, result['deltas']))}, two fake OpenAI servers answering in {result['latency_s']} s. "
        f"The first judged run (δ = 3: {first['calls']} calls, {first['prompt_tokens']:,} prompt tokens, "
        f"{first['seconds']:.1f} s) is what the last two rows start from, each on its own copy of its call "
        f"cache; it is in no row. The sweep sent {', '.join(map(str, sweep['sent_by_delta']))} outcome calls "
        f"for δ = {', '.join(map(str, result['deltas']))} (a δ whose kept screenshots equal an earlier one's is "
        f"answered by the cache) and saved {sweep['calls_saved']} calls.",
    )
    scratch = arms["scratch"]
    headline = Headline(
        f"Verdicts at δ = {', '.join(map(str, result['deltas']))}: judging each δ from scratch / `keyshot sweep` "
        "of one judged run, calls sent",
        f"{_ratio(scratch['calls'], sweep['calls'])} ({scratch['calls']} vs {sweep['calls']})",
    )
    return Rows((Table(columns, tuple(rows)),), (headline,), notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=24)
    parser.add_argument("--screenshots", type=int, default=8)
    parser.add_argument("--latency", type=float, default=0.05, help="seconds each fake answer takes")
    record.json_option(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        result = bench(args.trajectories, args.screenshots, args.latency, Path(tmp))
    return record.finish(args.json, result, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
