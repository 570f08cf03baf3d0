"""WebJudge prompt sets: protocol data with a version.

The strings live in ``prompts/webjudge_prompts.json`` exactly as the reference ships them
(trailing spaces kept; licence in ``prompts/LICENSE.md``). A prompt set's version is its variant
name plus a digest of its strings, so any edit to a string changes the version that datasets and
checkpoints record, and ``keyshot serve`` refuses a checkpoint trained on another version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from keyshot.infer.common.errors import KeyshotError

VARIANTS = ("online_mind2web", "general")
STEPS = ("key_points", "key_screenshot", "outcome")
_DATA = "webjudge_prompts.json"
_STEP_DATA = "key_point_steps.json"


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


def _raw() -> dict[str, str]:
    return json.loads(resources.files(__package__).joinpath("prompts", _DATA).read_text(encoding="utf-8"))


class PromptSetError(KeyshotError, ValueError):
    """A prompt variant or version this keyshot does not ship."""


@cache
def load_prompt_set(variant: str = "online_mind2web") -> PromptSet:
    """Return the prompt set ``variant`` ("online_mind2web", the WebJudge-7B one, or "general")."""
    if variant not in VARIANTS:
        raise PromptSetError(f"unknown prompt variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    prefix = variant + "."
    strings = tuple(sorted((k[len(prefix) :], v) for k, v in _raw().items() if k.startswith(prefix)))
    return PromptSet(variant=variant, strings=strings)


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
    """Return the shipped prompt set whose version is ``version``, or raise PromptSetError."""
    for variant in VARIANTS:
        ps = load_prompt_set(variant)
        if ps.version == version:
            return ps
    known = ", ".join(load_prompt_set(v).version for v in VARIANTS)
    raise PromptSetError(f"prompt version {version!r} is not shipped with this keyshot (known: {known})")
