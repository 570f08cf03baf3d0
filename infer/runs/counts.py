"""What a run's verdicts count, defined once: the terminal, ``summary.json``/``summary.md``, the report's
tiles, matrix and table, and ``keyshot metrics`` all read their counts from here.

Every verdict has exactly one *outcome* (:func:`outcome_of`), so the outcomes of a run add up to its
trajectories:

- ``success`` / ``failure``: a finished verdict whose status was read, resting on at least one readable
  screenshot score;
- ``no-status``: every call answered but the judge's status could not be read (counts as not success);
- ``no-scores``: none of the trajectory's screenshot scores could be read. In strict mode it has no
  verdict; ``parse_mode: reference`` judges it anyway (:func:`judged_without_scores`), and that verdict is
  shown beside it but counted in no success rate (docs/architecture.md, "A verdict needs evidence");
- ``incomplete``: a call failed after its retries (no verdict; the next run retries it).

Calls: each screenshot of a verdict is one scorer *answer*. An answer was sent to the endpoint, came from
the call cache (or from an identical request in flight at the same time), or copies the answer of an
identical earlier screenshot of the trajectory (scored once): :func:`call_split`. The endpoint table of a
run counts HTTP requests, which add the retries of the answers sent.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from keyshot.infer.protocol.verdicts import Verdict

SUCCESS = "success"
FAILURE = "failure"
NO_STATUS = "no-status"
NO_SCORES = "no-scores"
INCOMPLETE = "incomplete"
#: The outcomes, in the order every table shows them.
OUTCOMES = (SUCCESS, FAILURE, NO_STATUS, NO_SCORES, INCOMPLETE)
#: Each outcome in words, as every artefact names it.
OUTCOME_LABELS = {
    SUCCESS: "success",
    FAILURE: "failure",
    NO_STATUS: "verdict without a status",
    NO_SCORES: "no readable scores",
    INCOMPLETE: "failed calls",
}


def outcome_of(v: Verdict) -> str:
    """The one outcome of ``v`` (see the module docstring)."""
    if v.no_evidence is not None:
        return NO_SCORES
    if not v.finished:
        return INCOMPLETE
    if not v.status_valid:
        return NO_STATUS
    return SUCCESS if v.success else FAILURE


def judged_without_scores(v: Verdict) -> bool:
    """True when reference mode gave ``v`` a verdict although none of its screenshot scores was read."""
    return v.no_evidence is not None and v.finished


def judged_word(v: Verdict) -> str | None:
    """The verdict reference mode gave a trajectory without readable scores ("failure"), else None."""
    if not judged_without_scores(v):
        return None
    return {True: SUCCESS, False: FAILURE}.get(v.success if v.status_valid else None, NO_STATUS)


def outcome_text(v: Verdict) -> str:
    """The outcome in words, with the verdict judged anyway where there is one:
    ``no readable scores (judged anyway: failure)``."""
    text = OUTCOME_LABELS[outcome_of(v)]
    judged = judged_word(v)
    return f"{text} (judged anyway: {OUTCOME_LABELS[judged]})" if judged else text


def success_rate(outcomes: Counter) -> float | None:
    """Successes over the verdicts that rest on readable scores and whose calls all answered (a verdict
    without a status counts as not success); None when there is none."""
    counted = outcomes[SUCCESS] + outcomes[FAILURE] + outcomes[NO_STATUS]
    return outcomes[SUCCESS] / counted if counted else None


@dataclass
class CallSplit:
    """One role's answers and where they came from: ``answers = sent + cache_hits + same_image``."""

    answers: int = 0
    sent: int = 0
    cache_hits: int = 0
    same_image: int = 0

    def add(self, other: CallSplit) -> None:
        self.answers += other.answers
        self.sent += other.sent
        self.cache_hits += other.cache_hits
        self.same_image += other.same_image


def call_split(v: Verdict, role: str) -> CallSplit:
    """Where ``v``'s answers of ``role`` came from (identical screenshots only for the scorer)."""
    usage = v.usage.get(role)
    if usage is None:
        return CallSplit()
    same = (
        sum(s.same_as is not None and not s.call_failed for s in v.screenshots)
        if role == _scored_by(v)
        else 0
    )
    return CallSplit(usage.calls, usage.calls - usage.cached, usage.cached - same, same)


def _scored_by(v: Verdict) -> str:
    """The role that scored the screenshots: the scorer, or the judge in the reference configuration."""
    scorer = v.usage.get("scorer")
    return "scorer" if scorer is not None and (scorer.calls or scorer.errors) else "judge"


def total_split(verdicts: Iterable[Verdict], role: str) -> CallSplit:
    total = CallSplit()
    for v in verdicts:
        total.add(call_split(v, role))
    return total


def split_text(split: CallSplit, role: str) -> str:
    """``28 scorer answers: 12 sent, 9 from the cache, 7 identical screenshots scored once``."""
    text = f"{split.answers} {role} answers: {split.sent} sent, {split.cache_hits} from the cache"
    if split.same_image or role == "scorer":
        text += f", {split.same_image} identical screenshots scored once"
    return text
