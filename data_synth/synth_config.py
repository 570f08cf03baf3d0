"""The configuration of ``keyshot synth run`` (configs/synth/*.yaml): which trajectories, which teachers,
the prompt set and parse mode, the image policy, how much runs at once, and the dataset build."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from keyshot.data_synth.dataset import BuildConfig
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.sources import TrajectorySource
from keyshot.data_synth.teachers import TeacherSet, load_teacher_set
from keyshot.infer.common.config import ConfigError, load_config, read_config_file, resolve_config
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy


@dataclass
class SynthConfig:
    #: the shipped configs' folder a name two folders share is read from (``--config paper``)
    SHIPPED_FOLDER: ClassVar[str] = "synth"

    run_dir: str
    teachers: str | TeacherSet
    sources: list[TrajectorySource] = field(default_factory=list)
    prompt_variant: str = "online_mind2web"
    parse_mode: Literal["strict", "reference"] = "strict"
    image_policy: dict = field(default_factory=dict)
    max_trajectories: int | None = None
    trajectories_in_flight: int = 4
    images_in_flight: int = 16
    outcome: bool = False
    on_bad_trajectory: Literal["skip", "raise"] = "skip"
    est_key_points_chars: int = 400
    est_outcome_images: int = 2
    build: BuildConfig = field(default_factory=BuildConfig)

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("sources: give at least one trajectory folder or JSONL file")
        if self.trajectories_in_flight < 1 or self.images_in_flight < 1:
            raise ValueError("trajectories_in_flight and images_in_flight must be >= 1")

    def policy(self) -> ImagePolicy:
        try:
            return ImagePolicy.from_dict(self.image_policy) if self.image_policy else DEFAULT_POLICY
        except (TypeError, ValueError) as exc:
            raise SynthError(f"image_policy: {exc}") from None

    def teacher_set(self) -> TeacherSet:
        if isinstance(self.teachers, TeacherSet):
            return self.teachers
        return load_teacher_set(self.teachers)


def load_synth_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> SynthConfig:
    try:
        return load_config(SynthConfig, path, overrides)
    except (ConfigError, ValueError) as exc:
        where = f"{path}: " if path is not None and str(path) not in str(exc) else ""
        raise SynthError(f"{where}{exc}") from None


def load_build_config(path: str | os.PathLike | None, overrides: list[str] | None = None) -> BuildConfig:
    """A BuildConfig from a synth config's ``build:`` section or a build-only YAML, plus overrides: read
    as every config is (:func:`~keyshot.infer.common.config.load_config`: its errors name the file, the
    key and its line)."""
    if path is None:
        return load_config(BuildConfig, None, list(overrides or []))
    path = resolve_config(path, SynthConfig.SHIPPED_FOLDER)
    data, _ = read_config_file(path)
    section = "build" if "run_dir" in data or "teachers" in data else None  # a synth config: its build:
    return load_config(BuildConfig, path, list(overrides or []), section=section)
