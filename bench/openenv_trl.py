"""TRL's own BrowserGym example (tests/fixtures/trl_browsergym/browsergym.py, unchanged) at its own size
against ``keyshot reward env`` (issue 45): its defaults make a generation batch of 8 x 32 = 256 rollouts,
each holding one OpenEnv session (one MiniWoB page) from its reset to the end of the batch.

The server runs in .venv-openenv, the example in .venv-openenv-trl (tools/setup_openenv.sh) through
tests/framework/openenv_trl_example.py: only what a CPU machine needs is set from outside the file (on the
CPU, no bf16, no trackio, the tiny random Qwen2.5-VL made to call ``noop`` every turn, one optimizer
step); the judge and scorer are the fake OpenAI servers (``--judge-latency-s`` slows the judge).

Reported: the peak memory (PSS) of the server's process tree (the server, its browser processes) and of
the trainer's, the most browser (Chromium) processes at once, the seconds per generation batch (TRL's
``_generate_and_score_completions``: the tool loop, the episodes and their rewards), the episodes ended,
judged (with a reward) and not, those past the server's deadline, resets refused (OpenEnv's capacity
error), TRL's logged mean reward, and the browser processes left 30 s after SIGTERM (the target: 0).

    nice .venv/bin/python -m bench.openenv_trl [--batch 8] [--accumulation 32] [--json FILE]
    nice .venv/bin/python -m bench.openenv_trl --batch 4 --accumulation 1 --max-steps 2  # a quick check (TRL: 4 generations)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench import record
from bench.record import REPO, Headline, Rows, Table
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.infer.testing.frameworks import framework_python, missing
from keyshot.infer.testing.launch import start_reward_env

EXAMPLE = REPO / "tests" / "fixtures" / "trl_browsergym" / "browsergym.py"
DRIVER = REPO / "tests" / "framework" / "openenv_trl_example.py"


COLUMNS = (
    "run",
    "sessions",
    "result",
    "seconds per generation batch",
    "peak PSS: server tree / trainer tree",
    "most Chromium processes",
    "episodes ended / judged / without reward / past the deadline / resets refused",
    "Chromium left 30 s after SIGTERM",
)


class Tree:
    """Samples a process and its descendants every ``every_s`` seconds: PSS (MiB), Chromium processes;
    remembers every Chromium process seen (pid, start time), re-parented ones included."""

    def __init__(self, pid: int, every_s: float = 2.0):
        self.root = psutil.Process(pid)
        self.every_s = every_s
        self.peak_mib = 0.0
        self.root_peak_mib = 0.0  # the root process alone (the server's Python: its sessions' answers)
        self.most_chromium = 0
        self.chromium: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        total, browsers = 0, 0
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            try:
                pss = p.memory_full_info().pss
                total += pss
                if p.pid == self.root.pid:
                    self.root_peak_mib = max(self.root_peak_mib, pss / 2**20)
                if "chrom" in p.name():
                    browsers += 1
                    self.chromium.setdefault(p.pid, p.create_time())
            except psutil.Error:  # ended between the listing and the reading
                pass
        self.peak_mib = max(self.peak_mib, total / 2**20)
        self.most_chromium = max(self.most_chromium, browsers)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def chromium_left(self, within_s: float) -> int:
        """Chromium processes seen during the run still running ``within_s`` after the call."""
        left = []
        for pid, started in self.chromium.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
        _, alive = psutil.wait_procs(left, timeout=within_s)
        return len(alive)


def run(args: argparse.Namespace, tmp: Path) -> dict:
    sessions = args.batch * args.accumulation
    with FakeOpenAI(make_judge("always_success")) as judge, FakeOpenAI(make_judge()) as scorer:
        judge.latency_s = args.judge_latency_s
        config = fake_judge_config(
            tmp / "reward.yaml",
            judge.base_url,
            {"endpoint": {"base_url": scorer.base_url, "model": "webjudge-7b", "api_key_env": None}},
            concurrency=32,
            judge={"timeout_s": 120},
        )
        log_path = tmp / "server.log"
        extra = [
            "--miniwob",
            "click-test",
            "--max-steps",
            str(args.max_steps),
            "--max-sessions",
            str(sessions),
        ]
        started = time.monotonic()
        with open(log_path, "w") as log:
            try:
                served = start_reward_env(
                    framework_python("openenv"), config, *extra, *args.server_arg, stderr=log, timeout_s=1800
                )
            except RuntimeError as exc:
                raise SystemExit(f"{exc}: {log_path.read_text()[-2000:]}") from None
        server, url = served.proc, served.url
        trainer = None
        try:
            opened_s = time.monotonic() - started
            server_tree = Tree(server.pid)
            plan = {
                "example": str(EXAMPLE),
                "policy": str(tmp / "policy"),
                "args": ["--space-url", url, "--max-steps", str(args.max_steps)]
                + ["--gradient-accumulation-steps", str(args.accumulation)],
                "config": {
                    "per_device_train_batch_size": args.batch,
                    "max_steps": 1,
                    "max_tool_calling_iterations": args.max_steps,
                    "log_completions": False,  # TRL 1.16's table fails on multimodal tool answers
                },
                "call": {"name": "noop", "arguments": {}},
                "out": str(tmp / "history.json"),
            }
            started = time.monotonic()
            trainer = subprocess.Popen(
                [str(framework_python("openenv", "trl")), str(DRIVER), json.dumps(plan)],
                cwd=tmp,
                stdout=subprocess.DEVNULL,
                stderr=open(tmp / "trainer.log", "w"),  # noqa: SIM115 (closed with the process)
            )
            trainer_tree = Tree(trainer.pid)
            try:
                code = trainer.wait(timeout=args.time_limit_s)
            except subprocess.TimeoutExpired:  # stopped: what it reached is reported
                for child in trainer_tree.root.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.kill()
                trainer.kill()
                code = f"stopped after {args.time_limit_s:g} s"
            trained_s = time.monotonic() - started
            trainer_tree.stop()
            server_tree.sample()
            server_tree.stop()
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=120)
            left = server_tree.chromium_left(within_s=30)
        finally:  # a bench stopped (SIGTERM, Ctrl-C, an error) ends what it started
            if trainer is not None and trainer.poll() is None:
                for child in psutil.Process(trainer.pid).children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        child.kill()
                trainer.kill()
            if server.poll() is None:
                server.send_signal(signal.SIGTERM)
                server.wait(timeout=120)
        steps = [identify_step(r) for r in judge.requests]
    stderr = log_path.read_text()
    ended = re.search(r"(\d+) episode\(s\) ended, (\d+) with a reward, (\d+) without", stderr)
    most = re.search(r"\((\d+) sessions at most at once\)", stderr)
    trainer_log = (tmp / "trainer.log").read_text()
    history = json.loads((tmp / "history.json").read_text()) if (tmp / "history.json").exists() else {}
    logged = [h for h in history.get("log_history", []) if "rewards/reward_completion/mean" in h]
    return {
        "sessions": sessions,
        "trainer_exit": code,
        "optimizer_steps": history.get("global_step", 0),
        "server_start_s": round(opened_s, 1),
        "train_s": round(trained_s, 1),
        "generation_batch_s": [round(s, 1) for s in history.get("generation_s", [])],
        "server_peak_pss_mib": round(server_tree.peak_mib),
        "server_process_peak_pss_mib": round(server_tree.root_peak_mib),
        "trainer_peak_pss_mib": round(trainer_tree.peak_mib),
        "most_sessions": int(most[1]) if most else None,
        "most_chromium_processes": server_tree.most_chromium,
        "episodes_ended": int(ended[1]) if ended else None,
        "episodes_judged": int(ended[2]) if ended else None,
        "episodes_without_reward": int(ended[3]) if ended else None,
        "past_deadline": stderr.count("deadline: no verdict within"),
        "refused_resets": trainer_log.count("CAPACITY_REACHED"),
        "judge_calls": {"key_points": steps.count("key_points"), "outcome": steps.count("outcome")},
        "logged_reward_mean": logged[0]["rewards/reward_completion/mean"] if logged else None,
        "chromium_left_after_sigterm": left,
        "trainer_tail": trainer_log.strip().splitlines()[-3:] if code else [],
    }


def rows_of(figures: dict) -> Rows:
    f, s = figures, figures["settings"]
    if f["trainer_exit"] == 0:
        result = (
            f"{f['optimizer_steps']} optimizer step(s); TRL's logged reward mean {f['logged_reward_mean']}"
        )
    else:
        result = f"trainer exit {f['trainer_exit']}, {f['optimizer_steps']} optimizer step(s)"
    batches = ", ".join(f"{x:,.1f}" for x in f["generation_batch_s"]) or "-"
    calls = f["judge_calls"]
    row = (
        f"`per_device_train_batch_size` {s['batch']} x `--gradient-accumulation-steps` {s['accumulation']}, "
        f"`--max-steps` {s['max_steps']}",
        str(f["sessions"]),
        result,
        f"{batches} (train {f['train_s']:,.1f}; server start {f['server_start_s']})",
        f"{f['server_peak_pss_mib']:,} / {f['trainer_peak_pss_mib']:,} MiB (the server's process "
        f"{f['server_process_peak_pss_mib']:,})",
        str(f["most_chromium_processes"]),
        f"{f['episodes_ended']} / {f['episodes_judged']} / {f['episodes_without_reward']} / {f['past_deadline']} / "
        f"{f['refused_resets']} ({calls['key_points']} key-point call(s), {calls['outcome']} outcome call(s))",
        str(f["chromium_left_after_sigterm"]),
    )
    headline = Headline(
        f"TRL's BrowserGym example, unchanged, at {f['sessions']} sessions on `keyshot reward env`: optimizer "
        "steps; episodes judged / ended; Chromium processes left",
        f"{f['optimizer_steps']}; {f['episodes_judged']} / {f['episodes_ended']}; {f['chromium_left_after_sigterm']}",
    )
    return Rows((Table(COLUMNS, (row,), "lrlrlrlr"),), (headline,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="per_device_train_batch_size (transformers' 8)")
    parser.add_argument(
        "--accumulation", type=int, default=32, help="the example's --gradient-accumulation-steps"
    )
    parser.add_argument(
        "--max-steps", type=int, default=10, help="the example's --max-steps (and the server's)"
    )
    parser.add_argument("--judge-latency-s", type=float, default=0.0)
    parser.add_argument(
        "--server-arg", action="append", default=[], help="one more argument of keyshot reward env"
    )
    parser.add_argument("--time-limit-s", type=float, help="stop the trainer then (its figures so far)")
    record.json_option(parser)
    args = parser.parse_args(argv)
    for flavour in ("", "trl"):
        if missing("openenv", flavour):
            raise SystemExit(missing("openenv", flavour))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds run(): its server and trainer end
    with tempfile.TemporaryDirectory(prefix="bench-openenv-trl-") as tmp:
        figures = run(args, Path(tmp))
    figures["settings"] = {
        "batch": args.batch,
        "accumulation": args.accumulation,
        "max_steps": args.max_steps,
    }
    print(json.dumps(figures, indent=1))
    ok = figures["trainer_exit"] == 0 and figures["chromium_left_after_sigterm"] == 0
    return record.finish(args.json, figures, rows_of, __spec__.name, argv, 0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
