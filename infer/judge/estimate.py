"""What a judging run would cost before any call is made: calls, tokens and dollars per endpoint, for
``keyshot judge --dry-run``.

Prompt tokens are the prompt text at :data:`CHARS_PER_TOKEN` characters a token plus each screenshot's
image tokens by its model's rule (:func:`keyshot.infer.client.usage.image_token_rule`) under the image
policy it is sent with; every answer counts :data:`ANSWER_TOKENS` (at most the endpoint's
``max_tokens``). The outcome call counts every screenshot as kept (up to ``pipeline.max_kept``) and a
key-point outcome mode :data:`KEY_POINTS` calls, so the estimate is an upper bound. With
``pipeline.step_rewards`` in ``cot`` mode, the step question is one call more: the outcome's prompt and
answer again, with a line per screenshot (:data:`LISTED_CHARS`); in the other modes each outcome call
carries that list. Dollars are the
endpoint's prices per million tokens (:func:`keyshot.infer.client.usage.token_cost_usd`); an endpoint
without prices (a local server) costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from keyshot.infer.client.endpoint import EndpointConfig
from keyshot.infer.client.usage import CHARS_PER_TOKEN, image_token_count, image_token_rule, token_cost_usd
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.images import REFERENCE_POLICY, ImagePolicy, open_header
from keyshot.infer.protocol.prompts import PromptSet, load_prompt_set, load_step_prompts

ANSWER_TOKENS = 250
KEY_POINTS = 3  # outcome calls a trajectory is assumed to need in key_point mode
KEY_POINTS_CHARS = 400  # the key points' text, quoted in the scorer's and the outcome's prompts
LISTED_CHARS = 300  # a screenshot's line in the step question (its score and description)


@dataclass
class EndpointCost:
    """The calls one endpoint would answer and what they would cost."""

    role: str
    model: str
    price_in: float = 0.0
    price_out: float = 0.0
    max_tokens: int = ANSWER_TOKENS
    budget_usd: float | None = None
    rule: str = "qwen"
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @classmethod
    def of(cls, role: str, endpoint: EndpointConfig) -> EndpointCost:
        return cls(
            role,
            endpoint.model,
            endpoint.price_input_per_mtok,
            endpoint.price_output_per_mtok,
            endpoint.max_tokens,
            endpoint.budget_usd,
            image_token_rule(endpoint.model),
        )

    def add(self, chars: int, images: int = 0) -> None:
        """One call with ``chars`` characters of text and ``images`` image tokens in its prompt."""
        self.calls += 1
        self.prompt_tokens += int(chars / CHARS_PER_TOKEN) + images
        self.completion_tokens += min(ANSWER_TOKENS, self.max_tokens)

    @property
    def cost_usd(self) -> float:
        return token_cost_usd(self.prompt_tokens, self.completion_tokens, self.price_in, self.price_out)


def image_sizes(trajectory: Trajectory) -> list[tuple[int, int]]:
    """Each readable screenshot's width and height, from its header (nothing is decoded)."""
    sizes = []
    for shot in trajectory.screenshots:
        try:
            sizes.append(open_header(shot.data if shot.data is not None else shot.path).size)
        except (OSError, ValueError, SyntaxError):  # unreadable: the run reports it, no call is made
            continue
    return sizes


def scorer_endpoint(cfg: JudgeRunConfig) -> EndpointConfig | None:
    sc = cfg.scorer
    return sc.endpoint or (sc.endpoints[0] if sc.endpoints else None)


def estimate_run(
    trajectories: list[Trajectory], cfg: JudgeRunConfig, policy: ImagePolicy
) -> list[EndpointCost]:
    """The judge's and the scorer's calls for ``trajectories``, screenshots scored under ``policy`` (the
    run's fingerprint says which); no call is made."""
    prompts = load_prompt_set(cfg.pipeline.prompt_variant)
    judge = EndpointCost.of("judge", cfg.judge)
    endpoint = scorer_endpoint(cfg)
    if cfg.scorer.judge_scores:
        scorer = judge
    elif cfg.scorer.backend == "openai" and endpoint is not None:
        scorer = EndpointCost.of("scorer", endpoint)
    else:
        scorer = EndpointCost("scorer (in-process)", cfg.scorer.checkpoint or "?")
    outcome_policy = {"scorer": policy, "original": REFERENCE_POLICY}.get(cfg.pipeline.outcome_images)
    for t in trajectories:
        sizes = image_sizes(t)
        judge.add(len(prompts.system("key_points") + prompts.user("key_points") + t.task))
        scorer_chars = len(prompts.system("key_screenshot") + prompts.user("key_screenshot") + t.task)
        for w, h in sizes:
            scorer.add(scorer_chars + KEY_POINTS_CHARS, image_token_count(scorer.rule, w, h, policy))
        _add_outcome(judge, prompts, t, sizes[: cfg.pipeline.max_kept], outcome_policy, cfg)
    return [judge] if scorer is judge else [judge, scorer]


def _add_outcome(
    judge: EndpointCost,
    prompts: PromptSet,
    t: Trajectory,
    kept: list[tuple[int, int]],
    policy: ImagePolicy | None,
    cfg: JudgeRunConfig,
) -> None:
    with_images = policy is not None
    text = prompts.system("outcome") + prompts.user("outcome", with_screenshots=with_images)
    chars = len(text + t.task + " ".join(t.actions)) + KEY_POINTS_CHARS
    if not with_images:  # the kept screenshots' descriptions instead
        chars += int(ANSWER_TOKENS * CHARS_PER_TOKEN) * len(kept)
    images = sum(image_token_count(judge.rule, w, h, policy) for w, h in kept) if with_images else 0
    listed = LISTED_CHARS * t.num_screenshots
    steps = load_step_prompts()
    if cfg.pipeline.step_rewards and cfg.pipeline.outcome_mode != "cot":
        chars += len(steps.key_point_suffix) + listed
    for _ in range(1 if cfg.pipeline.outcome_mode == "cot" else KEY_POINTS):
        judge.add(chars, images)
    if cfg.pipeline.step_rewards and cfg.pipeline.outcome_mode == "cot":
        answer = int(ANSWER_TOKENS * CHARS_PER_TOKEN)
        judge.add(chars + answer + len(steps.followup) + KEY_POINTS_CHARS + listed, images)


def estimate_table(costs: list[EndpointCost]) -> str:
    """The estimate as a Markdown table with a total row."""
    lines = [
        "| endpoint | model | calls | est. prompt tokens | est. completion tokens | est. cost $ | budget $ |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in costs:
        budget = "none" if c.budget_usd is None else f"{c.budget_usd:.2f}"
        lines.append(
            f"| {c.role} | {c.model} | {c.calls:,} | {c.prompt_tokens:,} | {c.completion_tokens:,} | "
            f"{c.cost_usd:.4f} | {budget} |"
        )
    total = sum(c.cost_usd for c in costs)
    lines.append(f"| **total** | | {sum(c.calls for c in costs):,} | | | {total:.4f} | |")
    return "\n".join(lines)
