"""``keyshot judge --agentlab-summary``: keyshot's verdict in each judged AgentLab run's ``summary_info.json``,
where AgentLab's result table (``load_result_df``, agent-xray) reads every key of a run.

Three keys, after the run's own, which are left as they are and in their order:
``keyshot_success`` (true/false), ``keyshot_p_success`` (P(success) read at the outcome calls' status
words, null where the run asks for no log-probabilities or the judge gave none) and ``keyshot_protocol``
(the protocol that decided the verdict, as ``OUT/run.json`` records it). The keys say what the output
folder concludes about the run: a run with no verdict there (incomplete, no readable scores, the judge's
answer unreadable) gets none, and loses the keys an earlier run wrote, so AgentLab's table never shows a
verdict that keyshot did not reach. Each file is replaced atomically (a temporary file beside it, then
``os.replace``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.loaders.agentlab import FORMAT, SUMMARY_FILE
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.verdicts import Verdict, verdict_key

KEYS = ("keyshot_success", "keyshot_p_success", "keyshot_protocol")


@dataclass
class SummaryWrites:
    """What ``--agentlab-summary`` did (recorded in summary.json as ``run.agentlab_summary``): files given
    the verdict, files whose earlier keys were removed (no verdict now), judged runs without a
    summary_info.json (AgentLab writes it when a run ends; keyshot makes none), and the files that could
    not be written, each with its reason."""

    written: int = 0
    cleared: int = 0
    no_summary: int = 0
    failed: list[str] = field(default_factory=list)


def report_lines(record: dict) -> tuple[list[str], list[str]]:
    """What the terminal says of a run's ``agentlab_summary`` record: its lines, and its problems (stderr)."""
    lines = [f"wrote keyshot's verdict into {record['written']} summary_info.json files"]
    if record["cleared"]:
        lines.append(
            f"removed keyshot's keys from {record['cleared']} summary_info.json files: no verdict in this "
            "output folder (an earlier run had written them)"
        )
    if record["no_summary"]:
        lines.append(
            f"{record['no_summary']} judged runs have no summary_info.json (AgentLab writes it when a run "
            "ends): nothing written there"
        )
    return lines, [f"--agentlab-summary: {m}" for m in record["failed"]]


def write_agentlab_summaries(
    trajectories: list[Trajectory], verdicts: list[Verdict], protocol: dict
) -> SummaryWrites:
    """Put each AgentLab trajectory's verdict (``verdicts``: the run folder's latest) into its run's
    summary_info.json, or take keyshot's keys out where it has none (see the module docstring)."""
    by_key = {v.key: v for v in verdicts}
    done = SummaryWrites()
    for t in trajectories:
        if t.format != FORMAT or t.source is None:
            continue
        path = Path(t.source) / SUMMARY_FILE
        verdict = by_key.get(verdict_key(t.task_id, t.agent, t.run))
        keys = _keys(verdict, protocol)
        if not path.is_file():
            done.no_summary += bool(keys)
            continue
        try:
            summary = _read(path)
            had = any(k in summary for k in KEYS)
            if not keys and not had:
                continue
            kept = {k: v for k, v in summary.items() if k not in KEYS}
            write_text_atomic(path, json.dumps({**kept, **keys}, indent=4))
        except (OSError, ValueError, KeyshotError) as exc:
            done.failed.append(f"{path}: not written ({exc}); the run's verdict is in verdicts.jsonl")
            continue
        if keys:
            done.written += 1
        else:
            done.cleared += 1
    return done


def _keys(verdict: Verdict | None, protocol: dict) -> dict:
    if verdict is None or not verdict.finished or verdict.success is None:
        return {}
    return {KEYS[0]: verdict.success, KEYS[1]: verdict.p_success, KEYS[2]: protocol}


def _read(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    return data
