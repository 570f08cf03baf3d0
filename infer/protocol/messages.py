"""The one builder of WebJudge chat messages (OpenAI chat format).

data_synth records ``scorer_messages`` in datasets, train renders them with the processor's chat
template, infer sends them to vLLM or a judge API: one function, so the three see the same prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from keyshot.infer.protocol.prompts import PromptSet, StepPrompts

MAX_KEPT_IMAGES = 50  # the reference's MAX_IMAGE
NO_DESCRIPTION = "(no description given)"


def _text(text: str) -> dict:
    return {"type": "text", "text": text}


def _image(url: str | None) -> dict:
    if url is None:  # placeholder rendered by the chat template; the pixels live in their own column
        return {"type": "image"}
    return {"type": "image_url", "image_url": {"url": url, "detail": "high"}}


def key_points_messages(prompts: PromptSet, task: str) -> list[dict]:
    """Step 1: ask the judge for the task's key points."""
    return [
        {"role": "system", "content": prompts.system("key_points")},
        {"role": "user", "content": [_text(prompts.user("key_points").format(task=task))]},
    ]


def scorer_messages(prompts: PromptSet, task: str, key_points: str, image_url: str | None) -> list[dict]:
    """Step 2: score one screenshot. ``image_url=None`` gives the dataset/chat-template form."""
    text = prompts.user("key_screenshot").format(task=task, key_points=key_points)
    return [
        {"role": "system", "content": prompts.system("key_screenshot")},
        {"role": "user", "content": [_text(text), _image(image_url)]},
    ]


def scorer_example(prompts: PromptSet, task: str, key_points: str, answer: str | None = None) -> list[dict]:
    """The dataset/training form of a scorer request (plus the target answer when given).

    Same turns and strings as :func:`scorer_messages` with ``image_url=None``; every ``content``
    is a list of parts so that Arrow stores the rows in one schema (a system string and a user
    list cannot share a column). The Qwen chat template renders both forms to the same text.
    """
    system, user = scorer_messages(prompts, task, key_points, image_url=None)
    turns = [{"role": "system", "content": [_text(system["content"])]}, user]
    if answer is not None:
        turns.append({"role": "assistant", "content": [_text(answer)]})
    return turns


def scorer_answer(thought: str, score: int) -> str:
    """The scorer's target answer, in the released WebJudge-7B style."""
    return f"**Reasoning**: {thought}\n\n**Score**: {score}"


def format_actions(actions: Sequence[str], agent_thoughts: Sequence[str] | None, prompts: PromptSet) -> str:
    """Numbered action history; the ``general`` variant appends the agent's reasoning when present."""
    if prompts.variant == "general" and agent_thoughts:
        return "\n".join(
            f"{i + 1}. {a}. Reasoning: {t}"
            for i, (a, t) in enumerate(zip(actions, agent_thoughts, strict=False))
        )
    return "\n".join(f"{i + 1}. {a}" for i, a in enumerate(actions))


def outcome_messages(
    prompts: PromptSet,
    task: str,
    key_points: str,
    actions: Sequence[str],
    agent_thoughts: Sequence[str] | None,
    kept_images: Sequence[str] | None,
    kept_thoughts: Sequence[str],
    mode: str = "strict",
) -> list[dict]:
    """Step 3: the outcome call with the kept screenshots (data URLs) and their descriptions.

    ``reference`` reproduces the reference: empty descriptions are dropped from the numbered list
    while their images stay (so the two can drift apart, defect 8), each list is cut to 50
    separately, and the JPEG images are labelled ``image/png`` (defect 1). ``strict`` needs one
    description per image, numbers them together and labels the images by their real type.
    ``kept_images=None`` sends the descriptions without the images (``outcome_images: none``, a deviation
    from the paper): the text is the one the screenshots would come with.
    """
    text_only = kept_images is None
    images, thoughts = list(kept_images or []), list(kept_thoughts)
    if text_only:
        thoughts = [t if t.strip() else NO_DESCRIPTION for t in thoughts][:MAX_KEPT_IMAGES]
    elif mode == "reference":
        thoughts = [t for t in thoughts if t != ""][:MAX_KEPT_IMAGES]
        images = [u.replace("data:image/jpeg;", "data:image/png;", 1) for u in images[:MAX_KEPT_IMAGES]]
    else:
        if len(images) != len(thoughts):
            raise ValueError(f"{len(images)} kept images but {len(thoughts)} descriptions: they must pair up")
        if len(images) > MAX_KEPT_IMAGES:
            raise ValueError(f"{len(images)} kept images; the outcome call takes at most {MAX_KEPT_IMAGES}")
        thoughts = [t if t.strip() else NO_DESCRIPTION for t in thoughts]
    fields = {
        "task": task,
        "key_points": key_points,
        "last_actions": format_actions(actions, agent_thoughts, prompts),
        "thoughts": "\n".join(f"{i + 1}. {t}" for i, t in enumerate(thoughts)),
    }
    text = prompts.user("outcome", with_screenshots=bool(images) or (text_only and bool(thoughts))).format(
        **fields
    )
    return [
        {"role": "system", "content": prompts.system("outcome")},
        {"role": "user", "content": [_text(text)] + [_image(u) for u in images]},
    ]


#: A screenshot as the step question lists it: its trajectory index, its score (None: none read) and its
#: description.
ListedShot = tuple[int, int | None, str]


def screenshot_listing(shots: Sequence[ListedShot]) -> str:
    """Every screenshot of a trajectory, one line each: ``Screenshot i (score s): description``."""
    lines = []
    for index, score, thought in shots:
        said = " ".join(thought.split()) or NO_DESCRIPTION
        lines.append(f"Screenshot {index} (score {score if score is not None else 'unread'}): {said}")
    return "\n".join(lines)


def key_point_steps_messages(
    steps: StepPrompts,
    outcome: list[dict],
    outcome_answer: str,
    key_points: Sequence[str],
    shots: Sequence[ListedShot],
) -> list[dict]:
    """The step question as a follow-up of the outcome conversation: its messages as sent (so the request
    shares their prefix), the judge's answer, then the question of when each key point was first met."""
    question = steps.followup.format(
        key_points="\n".join(f"{i + 1}. {p}" for i, p in enumerate(key_points)),
        screenshots=screenshot_listing(shots),
    )
    return [
        *outcome,
        {"role": "assistant", "content": outcome_answer},
        {"role": "user", "content": [_text(question)]},
    ]


def with_first_met_question(
    steps: StepPrompts, outcome: list[dict], shots: Sequence[ListedShot]
) -> list[dict]:
    """A per-key-point outcome request that also asks at which screenshot its key point was first met (a
    text part after the screenshots): the step comes with the status, at no call more."""
    *head, user = outcome
    suffix = steps.key_point_suffix.format(screenshots=screenshot_listing(shots))
    return [*head, {**user, "content": [*user["content"], _text(suffix)]}]
