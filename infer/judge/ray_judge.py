"""``keyshot judge --engine ray``: the judging step of a run (:mod:`keyshot.infer.judge.run`) on Ray Data.

Everything before and after judging is the one-process run's (inputs, protocol, run folder, lock, resume,
summary); only :func:`judge_on_ray` differs from :func:`~keyshot.infer.judge.run.judge_all`. Each Ray actor
builds the run's own :class:`~keyshot.infer.judge.pipeline.WebJudge` (the config's judge client and scorer,
the run's call cache, the cluster's ledger) and judges its trajectories; the driver writes each verdict as it
comes back, with the run's :class:`~keyshot.infer.protocol.verdicts.VerdictWriter`.

Nothing lost, nothing paid twice: a verdict is written once, when it is back (a lost worker's or node's
trajectories are judged again by Ray, their answered calls read from the call cache, which every actor
shares: ``OUT/calls.sqlite`` on a filesystem the nodes share). A killed driver leaves what was written; the
next run judges the rest and repays at most the calls that were in flight.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.common.errors import RunStopError
from keyshot.infer.engines.ray_engine import ClusterLedger, EngineOptions, EnginePlan, run_rows
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.judge.scorer_factory import build_scorer
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.model.checkpoint import CheckpointDescription
from keyshot.infer.protocol.verdicts import Verdict, verdict_key
from keyshot.infer.runs.summary import combine_cut_reports

logger = logging.getLogger(__name__)


class RemoteStop(RunStopError):
    """A run stop an actor met (a spent budget, an endpoint down, cut answers), as the driver reports it."""

    def __init__(self, message: str, exit_code: int, budget: bool):
        super().__init__(message)
        self.exit_code = exit_code
        self.budget = budget


@dataclass
class JudgeStage:
    """Built on each actor (:class:`~keyshot.infer.engines.ray_engine.Stage`): the run's WebJudge."""

    cfg: JudgeRunConfig
    cache_path: str
    ledger: ClusterLedger
    scorer_endpoint: EndpointConfig | None
    checkpoint: CheckpointDescription | None

    def __call__(self) -> JudgeStage:
        self.cache = CallCache(self.cache_path)
        judge = JudgeClient(self.cfg.judge, self.cache, self.ledger)
        scorer = build_scorer(self.cfg, self.cache, self.ledger, self.scorer_endpoint, self.checkpoint)
        self.webjudge = WebJudge(judge, scorer, self.cfg.pipeline)
        self.stopped: dict | None = None
        self.actor = f"{socket.gethostname()}:{os.getpid()}"
        return self

    async def one(self, trajectory: Trajectory) -> dict:
        if self.stopped is not None:  # not judged: left for the next run, as in one process
            return self.stopped
        try:
            verdict = await self.webjudge.judge(trajectory)
        except RunStopError as exc:
            budget = type(exc).__name__ == "BudgetExceededError"
            self.stopped = {"stopped": str(exc), "exit_code": exc.exit_code, "budget": budget}
            return self.stopped
        return {"verdict": verdict.to_dict(), "actor": self.actor, "cut": self.webjudge.cut_report()}

    def flush(self) -> None:
        self.ledger.flush()


@dataclass
class RayJudged:
    """What judging on Ray gave: the verdicts written, the stop met (if any), cut answers, the usage."""

    done: list[Verdict]
    stop_error: RunStopError | None
    cut_answers: list[dict]
    ledger: ClusterLedger
    plan: EnginePlan


def judge_on_ray(
    cfg: JudgeRunConfig,
    todo: list[Trajectory],
    writer,
    options: EngineOptions,
    nodes: int,
    *,
    cache_path: str,
    scorer_endpoint: EndpointConfig | None,
    checkpoint: CheckpointDescription | None,
) -> RayJudged:
    """Judge ``todo`` on the connected cluster, appending each verdict to ``writer`` as it comes back."""
    plan = options.plan(cfg.concurrency, nodes)
    ledger = ClusterLedger.create(options.slot_caps(cfg.called_endpoints(scorer_endpoint)))
    stage = JudgeStage(cfg, os.path.abspath(cache_path), ledger, scorer_endpoint, checkpoint)
    items = [("\x1f".join(verdict_key(t.task_id, t.agent, t.run)), t) for t in todo]
    written: set[str] = set()
    done: list[Verdict] = []
    cuts: dict[str, list[dict]] = {}
    stop: RunStopError | None = None
    logger.info(
        "judging %d trajectories on Ray: %d actor(s), at most %d in flight each",
        len(todo),
        plan.actors,
        plan.per_actor,
    )
    for key, result in run_rows(items, stage, plan):
        if "stopped" in result:  # that actor judges nothing more; the others stop at their own first refusal
            if stop is None:
                stop = RemoteStop(result["stopped"], result["exit_code"], result["budget"])
                logger.error("%s; stopping%s", stop, f": {stop.advice}" if stop.advice else "")
            continue
        if key in written:  # a retried block's second answer: one verdict per trajectory
            continue
        verdict = Verdict.from_dict(result["verdict"])
        writer.append(verdict)
        written.add(key)
        done.append(verdict)
        cuts[result["actor"]] = result["cut"]
    return RayJudged(done, stop, combine_cut_reports(list(cuts.values())), ledger, plan)
