"""Every benchmark: its module, its heading in RESULTS.md (in this order), and how ``make bench`` runs it or
why it does not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    name: str  # bench/<name>.py, `python -m bench.<name>`; its row files: bench/rows/<name>[.<label>].json
    title: str
    args: tuple[str, ...] = ()  # what `make bench` passes it beside --json
    not_run: str = ""  # why `make bench` leaves it out; its row files stay as they are
    # the framework venv it runs in (keyshot.infer.testing.frameworks), where not the one running make bench
    framework: str = ""


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("calls", "Judge cost per trajectory"),
    Benchmark("images", "Image policy"),
    Benchmark("presized", "Screenshots to vLLM"),
    Benchmark("transport", "Transport"),
    Benchmark("scorer", "Scorer throughput"),
    Benchmark("vision", "Vision tower"),
    Benchmark("synth", "Dataset building", ("--rows", "1000", "--small", "100")),
    Benchmark("train", "Training step"),
    Benchmark("report", "Report"),
    Benchmark("scale", "Scale-out"),
    Benchmark("ray_engine", "Judging on Ray Data"),
    Benchmark("faults", "Faults"),
    Benchmark("sweep", "Threshold sweep"),
    Benchmark("constrained", "Constrained answers", ("--answers", "60", "--limits", "64,128", "512,512")),
    Benchmark("reward", "Reward"),
    Benchmark("steps", "Rewards per step"),
    Benchmark("live", "Live episodes"),
    Benchmark(
        "pages",
        "Live pages per Chromium",
        not_run="long: 128 pages take about 13 GB and 10 minutes; other jobs must leave the room",
    ),
    Benchmark("sessions", "The reward env's memory per session", ("--sessions", "4,20")),
    Benchmark("step_buffers", "A step's buffers in the reward env", framework="openenv"),
    Benchmark(
        "openenv_trl",
        "TRL's BrowserGym example on keyshot reward env",
        not_run="long: at the example's 256 sessions a generation batch takes over an hour here",
    ),
    Benchmark("observation", "One step at OpenEnv's client"),
    Benchmark("soak", "Live soak", not_run="long: 512 episodes under kill -9, 10-30 minutes"),
    Benchmark(
        "gpu", "The GPU kit", not_run="needs a CUDA GPU (`make bench-gpu`; its own page: RESULTS-gpu.md)"
    ),
)

BY_NAME = {b.name: b for b in BENCHMARKS}
