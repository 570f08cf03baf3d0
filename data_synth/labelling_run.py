"""``keyshot synth run``: label every screenshot of every trajectory with every teacher.

For each trajectory: the key points once (from the teacher set's ``key_points_judge``), then the
key-screenshot request for every screenshot, sent to every teacher through the shared
:class:`keyshot.infer.client.judge_client.JudgeClient` and its SQLite cache (``RUN/calls.sqlite``); optionally the
outcome verdict of each teacher's kept screenshots (``outcome: true``, for the human-label filter).
Every result is appended to the label store (``RUN/labels.jsonl``) as soon as it is known.

A byte-identical request is sent once per session, whoever asks it (one episode in two layouts, an
agent stuck on a page, two teachers serving one model): while it is on its way, and after a malformed
answer, which the call cache does not keep (:mod:`keyshot.data_synth.asked_once`).

Resuming is running the same command again: a (trajectory, step, teacher) with a label is skipped,
and a call whose label line was lost is answered by the cache for free. Failed labels (timeouts,
5xx, answers without a readable score, each already retried by the client) are recorded with their
reason and retried only with ``retry_failed``. A teacher whose budget is spent stops; its missing
labels are made by a later run with a larger budget.

Budgets cap a run folder's spending over all its sessions (:func:`remaining_budgets`). The cost
estimate printed before every run, and all that ``--dry-run`` does, is :mod:`keyshot.data_synth.estimate`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from keyshot.data_synth.asked_once import AskedOnce
from keyshot.data_synth.dataset import BuildResult, build_dataset
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.estimate import CostEstimate, estimate_cost, label_needed
from keyshot.data_synth.labels import (
    CALL_FAILED,
    JUDGE_ORIGIN,
    LABELS_FILE,
    KeyPointsRecord,
    LabelRecord,
    LabelStore,
    OutcomeRecord,
    call_failed,
    read_store,
)
from keyshot.data_synth.run_folder import (
    CACHE_FILE,
    UsageRecorder,
    open_manifest,
    read_usage,
    write_json_atomic,
)
from keyshot.data_synth.sources import iter_trajectories, trajectory_record
from keyshot.data_synth.synth_config import SynthConfig
from keyshot.data_synth.teachers import TeacherConfig, TeacherSet, remaining_budgets, shard_budgets
from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import InFlight, JudgeCallError
from keyshot.infer.client.preflight import preflight
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.errors import (
    EXIT_BUDGET,
    EXIT_ENDPOINT_DOWN,
    EXIT_INCOMPLETE,
    EXIT_OK,
    EndpointDownError,
    RunStopError,
)
from keyshot.infer.judge.calls import Protocol, ask_key_points, ask_outcome, ask_score
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory, TrajectoryError
from keyshot.infer.protocol.images import ImagePolicy
from keyshot.infer.protocol.prompts import PromptSet, load_prompt_set
from keyshot.infer.protocol.verdicts import KEEP_THRESHOLD, ScreenshotRecord, select_kept
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.shards import ShardSpec
from keyshot.infer.runs.summary import SUMMARY_FILE

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- report
@dataclass
class SynthReport:
    estimate: CostEstimate
    dry_run: bool = False
    trajectories: int = 0
    bad_trajectories: list[str] = field(default_factory=list)
    labels_new: int = 0
    labels_failed: int = 0
    labels_skipped: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    key_points_failed: int = 0
    outcomes_new: int = 0
    unreadable_screenshots: list[str] = field(default_factory=list)
    budget_stopped: list[str] = field(default_factory=list)
    endpoints_down: list[str] = field(default_factory=list)
    calls_failed: int = 0  # calls that got no answer: nothing learnt from them, asked again next run
    usage: dict[str, dict] = field(default_factory=dict)
    usage_table: str = ""
    dataset: BuildResult | None = None

    @property
    def exit_code(self) -> int:
        """0 when every needed call answered; else :mod:`keyshot.infer.common.errors`' code for why not."""
        if self.dry_run:
            return EXIT_OK
        if self.endpoints_down:
            return EXIT_ENDPOINT_DOWN
        if self.budget_stopped:
            return EXIT_BUDGET
        return EXIT_INCOMPLETE if self.calls_failed else EXIT_OK

    def _unreadable_lines(self, shown: int = 20) -> list[str]:
        """Each input that was not read, with its reason (the first ``shown``)."""
        lines = [f"  unreadable, skipped: {m}" for m in self.bad_trajectories[:shown]]
        more = len(self.bad_trajectories) - shown
        return lines + ([f"  (and {more} more)"] if more > 0 else [])

    def summary(self) -> str:
        if self.dry_run:
            unread = [f"unreadable, skipped: {len(self.bad_trajectories)}"] if self.bad_trajectories else []
            return "\n".join(
                [self.estimate.table(), *unread, *self._unreadable_lines(), "(dry run: no call was made)"]
            )
        lines = [
            f"trajectories: {self.trajectories} ({len(self.bad_trajectories)} unreadable, skipped)",
            *self._unreadable_lines(),
            f"labels: {self.labels_new} new, {self.labels_failed} of them failed, {self.labels_skipped} already done",
            f"key points failed: {self.key_points_failed}; outcome verdicts: {self.outcomes_new}",
        ]
        for reason, n in sorted(self.failure_reasons.items()):
            lines.append(f"  failed labels, {reason}: {n}")
        if self.unreadable_screenshots:
            lines.append(f"unreadable screenshots (not labelled): {len(self.unreadable_screenshots)}")
        if self.budget_stopped:
            lines.append(f"budget reached, stopped: {', '.join(self.budget_stopped)}")
        for down in self.endpoints_down:
            lines.append(f"stopped: {down}")
        if self.calls_failed:
            lines.append(
                f"incomplete: {self.calls_failed} calls got no answer (no label was made from them); "
                "re-run the same command to retry them"
            )
        if self.usage_table:
            lines += ["", "Usage and cost of this session:", self.usage_table]
        if self.dataset is not None:
            lines.append(f"\ndataset: {self.dataset.path} rows {self.dataset.meta.rows}")
            lines += self.dataset.empty_split_lines()
        return "\n".join(lines)


# ---------------------------------------------------------------------------- the run
class _Run:
    """One session of ``keyshot synth run`` (state shared by the trajectory coroutines)."""

    def __init__(
        self,
        cfg: SynthConfig,
        teachers: TeacherSet,
        prompts: PromptSet,
        policy: ImagePolicy,
        store: LabelStore,
        cache: CallCache,
        ledger: UsageLedger,
        retry_failed: bool,
        progress: tqdm,
        recorder: UsageRecorder,
    ):
        self.cfg = cfg
        self.run_dir = Path(cfg.run_dir)
        self.teachers = teachers
        self.prompts = prompts
        self.protocol = Protocol(prompts, cfg.parse_mode)  # the requests and readings judging uses
        self.policy = policy
        self.store = store
        self.retry_failed = retry_failed
        self.progress = progress
        self.recorder = recorder
        self.ledger = ledger
        asked = InFlight()  # one for every client: a byte-identical request is sent once per session
        judge = teachers.key_points_judge
        self.judge = AskedOnce(judge.name, judge.client(cache, ledger), asked, ledger)
        self.clients = {
            t.name: AskedOnce(t.name, t.client(cache, ledger), asked, ledger) for t in teachers.teachers
        }
        self.stopped: set[str] = set()
        self.report = SynthReport(estimate=CostEstimate())
        self.images = asyncio.Semaphore(cfg.images_in_flight)

    async def run(self, trajectories: Iterator[Trajectory]) -> None:
        slots = asyncio.Semaphore(self.cfg.trajectories_in_flight)
        pending: set[asyncio.Task] = set()
        try:
            for traj in trajectories:
                await slots.acquire()
                task = asyncio.create_task(self._trajectory(traj))
                task.add_done_callback(lambda _t: slots.release())
                pending.add(task)
                done = {t for t in pending if t.done()}
                for t in done:
                    t.result()  # surface unexpected errors early
                pending -= done
            await asyncio.gather(*pending)
        finally:
            for t in pending:
                t.cancel()
            await self.judge.aclose()
            for client in self.clients.values():
                await client.aclose()

    async def _trajectory(self, traj: Trajectory) -> None:
        contents = self.store.contents
        self.report.trajectories += 1
        record = trajectory_record(self.run_dir, traj)
        if contents.trajectories.get(traj.uid) != record:
            self.store.append(record)
        key_points = await self._key_points(traj)
        if key_points is None:
            self.progress.update(self._todo(traj))
            return
        steps = [self._step(traj, shot, key_points) for shot in traj.screenshots]
        await asyncio.gather(*steps)
        if self.cfg.outcome:
            await asyncio.gather(*(self._outcome(traj, key_points, t.name) for t in self.teachers.teachers))

    def _todo(self, traj: Trajectory) -> int:
        labels = self.store.contents.labels
        return sum(
            label_needed(labels.get((traj.uid, s.index, t.name)), self.retry_failed)
            for s in traj.screenshots
            for t in self.teachers.teachers
        )

    async def _key_points(self, traj: Trajectory) -> str | None:
        existing = self.store.contents.key_points.get((traj.uid, JUDGE_ORIGIN))
        if existing is not None and not call_failed(existing) and (existing.valid or not self.retry_failed):
            if not existing.valid:
                self.report.key_points_failed += 1
            return existing.key_points if existing.valid else None
        judge = self.teachers.key_points_judge.name
        if judge in self.stopped:
            return None
        try:
            done, points, error = await ask_key_points(self.judge, self.protocol, traj.task)
        except RunStopError as exc:
            self._stop(judge, exc)
            return None
        except JudgeCallError as exc:
            self.report.calls_failed += 1
            self.store.append(
                KeyPointsRecord(traj.uid, JUDGE_ORIGIN, None, False, f"{CALL_FAILED}: {exc}", judge)
            )
            self.report.key_points_failed += 1
            return None
        self.store.append(
            KeyPointsRecord(
                traj.uid,
                JUDGE_ORIGIN,
                points,
                points is not None,
                None if points is not None else f"unparseable key points: {error}",
                done.model,
                done.cost_usd,
                done.cached,
            )
        )
        if points is None:
            self.report.key_points_failed += 1
        return points

    async def _step(self, traj: Trajectory, shot: Screenshot, key_points: str) -> None:
        labels = self.store.contents.labels
        todo = []
        for t in self.teachers.teachers:
            if label_needed(labels.get((traj.uid, shot.index, t.name)), self.retry_failed):
                todo.append(t)
            else:
                self.report.labels_skipped += 1
        todo = [t for t in todo if t.name not in self.stopped]
        if not todo:
            return
        async with self.images:
            try:
                prepared = await asyncio.to_thread(shot.prepare, self.policy)
            except TrajectoryError as exc:
                logger.warning("not labelled: %s", exc)
                self.report.unreadable_screenshots.append(str(exc))
                self.progress.update(len(todo))
                return
            image_url = prepared.data_url
            del prepared
            await asyncio.gather(*(self._label(traj, shot.index, t, key_points, image_url) for t in todo))

    async def _label(
        self,
        traj: Trajectory,
        step: int,
        teacher: TeacherConfig,
        key_points: str,
        image_url: str,
    ) -> None:
        try:
            if teacher.name in self.stopped:
                return
            try:
                done, parsed = await ask_score(
                    self.clients[teacher.name], self.protocol, traj.task, key_points, image_url
                )
            except RunStopError as exc:
                self._stop(teacher.name, exc)
                return
            except JudgeCallError as exc:
                self.report.calls_failed += 1
                record = LabelRecord(
                    traj.uid,
                    step,
                    teacher.name,
                    None,
                    False,
                    f"{CALL_FAILED}: {exc}",
                    model=teacher.endpoint.model,
                    prompt_version=self.prompts.version,
                )
            else:
                valid = done.valid and parsed.valid
                record = LabelRecord(
                    traj.uid,
                    step,
                    teacher.name,
                    parsed.score if valid else None,
                    valid,
                    None if valid else f"unparseable answer: {done.error or parsed.error}",
                    text=done.text,
                    thought=parsed.thought,
                    model=done.model,
                    prompt_version=self.prompts.version,
                    cost_usd=done.cost_usd,
                    prompt_tokens=done.prompt_tokens,
                    completion_tokens=done.completion_tokens,
                    cached=done.cached,
                )
            self.store.append(record)
            self.report.labels_new += 1
            if not record.valid:
                self.report.labels_failed += 1
                reason = f"{teacher.name}, {(record.error or '').split(':')[0]}"
                self.report.failure_reasons[reason] = self.report.failure_reasons.get(reason, 0) + 1
                self.progress.set_postfix(failed=self.report.labels_failed, refresh=False)
        finally:
            self.progress.update(1)
            self.recorder.maybe_write()

    async def _outcome(self, traj: Trajectory, key_points: str, teacher: str) -> None:
        contents = self.store.contents
        if not label_needed(contents.outcomes.get((traj.uid, teacher)), self.retry_failed):
            return
        judge = self.teachers.key_points_judge.name
        labels = [contents.labels.get((traj.uid, s.index, teacher)) for s in traj.screenshots]
        if judge in self.stopped or any(lb is None or call_failed(lb) for lb in labels):
            return  # not every screenshot answered by this teacher yet: no verdict on partial scores
        records = [
            ScreenshotRecord(index=k, score=lb.score if lb is not None and lb.valid else None)
            for k, lb in enumerate(labels)
        ]
        chosen = select_kept(records, KEEP_THRESHOLD, mode=self.cfg.parse_mode)
        kept = [(traj.screenshots[k], labels[k].thought) for k in chosen]
        try:
            images = [(await asyncio.to_thread(shot.prepare, self.policy)).data_url for shot, _ in kept]
        except TrajectoryError as exc:
            logger.warning("no outcome verdict for %s by %s: %s", traj.uid, teacher, exc)
            return
        try:
            done, status = await ask_outcome(
                self.judge,
                self.protocol,
                traj.task,
                key_points,
                traj.actions,
                traj.thoughts,
                images,
                [thought for _, thought in kept],
            )
        except RunStopError as exc:
            self._stop(judge, exc)
            return
        except JudgeCallError as exc:
            self.report.calls_failed += 1
            self.store.append(OutcomeRecord(traj.uid, teacher, None, False, f"{CALL_FAILED}: {exc}"))
            return
        valid = done.valid and status.valid
        self.store.append(
            OutcomeRecord(
                traj.uid, teacher, status.success if valid else None, valid, None if valid else status.error
            )
        )
        self.report.outcomes_new += 1

    def _stop(self, name: str, exc: RunStopError) -> None:
        if name in self.stopped:
            return
        self.stopped.add(name)
        if isinstance(exc, EndpointDownError):
            logger.error("%s; no further call is sent to it in this run", exc)
            self.report.endpoints_down.append(str(exc))
        else:
            logger.warning("endpoint %r reached its budget: no further call is sent to it in this run", name)
            self.report.budget_stopped.append(name)


def run_synth(
    cfg: SynthConfig,
    *,
    dry_run: bool = False,
    retry_failed: bool = False,
    build: bool = True,
    shard: ShardSpec | None = None,
) -> SynthReport:
    """Label (resuming whatever a previous session left), then build the dataset unless ``build`` is False.

    With ``shard`` (I of N), label only that shard's trajectories into ``RUN/shard-I-of-N`` with 1/N of
    each budget and build nothing: ``keyshot synth merge RUN`` joins the shards and builds the dataset.
    """
    if shard is not None:
        cfg = dataclasses.replace(cfg, run_dir=str(Path(cfg.run_dir) / shard.folder))
        build = False
    try:
        prompts = load_prompt_set(cfg.prompt_variant)
    except ValueError as exc:
        raise SynthError(f"prompt_variant: {exc}") from None
    policy = cfg.policy()
    teachers = cfg.teacher_set()
    if shard is not None:
        teachers = shard_budgets(teachers, shard.count)
    run_dir = Path(cfg.run_dir)
    contents = read_store(run_dir / LABELS_FILE)
    unreadable: list[str] = []  # every shard reads them all: shard 0 reports them
    estimate = estimate_cost(
        (
            t
            for t in iter_trajectories(
                cfg.sources, unreadable, max_trajectories=cfg.max_trajectories, on_error=cfg.on_bad_trajectory
            )
            if shard is None or shard.holds(t)
        ),
        teachers,
        prompts,
        policy,
        contents,
        retry_failed=retry_failed,
        outcome=cfg.outcome,
        est_key_points_chars=cfg.est_key_points_chars,
        est_outcome_images=cfg.est_outcome_images,
    )
    logger.info("%s", estimate.table())
    if dry_run:
        listed = unreadable if shard is None or shard.index == 0 else []
        return SynthReport(estimate=estimate, dry_run=True, bad_trajectories=listed)

    every = [teachers.key_points_judge, *teachers.teachers]
    preflight([t.endpoint for t in every if not t.replicas])
    for t in every:
        if t.replicas:  # a teacher served by replicas is usable while one of them answers
            preflight([], pool=t.endpoints())

    with RunLock(run_dir):
        if shard is not None:  # a shard without a summary has not finished: keyshot synth merge waits
            (run_dir / SUMMARY_FILE).unlink(missing_ok=True)
        open_manifest(
            run_dir,
            prompt_variant=prompts.variant,
            prompt_version=prompts.version,
            image_policy=policy.to_dict(),
            parse_mode=cfg.parse_mode,
            kind="run",
            source=", ".join(s.path for s in cfg.sources),
        )
        ledger = UsageLedger()
        recorder = UsageRecorder(run_dir, "run", ledger)
        teachers = remaining_budgets(teachers, read_usage(run_dir))
        errors: list[str] = []
        total = sum(e.calls for name, e in estimate.endpoints.items() if name in teachers.names())
        with (
            LabelStore(run_dir) as store,
            CallCache(run_dir / CACHE_FILE) as cache,
            tqdm(total=total, desc="labels", unit="call", disable=None) as progress,
        ):
            session = _Run(
                cfg, teachers, prompts, policy, store, cache, ledger, retry_failed, progress, recorder
            )
            try:
                asyncio.run(
                    session.run(
                        t
                        for t in iter_trajectories(
                            cfg.sources,
                            errors,
                            max_trajectories=cfg.max_trajectories,
                            on_error=cfg.on_bad_trajectory,
                        )
                        if shard is None or shard.holds(t)
                    )
                )
            finally:
                recorder.write()
        report = session.report
        report.estimate = estimate
        report.bad_trajectories = errors
        report.usage = ledger.as_dict()
        report.usage_table = ledger.table()
        if shard is not None:
            if shard.index != 0:  # unreadable inputs are every shard's: shard 0 reports them
                report.bad_trajectories = []
            write_json_atomic(
                run_dir / SUMMARY_FILE,
                {"shard": str(shard), "exit_code": report.exit_code, "summary": report.summary()},
            )
    if report.labels_failed:
        logger.warning(
            "%d labels failed (recorded with their reason; --retry-failed asks again)", report.labels_failed
        )
    if build:
        report.dataset = build_dataset(run_dir, cfg.build)
    return report
