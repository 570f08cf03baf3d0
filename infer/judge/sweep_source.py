"""The judged folder as ``keyshot sweep`` reads it: its verdicts and protocol, what a swept δ takes from it
and records, and each verdict's trajectory read again as the judged run read it.

A δ folder's record is built by the one builder of protocols
(:func:`~keyshot.infer.judge.protocol_record.protocol_record`) from what the sweep sends: the judge of the
sweep's config (model, temperature, max_tokens, seed, constrained answers), the pipeline settings that
decided the judged verdicts (taken from the folder: a setting the user gave that differs is refused, not
replaced), δ, and the folder's scorer and image policy (its scores are reused). So a δ folder's run.json is
the run.json of a ``keyshot judge`` run at that δ with the same settings, plus ``swept_from``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from keyshot.infer.client.endpoint import EndpointConfig
from keyshot.infer.common.config import read_config_file, resolve_config
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.judge.inputs import ReadOptions
from keyshot.infer.judge.pipeline import PipelineConfig
from keyshot.infer.judge.protocol_record import ScorerFacts, protocol_record
from keyshot.infer.judge.run import CACHE_FILE
from keyshot.infer.judge.scorers import KeyScreenshotScorer, ScreenshotScore
from keyshot.infer.loaders.judge_records import recorded_actions
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.protocol.images import ImagePolicy, PreparedImage
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.protocol.verdicts import Verdict, verdict_key
from keyshot.infer.runs.counts import INCOMPLETE, NO_SCORES, outcome_of
from keyshot.infer.runs.run_record import RUN_FILE, read_inputs, read_protocol
from keyshot.infer.runs.verdict_sources import load_verdicts, read_reference_records

logger = logging.getLogger(__name__)

#: What the protocol of a swept folder adds: where its key points and scores came from.
SWEPT_FROM = "swept_from"
#: The pipeline settings a swept δ takes from the judged folder: what decided its key points, scores and
#: kept screenshots besides δ. A sweep asks only the outcome again, as the folder was judged.
FROM_FOLDER = (
    "prompt_variant",
    "outcome_mode",
    "parse_mode",
    "threshold_on",
    "max_kept",
    "outcome_images",
    "allow_partial",
)


class SweepError(JudgeRunError):
    """A sweep that cannot start: no verdicts, a δ off the score scale, another protocol in OUT, a setting
    the judged folder was not judged with."""


@dataclass(frozen=True)
class JudgedFolder:
    """What a sweep reads of the judged folder: its verdicts, their kind (``keyshot``, ``released records``),
    the protocol they were judged under (run.json's; released records' own) and how its trajectories were
    read (``None``: not recorded)."""

    source: Path
    verdicts: list[Verdict]
    kind: str
    protocol: dict
    read_with: ReadOptions | None

    @property
    def released(self) -> bool:
        return self.kind != "keyshot"

    @property
    def folder(self) -> Path:
        return self.source if self.source.is_dir() else self.source.parent

    @property
    def own_cache(self) -> Path | None:
        """The judged run's call cache (None for released records: no run of keyshot's made them)."""
        return None if self.released else self.folder / CACHE_FILE

    @property
    def policy(self) -> ImagePolicy | None:
        recorded = self.protocol.get("image_policy")
        return ImagePolicy.from_dict(recorded) if isinstance(recorded, dict) else None


def read_judged(source: Path) -> JudgedFolder:
    """The judged folder ``source``; refuses released records of several judges, and a keyshot folder
    judged with a prompt set this keyshot does not ship (its outcome prompt would not be the folder's)."""
    verdicts, kind = load_verdicts(source)
    folder = source if source.is_dir() else source.parent
    if kind != "keyshot":
        one_judge(source, verdicts)
        protocol = dict(verdicts[0].config) if verdicts else {}
        return JudgedFolder(source, verdicts, kind, protocol, None)
    protocol = dict(read_protocol(folder) or (verdicts[0].config if verdicts else {}))
    variant, version = protocol.get("prompt_variant"), protocol.get("prompt_version")
    if variant and version and (shipped := load_prompt_set(variant).version) != version:
        raise SweepError(
            f"{folder / RUN_FILE}: judged with prompt set {version}, and this keyshot ships {shipped}: its "
            "outcome prompt would not be the one the folder's verdicts were judged with; sweep it with the "
            "keyshot that judged it, or judge it again"
        )
    recorded = read_inputs(folder)
    return JudgedFolder(
        source, verdicts, kind, protocol, ReadOptions.recorded(recorded) if recorded else None
    )


def one_judge(source: Path, verdicts: list[Verdict]) -> None:
    """Refuse released records of several judges: one trajectory's records would stand for one another."""
    every = read_reference_records(source)
    judges = sorted({str(v.config.get("judge_model")) for v in every})
    records = len(every)
    if records != len(verdicts):
        raise SweepError(
            f"{source}: {records} records of {len(verdicts)} trajectories, by {len(judges)} judges "
            f"({', '.join(judges)}): sweep one judge's folder at a time (such as {source}/<judge>)"
        )


#: How :func:`pipeline_keys_given` names a setting given as a ``pipeline.KEY=value`` override.
OVERRIDE_WHERE = "override"


def pipeline_keys_given(config: str | None, overrides: list[str]) -> dict[str, str]:
    """The ``pipeline`` settings a user gave (``--config`` file, ``pipeline.KEY=value`` overrides), each with
    where: a config file's give way to the judged folder's, an override that differs is refused."""
    given: dict[str, str] = {}
    if config is not None:
        data, _ = read_config_file(resolve_config(config, JudgeRunConfig.SHIPPED_FOLDER))
        section = data.get("pipeline") if isinstance(data, dict) else None
        given.update({key: str(config) for key in section or {}})
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key.startswith("pipeline."):
            given[key.removeprefix("pipeline.")] = f"{OVERRIDE_WHERE} {item!r}"
    return given


def sweep_pipeline(
    base: PipelineConfig, judged: JudgedFolder, given: dict[str, str] | None = None
) -> PipelineConfig:
    """The pipeline of the swept δ's: the judged folder's settings where they decided its verdicts
    (:data:`FROM_FOLDER`; released records: the descriptions without images), the config's outcome settings
    (log-probabilities, token limits, the p_success threshold) beside them. A setting in ``given`` (the
    user's, with where it was given) that differs from the folder's is refused in one line when it is an
    override, and gives way to the folder's, said in one line, when a config file holds it."""
    taken = {k: judged.protocol[k] for k in FROM_FOLDER if judged.protocol.get(k) is not None}
    if judged.released:
        taken["outcome_images"] = "none"  # released records hold no pixels of the screenshots not kept
    differ = [k for k in FROM_FOLDER if k in (given or {}) and k in taken and getattr(base, k) != taken[k]]
    refused = [k for k in differ if (given or {})[k].startswith(OVERRIDE_WHERE)]
    if refused:
        where = "released records" if judged.released else str(judged.folder / RUN_FILE)
        named = "; ".join(
            f"pipeline.{k}={getattr(base, k)!r} ({given[k]}) where it was {taken[k]!r}" for k in refused
        )  # type: ignore[index]
        raise SweepError(
            f"{named} in the judged folder ({where}): a sweep asks the outcome again as the folder was judged "
            "and changes only δ; drop the override, or judge the trajectories again with keyshot judge"
        )
    if differ:  # a config file's settings (a shipped config's, say): the folder's are taken, said once
        logger.warning(
            "%s's pipeline settings give way to the judged folder's (a sweep changes only δ): %s",
            (given or {})[differ[0]],
            ", ".join(f"{k} {getattr(base, k)!r} -> {taken[k]!r}" for k in differ),
        )
    return replace(base, **taken)


def delta_record(pipeline: PipelineConfig, delta: float, judge: EndpointConfig, judged: JudgedFolder) -> dict:
    """The protocol a δ folder records: what its outcome calls were sent with (the sweep's judge, ``pipeline``
    at δ), on the folder's scores (its scorer and image policy), and where those came from."""
    record = protocol_record(
        replace(pipeline, threshold=delta),
        judge,
        ScorerFacts.recorded(judged.protocol),
        judged.protocol.get("image_policy"),
    )
    return {**record, SWEPT_FROM: str(judged.source)}


class RecordedScores(KeyScreenshotScorer):
    """The judged folder's scores standing as a sweep's scorer: it names the scorer and image policy the
    folder recorded, and is never asked (a sweep reuses every score)."""

    def __init__(self, judged: JudgedFolder, pipeline: PipelineConfig):
        super().__init__(load_prompt_set(pipeline.prompt_variant), parse_mode=pipeline.parse_mode)
        self._facts = ScorerFacts.recorded(judged.protocol)
        self._policy = judged.policy
        self.backend = self._facts.backend or ""

    @property
    def name(self) -> str:
        return self._facts.model or "the judged folder's scores"

    @property
    def image_policy(self) -> ImagePolicy | None:
        return self._policy

    def facts(self) -> ScorerFacts:
        return self._facts

    async def score(self, task: str, key_points: str, image: PreparedImage) -> ScreenshotScore:
        raise RuntimeError("a sweep reuses the judged folder's screenshot scores: it asks no scorer")


@dataclass
class SweepItem:
    """A judged verdict and the trajectory its outcome call shows."""

    verdict: Verdict
    trajectory: Trajectory


def _released_trajectory(v: Verdict) -> Trajectory:
    """The task and action history a released record's outcome call showed (no screenshots: no pixels)."""
    try:
        record = json.loads(Path(v.source or "").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrajectoryError(Path(v.source or "?"), f"cannot read the record again ({exc})") from None
    actions = recorded_actions(record) if isinstance(record, dict) else None
    if actions is None:
        raise TrajectoryError(Path(v.source or "?"), "holds no action history (action_history or input_text)")
    return Trajectory(v.task_id, v.task, actions, agent=v.agent, benchmark=v.benchmark, run=v.run)


class _Sources:
    """The trajectories of each source a judged run read (a folder or a JSONL file may hold several), read
    once with the run's own options, found by the verdict's identity (task, agent, run; a trajectory that
    names no agent, judged with ``agent=``, by task and run)."""

    def __init__(self, read_with: ReadOptions) -> None:
        self.read_with = read_with
        self._loaded: dict[str, list[Trajectory]] = {}

    def find(self, v: Verdict) -> Trajectory:
        source = v.source or ""
        if source not in self._loaded:
            errors: list[TrajectoryError] = []
            self._loaded[source] = list(self.read_with.load(source, errors, within_inputs=True))
        found = self._loaded[source]
        exact = [t for t in found if verdict_key(t.task_id, t.agent, t.run) == v.key]
        loose = [t for t in found if str(t.task_id) == str(v.task_id) and (t.run or "") == (v.run or "")]
        if len(exact) == 1 or len(loose) == 1:
            return (exact or loose)[0]
        raise TrajectoryError(
            Path(source),
            f"no trajectory of task {v.task_id!r} (agent {v.agent!r}) read from it ({len(found)} read)",
        )


def unsweepable(v: Verdict) -> str | None:
    """Why a sweep cannot ask the outcome of the judged verdict ``v`` again, read from the verdict alone (its
    trajectory aside); None when it can."""
    outcome = outcome_of(v)
    if not v.key_points:
        return "no key points in the judged verdict"
    if outcome == NO_SCORES:
        return "no readable screenshot score in the judged verdict"
    if outcome == INCOMPLETE and (v.incomplete or any(s.call_failed for s in v.screenshots)):
        return "judged verdict incomplete: finish it with keyshot judge first"
    return None


def none_readable(judged: JudgedFolder, why: str) -> SweepError:
    """The one line of a sweep that finds none of the judged trajectories it would ask about."""
    return SweepError(
        f"{judged.source}: none of its {len(judged.verdicts)} judged trajectories can be read again ({why}): "
        "put them back where the verdicts say they were, or judge them again"
    )


def source_missing(judged: JudgedFolder, v: Verdict) -> bool:
    """True when a keyshot verdict's trajectory is no longer where it says (released records hold theirs)."""
    return not judged.released and not (v.source and Path(v.source).exists())


def sweepable(judged: JudgedFolder, read_with: ReadOptions) -> tuple[list[SweepItem], Counter, list[str]]:
    """The verdicts a sweep can ask the outcome of, each with its trajectory (read with ``read_with``); the
    others counted by reason, with the first few named."""
    items: list[SweepItem] = []
    left: Counter = Counter()
    named: list[str] = []
    sources = _Sources(read_with)
    for v in judged.verdicts:
        reason = unsweepable(v)
        if reason is None:
            try:
                trajectory = _released_trajectory(v) if judged.released else sources.find(v)
            except (TrajectoryError, OSError, ValueError) as exc:
                reason = "trajectory not readable"
                if len(named) < 5:
                    named.append(f"{v.task_id}: {exc}")
            else:
                items.append(SweepItem(v, trajectory))
                continue
        left[reason] += 1
    if judged.verdicts and not items and left["trajectory not readable"]:
        raise none_readable(judged, named[0] if named else "trajectory not readable")
    return items, left, named
