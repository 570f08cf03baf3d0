"""The cost estimate of a synthesis run: calls still to make, their tokens and dollars.

Printed before every ``keyshot synth run`` and all that ``--dry-run`` does. It counts the calls
that have no label yet: prompt tokens from the prompt text (each teacher's ``chars_per_token``) plus
its ``image_tokens`` rule on the screenshot's size (:mod:`keyshot.data_synth.teachers`), ``est_output_tokens``
per answer. Key points not yet known count ``est_key_points_chars``; outcome calls assume
``est_outcome_images`` kept screenshots. Calls already in the cache are counted too (their label
lines were lost), so the estimate is an upper bound.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from keyshot.data_synth.labels import JUDGE_ORIGIN, StoreContents, call_failed
from keyshot.data_synth.teachers import TeacherConfig, TeacherSet
from keyshot.infer.client.usage import token_cost_usd
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory
from keyshot.infer.protocol.images import ImagePolicy, open_header
from keyshot.infer.protocol.prompts import PromptSet


@dataclass
class EndpointEstimate:
    name: str
    calls: int = 0
    done: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    budget_usd: float | None = None

    def add(self, teacher: TeacherConfig, prompt_tokens: int) -> None:
        self.calls += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += teacher.est_output_tokens
        ep = teacher.endpoint
        self.cost_usd += token_cost_usd(
            prompt_tokens, teacher.est_output_tokens, ep.price_input_per_mtok, ep.price_output_per_mtok
        )


@dataclass
class CostEstimate:
    trajectories: int = 0
    screenshots: int = 0
    endpoints: dict[str, EndpointEstimate] = field(default_factory=dict)

    @property
    def total_usd(self) -> float:
        return sum(e.cost_usd for e in self.endpoints.values())

    @property
    def calls(self) -> int:
        return sum(e.calls for e in self.endpoints.values())

    def table(self) -> str:
        lines = [
            f"Cost estimate: {self.trajectories} trajectories, {self.screenshots} screenshots",
            "| endpoint | calls to make | already labelled | est. prompt tokens | est. completion tokens | est. cost $ | budget $ |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for e in self.endpoints.values():
            budget = "none" if e.budget_usd is None else f"{e.budget_usd:.2f}"
            lines.append(
                f"| {e.name} | {e.calls:,} | {e.done:,} | {e.prompt_tokens:,} | {e.completion_tokens:,} | "
                f"{e.cost_usd:.4f} | {budget} |"
            )
        lines.append(f"| **total** | {self.calls:,} | | | | {self.total_usd:.4f} | |")
        return "\n".join(lines)


def image_size(shot: Screenshot) -> tuple[int, int] | None:
    """Width and height from the image header (no decoding); None if unreadable."""
    try:
        return open_header(shot.data if shot.data is not None else shot.path).size
    except (OSError, ValueError, SyntaxError):  # (ImageError is a ValueError)
        return None


def label_needed(record: object | None, retry_failed: bool) -> bool:
    """Whether a record still has to be made: missing, its call failed (always asked again), or its
    answer was unreadable and ``retry_failed``."""
    return record is None or call_failed(record) or (retry_failed and not getattr(record, "valid", True))


def estimate_cost(
    trajectories: Iterable[Trajectory],
    teachers: TeacherSet,
    prompts: PromptSet,
    policy: ImagePolicy,
    contents: StoreContents,
    *,
    retry_failed: bool = False,
    outcome: bool = False,
    est_key_points_chars: int = 400,
    est_outcome_images: int = 2,
) -> CostEstimate:
    """Calls still to make and their estimated tokens and dollars (no call is made)."""
    est = CostEstimate()
    judge = teachers.key_points_judge
    for t in [judge, *teachers.teachers]:
        est.endpoints.setdefault(t.name, EndpointEstimate(t.name, budget_usd=t.endpoint.budget_usd))
    scorer_text = prompts.system("key_screenshot") + prompts.user("key_screenshot")
    for traj in trajectories:
        est.trajectories += 1
        est.screenshots += traj.num_screenshots
        kp = contents.key_points.get((traj.uid, JUDGE_ORIGIN))
        if label_needed(kp, retry_failed):
            text = prompts.system("key_points") + prompts.user("key_points") + traj.task
            est.endpoints[judge.name].add(judge, judge.text_token_count(text))
        kp_chars = len(kp.key_points) if kp is not None and kp.key_points else est_key_points_chars
        sizes = [image_size(s) for s in traj.screenshots]
        for teacher in teachers.teachers:
            text_tokens = teacher.text_token_count(scorer_text + traj.task) + kp_chars // int(
                teacher.chars_per_token
            )
            for step, size in enumerate(sizes):
                if size is None:
                    continue
                if not label_needed(contents.labels.get((traj.uid, step, teacher.name)), retry_failed):
                    est.endpoints[teacher.name].done += 1
                    continue
                est.endpoints[teacher.name].add(
                    teacher, text_tokens + teacher.image_token_count(*size, policy)
                )
            if (
                outcome
                and label_needed(contents.outcomes.get((traj.uid, teacher.name)), retry_failed)
                and sizes
            ):
                w, h = next((s for s in sizes if s is not None), (1280, 720))
                text = (
                    prompts.system("outcome") + prompts.user("outcome") + traj.task + " ".join(traj.actions)
                )
                tokens = judge.text_token_count(text) + est_outcome_images * judge.image_token_count(
                    w, h, policy
                )
                est.endpoints[judge.name].add(judge, tokens)
    return est
