"""Released WebJudge judge records (AgentRewardBench's, and the reference ``src/run.py``'s output): the
index of human labels, where each record lives, a screenshot's recorded score and the outcome text (the
one reader of each, for metrics, released-record verdicts and synthesis's imports).

``index.csv`` has one row per (judge, benchmark, agent, task): ``path`` (the record, relative to the
index's folder or a parent), ``judge``, ``benchmark``, ``agent``, ``task_id`` and ``human_success``
(``Successful`` / ``Unsuccessful`` / ``Unsure``). A row's identity is (benchmark, agent, task id), the
agent compared loosely (:func:`keyshot.infer.loaders.human_labels.normalize_agent`).

A record's ``image_judge_record`` holds ``{"Response": text, "Score": n}`` per screenshot, in order
(:func:`recorded_score`), answered under one prompt set (:func:`scorer_variant`), whose reference reading
gives the descriptions the record's own outcome prompt showed (:func:`recorded_answers`: both at once). Its task is the goal as that prompt showed
it (:func:`record_task`: without AgentLab's notes of the goal's images, which name a path of the machine
that recorded the run), and its outcome system prompt names the prompt set of the outcome call
(:func:`outcome_variant`). Its outcome text is, by format: ``evaluation_details.response`` (Online-Mind2Web's
``src/run.py`` output), ``response`` as a string, or ``response.choices[0].message.content``
(AgentRewardBench's saved chat completion).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.loaders.human_labels import normalize_agent, normalize_human_label
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.protocol.parsing import carries_labels, parse_score
from keyshot.infer.protocol.prompts import VARIANTS, load_prompt_set

INDEX_FILE = "index.csv"
INDEX_COLUMNS = ("path", "judge", "benchmark", "agent", "task_id", "human_success")


@dataclass(frozen=True)
class ArbIndexRow:
    path: str
    judge: str
    benchmark: str
    agent: str
    task_id: str
    human: str | None  # canonical (keyshot.infer.loaders.human_labels), None when the row has none

    @property
    def key(self) -> tuple[str, str, str]:
        """(benchmark, agent compared loosely, task id): the trajectory the row labels."""
        return (self.benchmark, normalize_agent(self.agent), self.task_id)


def find_index(records_dir: Path) -> Path | None:
    """The ``index.csv`` of a record folder: in it or one of its three nearest parents."""
    for folder in [records_dir, *list(records_dir.parents)[:3]]:
        if (folder / INDEX_FILE).is_file():
            return folder / INDEX_FILE
    return None


def read_arb_index(path: str | Path) -> list[ArbIndexRow]:
    """Every row of an ``index.csv``; a missing column or an unknown label raises naming the file (and line)."""
    path = Path(path)
    rows = []
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in INDEX_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise TrajectoryError(
                    path, f"missing column(s) {', '.join(missing)}; is this AgentRewardBench's index.csv?"
                )
            for line, row in enumerate(reader, 2):
                try:
                    human = normalize_human_label(row["human_success"])
                except ValueError as exc:
                    raise TrajectoryError(path, str(exc), line=line) from None
                rows.append(
                    ArbIndexRow(
                        row["path"], row["judge"], row["benchmark"], row["agent"], row["task_id"], human
                    )
                )
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TrajectoryError(
            path, f"cannot read the index ({getattr(exc, 'strerror', None) or exc})"
        ) from None
    return rows


def record_path(index_path: Path, row: ArbIndexRow) -> Path:
    """Where the record of ``row`` lives: its ``path`` relative to the index folder or one of its
    parents, else ``<index folder>/<judge>/<benchmark>/<agent>/<task_id>.json``."""
    for base in (index_path.parent, *index_path.parent.parents):
        candidate = base / row.path
        if candidate.is_file():
            return candidate
    return index_path.parent / row.judge / row.benchmark / row.agent / f"{row.task_id}.json"


def recorded_score(entry: object, variant: str = "online_mind2web") -> tuple[str, int | None, str | None]:
    """(answer text, score 1-5 or None, why there is none) of one ``image_judge_record`` entry: the
    recorded ``Score``, else the score the reference reads in the answer (of ``variant``'s prompt set). 0 or
    another value outside 1-5 is the original run's "could not read a score". An entry without a
    ``Response`` raises ValueError."""
    if not isinstance(entry, dict) or not isinstance(entry.get("Response"), str):
        raise ValueError(f"expected {{'Response': str, 'Score': int}}, found {str(entry)[:80]!r}")
    text = entry["Response"]
    raw = entry.get("Score")
    try:
        score = int(raw) if raw is not None and not isinstance(raw, bool) else None
    except (TypeError, ValueError):
        score = None
    if score is None:
        score = parse_score(text, "reference", variant).score
        if score == 0:
            return text, None, "no recorded score and none readable in the answer"
    if score not in (1, 2, 3, 4, 5):
        return text, None, f"recorded score {raw!r}: the original run could not read a score"
    return text, score, None


def scorer_variant(entries: object) -> str:
    """The prompt set a record's scorer answers were asked with, by the labels they carry: ``general`` when
    one carries its ``### Reasoning:`` / ``### Score`` labels (the API judges of AgentRewardBench's runs,
    o4-mini and GPT-4o), else ``online_mind2web`` (WebJudge-7B's ``**Reasoning**: … **Score**: N``)."""
    texts = [e.get("Response") for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    general = any(isinstance(t, str) and carries_labels(t, "general") for t in texts)
    return "general" if general else "online_mind2web"


@dataclass(frozen=True)
class RecordedAnswer:
    """One screenshot's answer in a judge record: its text, its score 1-5 (None: none, ``error`` says why)
    and the description the record's own outcome prompt showed of it."""

    text: str
    score: int | None
    error: str | None
    thought: str


def recorded_answers(entries: list) -> list[RecordedAnswer]:
    """A record's ``image_judge_record`` read as its own outcome prompt read it: each entry's score
    (:func:`recorded_score`) and description by the reference rule of the prompt set that answered the
    record (:func:`scorer_variant`). The one reading of released answers for verdicts and synthesis's
    imports; an entry without a ``Response`` raises ValueError naming its place."""
    variant = scorer_variant(entries)
    answers = []
    for i, entry in enumerate(entries):
        try:
            text, score, error = recorded_score(entry, variant)
        except ValueError as exc:
            raise ValueError(f"image_judge_record[{i}]: {exc}") from None
        thought = parse_score(text, mode="reference", variant=variant).thought
        answers.append(RecordedAnswer(text, score, error, thought))
    return answers


#: AgentLab's notes of the images in a goal, ending it ("Input image 1/1 below (local path:
#: PosixPath('/tmp/…'), url: '…')"), which the record's own outcome prompt did not show.
_GOAL_IMAGE_NOTES = re.compile(r"(?:\nInput image \d+/\d+ below \([^\n]*\))+\n?\Z")


def record_task(record: dict) -> str | None:
    """The task a record's outcome prompt showed: ``task`` (or ``confirmed_task``, Online-Mind2Web), else the
    ``goal`` without the notes of its images; None when the record holds none."""
    task = record.get("task") or record.get("confirmed_task") or record.get("goal")
    return _GOAL_IMAGE_NOTES.sub("", task) if isinstance(task, str) else None


def outcome_variant(record: dict) -> str | None:
    """The shipped prompt set whose outcome system prompt is the record's ``system_msg`` (AgentRewardBench's
    runs used ``general``'s, WebJudge-7B's included), or None when it holds none of them."""
    system = record.get("system_msg")
    found = [
        v for v in VARIANTS if isinstance(system, str) and load_prompt_set(v).system("outcome") == system
    ]
    return found[0] if found else None


def outcome_text(record: dict) -> str | None:
    """The outcome call's answer recorded in a judge record, or None when it holds none."""
    details = record.get("evaluation_details")
    if isinstance(details, dict) and isinstance(details.get("response"), str):
        return details["response"]
    response = record.get("response")
    if isinstance(response, str):
        return response
    if isinstance(response, dict):
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            content = message.get("content") if isinstance(message, dict) else None
            return content if isinstance(content, str) else None
    return None


def read_record_outcome(path: Path) -> str:
    """The outcome text of the judge record in ``path`` ("" when the judge answered nothing); a file that
    is no judge record raises naming it."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TrajectoryError(path, f"cannot read the record ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TrajectoryError(path, f"not a JSON record ({exc})") from None
    if not isinstance(record, dict) or not ({"response", "evaluation_details"} & set(record)):
        raise TrajectoryError(path, "not a WebJudge record: it has no 'response'")
    return outcome_text(record) or ""  # an empty answer is no verdict, not an unreadable file


_ACTION_HISTORY = re.compile(
    r"Action History:\n(.*?)(?:\n\nThe potentially important snapshots|\Z)", re.DOTALL
)
_NUMBERED = re.compile(r"^(\d+)\. ", re.MULTILINE)


def recorded_actions(record: dict) -> list[str] | None:
    """The agent's actions as the record's outcome call showed them: ``action_history`` (Online-Mind2Web's
    ``src/run.py`` output), else the numbered "Action History" of the outcome prompt (``input_text``,
    AgentRewardBench), each with its reasoning where the prompt had it; None when the record holds none.
    Numbered again (``1. …``, one per line) they give the prompt's text back exactly; a history whose
    reasoning holds numbered lines of its own comes back as one item, its text unchanged."""
    history = record.get("action_history")
    if isinstance(history, list) and all(isinstance(a, str) for a in history):
        return list(history)
    text = record.get("input_text")
    match = _ACTION_HISTORY.search(text) if isinstance(text, str) else None
    if match is None or not match.group(1).startswith("1. "):
        return None
    block = match.group(1)
    starts = list(_NUMBERED.finditer(block))
    if [int(m.group(1)) for m in starts] != list(range(1, len(starts) + 1)):
        return [block[len("1. ") :]]
    ends = [m.start() - 1 for m in starts[1:]] + [len(block)]
    return [block[m.end() : end] for m, end in zip(starts, ends, strict=True)]
