"""What a training run reads, checked before any weight loads (``train/sft.py --check`` and a run): the
dataset and its prompt set, the model folder, the renderer under the configured pixel bounds, every shrunk
row rendered at its planned length; then the planned train and eval sets and the train loader."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from keyshot.infer.model.checkpoint import looks_like_local_path, model_folder_problem
from keyshot.infer.protocol.chat_template import (
    DataError,
    ScorerRenderer,
    image_policy_for,
    processor_pixel_bounds,
    set_processor_pixel_bounds,
)
from keyshot.train.batches import (
    ScorerCollator,
    ScorerDataset,
    build_batch_sampler,
    dataset_description,
    dataset_prompt_version,
    load_scorer_dataset,
)
from keyshot.train.train_config import TrainConfig

logger = logging.getLogger(__name__)


def _prompt_identity(ds, cfg: TrainConfig) -> tuple[str, str]:
    from keyshot.infer.protocol.prompts import load_prompt_set

    version = dataset_prompt_version(ds)
    if version is None:
        if cfg.data.prompt_variant is None:
            raise DataError(
                f"{cfg.data.path}: rows carry no prompt_version; set data.prompt_variant to the prompt set they used"
            )
        return cfg.data.prompt_variant, load_prompt_set(cfg.data.prompt_variant).version
    return version.split("@", 1)[0], version


def load_training_data(cfg: TrainConfig):
    """The dataset with its train split and its prompt set ``(ds, prompt_variant, prompt_version)``;
    DataError naming the path otherwise (what ``train/sft.py --check`` and a run both check)."""
    ds = load_scorer_dataset(cfg.data.path)
    if cfg.data.train_split not in ds:
        raise DataError(f"{cfg.data.path}: no split {cfg.data.train_split!r}; has {list(ds)}")
    return (ds, *_prompt_identity(ds, cfg))


def check_inputs(cfg: TrainConfig) -> str:
    """The training data (:func:`load_training_data`) and a local model path that must be a model folder,
    checked without loading the model or writing anything; DataError naming the path. Returns what was
    checked, in one line."""
    ds, _, prompt_version = load_training_data(cfg)
    model = str(cfg.model.name_or_path)
    if looks_like_local_path(model) and (problem := model_folder_problem(model)):
        raise DataError(
            f"{model}: model.name_or_path is not a model folder ({problem}); give a checkpoint folder or a hub id"
        )
    rows = ", ".join(f"{len(part):,} {split}" for split, part in ds.items())
    return f"dataset {cfg.data.path} ({rows} rows, prompt {prompt_version}), model {cfg.model.name_or_path}"


def model_load_error(name_or_path: str, what: str, exc: Exception) -> DataError:
    """The one line for a model whose ``what`` (processor, weights) could not be loaded: a local folder is
    named as one; a name that is no local folder says the hub could not give it (an offline cluster node)
    and how to point at a local copy."""
    reason = " ".join(str(exc).split())
    if looks_like_local_path(name_or_path):
        return DataError(f"{name_or_path}: model.name_or_path has no loadable {what} ({reason})")
    return DataError(
        f"{name_or_path}: model.name_or_path is no local folder and its {what} could not be had from the "
        f"Hugging Face hub ({reason}); point at a local copy with model.name_or_path=/path/to/folder, or "
        "on a node without network set HF_HUB_OFFLINE=1 with the model in the Hugging Face cache (HF_HOME)"
    )


def training_renderer(cfg: TrainConfig) -> ScorerRenderer:
    """The run's renderer: the model's processor under the configured pixel bounds, its image policy."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(cfg.model.name_or_path)
    except (OSError, ValueError) as exc:  # no processor files, an unrecognised one, a hub id not reachable
        raise model_load_error(str(cfg.model.name_or_path), "processor", exc) from None
    lo, hi = processor_pixel_bounds(processor)
    set_processor_pixel_bounds(processor, cfg.data.min_pixels or lo, cfg.data.max_pixels or hi)
    return ScorerRenderer(processor, image_policy_for(processor, cfg.data.max_aspect), cfg.data.max_length)


def check_rendering(data: ScorerDataset, sample: int = 32, seed: int = 0) -> str:
    """Render every shrunk example of ``data`` and ``sample`` of the others; DataError naming each row
    whose rendered length is not its planned length (with the numbers). Returns what was rendered."""
    shrunk = [i for i, plan in enumerate(data.plans) if plan.bounded]
    others = [i for i, plan in enumerate(data.plans) if not plan.bounded]
    rng = np.random.default_rng(seed)
    picked = sorted(int(i) for i in rng.choice(others, size=min(sample, len(others)), replace=False))
    problems = [p for i in shrunk + picked if (p := data.render_problem(i))]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError(
            f"{len(problems)} of {len(shrunk) + len(picked)} rendered rows differ from their plan: "
            + "; ".join(problems[:5])
            + more
        )
    return (
        f"{data.name}: {len(shrunk)} shrunk and {len(picked)} other rows render at their planned length "
        f"(max_length={data.renderer.max_length}; {data.stats.dropped_too_long} dropped, text alone too long; "
        f"{data.stats.dropped_no_image_room} dropped, no room for the image at min_pixels)"
    )


def check_training_rows(cfg: TrainConfig, sample: int = 32) -> str:
    """``train/sft.py --check``'s rendering check: plan the train split as a run would (the processor,
    no model weights) and :func:`check_rendering` it."""
    ds, _, _ = load_training_data(cfg)
    data = ScorerDataset(
        ds[cfg.data.train_split], training_renderer(cfg), max_samples=cfg.data.max_train_samples, name="train"
    )
    return check_rendering(data, sample, cfg.seed)


@dataclass
class TrainingData:
    """The dataset and its prompt set, the renderer, the planned train/eval sets and the train loader."""

    ds: Any
    prompt_variant: str
    prompt_version: str
    renderer: ScorerRenderer
    train_set: ScorerDataset
    eval_set: ScorerDataset | None
    collator: ScorerCollator
    sampler: Any
    loader: torch.utils.data.DataLoader


def load_data(cfg: TrainConfig, accelerator) -> TrainingData:
    renderer = training_renderer(cfg)
    logger.info("image policy: %s", renderer.policy.to_dict())
    ds, prompt_variant, prompt_version = load_training_data(cfg)
    _warn_if_prepared_for_other_bounds(ds, renderer.policy)
    with accelerator.main_process_first():
        train_set = ScorerDataset(
            ds[cfg.data.train_split],
            renderer,
            max_samples=cfg.data.max_train_samples,
            name="train",
            repeat_by_count=cfg.data.repeat_by_count,
        )
        eval_set = _eval_set(cfg, ds, renderer)
    collator = ScorerCollator(renderer.processor.tokenizer.pad_token_id, cfg.data.pad_to_multiple_of)
    sampler = build_batch_sampler(
        cfg.data.batching,
        train_set.lengths,
        cfg.per_device_batch_size,
        accelerator.num_processes,
        cfg.seed,
        accelerator.gradient_accumulation_steps,
        cfg.data.group_window,
    )
    loader = torch.utils.data.DataLoader(
        train_set,
        batch_sampler=sampler,
        collate_fn=collator,
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
    )
    return TrainingData(
        ds, prompt_variant, prompt_version, renderer, train_set, eval_set, collator, sampler, loader
    )


def _warn_if_prepared_for_other_bounds(ds, policy) -> None:
    recorded = dataset_description(ds).get("image_policy") or {}
    if recorded and (recorded.get("min_pixels"), recorded.get("max_pixels")) != (
        policy.min_pixels,
        policy.max_pixels,
    ):
        logger.warning(
            "the dataset's screenshots were prepared for pixel bounds %s..%s, the scorer trains (and is served) "
            "at %d..%d: every image is prepared again",
            recorded.get("min_pixels"),
            recorded.get("max_pixels"),
            policy.min_pixels,
            policy.max_pixels,
        )


def _eval_set(cfg: TrainConfig, ds, renderer: ScorerRenderer) -> ScorerDataset | None:
    """The evaluation split, planned; None (with a warning when one was asked for) when there is none."""
    split = cfg.data.eval_split
    if split and split in ds and len(ds[split]) == 0:
        logger.warning("%s: split %r is empty: no evaluation", cfg.data.path, split)
    elif split and split in ds:
        return ScorerDataset(ds[split], renderer, max_samples=cfg.eval.max_samples, name=split)
    elif split:
        logger.warning("%s: no split %r: no evaluation", cfg.data.path, split)
    return None
