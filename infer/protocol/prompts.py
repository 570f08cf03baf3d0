"""WebJudge prompt sets: protocol data with a version.

The strings live in ``prompts/webjudge_prompts.json`` exactly as the reference ships them
(trailing spaces kept; licence in ``prompts/LICENSE.md``). A prompt set's version is its variant
name plus a digest of its strings, so any edit to a string changes the version that datasets and
checkpoints record, and ``keyshot serve`` refuses a checkpoint trained on another version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.registry import Registry, UnknownName

#: The variants keyshot ships (prompts/webjudge_prompts.json, registered below); :data:`PROMPT_SETS` holds
#: them and any other registered
VARIANTS = ("online_mind2web", "general")
STEPS = ("key_points", "key_screenshot", "outcome")
#: The strings every prompt set holds, by key
KEYS = (
    *(f"{step}.{role}" for step in STEPS for role in ("system", "user")),
    "outcome.user_without_screenshots",
)
_DATA = "webjudge_prompts.json"
_STEP_DATA = "key_point_steps.json"


@dataclass(frozen=True)
class PromptSource:
    """A prompt set as registered: ``strings()`` gives its strings by key (:data:`KEYS`; read when the set
    is first loaded), and the labels its scorer answers carry, which the reference parser splits on
    (:mod:`keyshot.infer.protocol.parsing`): ``reasoning_label``, ``score_label``, and whether the
    reasoning kept is its first paragraph (``online_mind2web``, as WebJudge-7B was trained) or all of it."""

    strings: Callable[[], Mapping[str, str]]
    reasoning_label: str
    score_label: str
    thought_is_first_paragraph: bool = False


#: The prompt sets by variant (``pipeline.prompt_variant``): keyshot's own two are read from
#: prompts/webjudge_prompts.json (registered below); :func:`register_prompt_set` adds another.
PROMPT_SETS: Registry[PromptSource] = Registry("prompt variant", "pipeline.prompt_variant")


def register_prompt_set(variant: str, source: PromptSource) -> PromptSource:
    """Register ``source`` as prompt variant ``variant`` (a name taken already is refused)."""
    return PROMPT_SETS.add(variant, source)


@dataclass(frozen=True)
class PromptSet:
    """The system/user strings of the three WebJudge steps for one variant."""

    variant: str
    strings: tuple[tuple[str, str], ...]  # (("key_points.system", "..."), ...), sorted

    @property
    def version(self) -> str:
        digest = hashlib.sha256(json.dumps(self.strings, ensure_ascii=False).encode()).hexdigest()
        return f"{self.variant}@{digest[:10]}"

    def get(self, key: str) -> str:
        for name, text in self.strings:
            if name == key:
                return text
        raise KeyError(f"prompt set {self.variant!r} has no string {key!r}")

    def system(self, step: str) -> str:
        return self.get(f"{step}.system")

    def user(self, step: str, *, with_screenshots: bool = True) -> str:
        if step == "outcome" and not with_screenshots:
            return self.get("outcome.user_without_screenshots")
        return self.get(f"{step}.user")


@cache
def _raw() -> dict[str, str]:
    return json.loads(resources.files(__package__).joinpath("prompts", _DATA).read_text(encoding="utf-8"))


def _shipped(variant: str) -> Callable[[], dict[str, str]]:
    prefix = variant + "."
    return lambda: {k[len(prefix) :]: v for k, v in _raw().items() if k.startswith(prefix)}


register_prompt_set(VARIANTS[0], PromptSource(_shipped(VARIANTS[0]), "**Reasoning**:", "Score", True))
register_prompt_set(VARIANTS[1], PromptSource(_shipped(VARIANTS[1]), "### Reasoning:", "### Score"))


class PromptSetError(KeyshotError, ValueError):
    """A prompt variant or version this keyshot does not know."""


def prompt_source(variant: str) -> PromptSource:
    """The registered prompt set ``variant``; PromptSetError naming the known ones when there is none."""
    try:
        return PROMPT_SETS.get(variant)
    except UnknownName as exc:
        raise PromptSetError(str(exc)) from None


@cache
def load_prompt_set(variant: str = "online_mind2web") -> PromptSet:
    """Return the prompt set ``variant`` ("online_mind2web", the WebJudge-7B one, "general", or one
    registered); PromptSetError when it is unknown or lacks one of :data:`KEYS`."""
    strings = dict(prompt_source(variant).strings())
    missing = [key for key in KEYS if key not in strings]
    if missing:
        raise PromptSetError(
            f"prompt set {variant!r} has no {', '.join(missing)} (a prompt set holds {', '.join(KEYS)})"
        )
    return PromptSet(variant=variant, strings=tuple(sorted(strings.items())))


@dataclass(frozen=True)
class StepPrompts:
    """keyshot's own question of when each key point was first met (``pipeline.step_rewards``): the
    follow-up of the outcome conversation (``followup``) and the line a per-key-point outcome call adds
    (``key_point_suffix``). Kept apart from the reference's strings, so a prompt set's version (which
    datasets and checkpoints record) is the same with step rewards on or off; its own version is
    ``steps@<digest>``."""

    followup: str
    key_point_suffix: str

    @property
    def version(self) -> str:
        digest = hashlib.sha256(json.dumps([self.followup, self.key_point_suffix]).encode()).hexdigest()
        return f"steps@{digest[:10]}"


@cache
def load_step_prompts() -> StepPrompts:
    """The step-attribution strings (``prompts/key_point_steps.json``)."""
    raw = json.loads(resources.files(__package__).joinpath("prompts", _STEP_DATA).read_text(encoding="utf-8"))
    return StepPrompts(followup=raw["followup"], key_point_suffix=raw["key_point_suffix"])


def prompt_set_for_version(version: str) -> PromptSet:
    """Return the prompt set whose version is ``version``, or raise PromptSetError."""
    for variant in PROMPT_SETS.names():
        ps = load_prompt_set(variant)
        if ps.version == version:
            return ps
    known = ", ".join(load_prompt_set(v).version for v in PROMPT_SETS.names())
    raise PromptSetError(f"prompt version {version!r} is not shipped with this keyshot (known: {known})")
