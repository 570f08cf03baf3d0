"""The scorer's training data path: render, label, bound, batch.

Each dataset row holds ``messages`` (``keyshot.infer.protocol.messages.scorer_example``: system, user with an
``{"type": "image"}`` placeholder, assistant answer) and an ``image``. A row is rendered with the
processor's own chat template, its image goes through ``keyshot.infer.protocol.images.prepare_image`` under the
processor's pixel bounds (what ``keyshot serve`` sends), and only the last assistant answer and its
``<|im_end|>`` carry labels. A row longer than ``max_length`` gets a smaller ``max_pixels`` (fewer
visual tokens) instead of a cut, so image tokens are never truncated.

Batches: :class:`LengthGroupedBatchSampler` sorts windows of shuffled examples by length so a batch
pads little; :class:`RandomBatchSampler` is the naive baseline (``bench/train.py``).
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from keyshot.infer.common.fileio import recover_folder
from keyshot.infer.protocol.chat_template import (
    IGNORE_INDEX,
    NO_IMAGE_ROOM,
    DataError,
    ExamplePlan,
    ScorerRenderer,
    image_size,
)

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("messages", "image")


# ----------------------------------------------------------------------------- dataset on disk


def load_scorer_dataset(path: str | Path):
    """Load a ``DatasetDict`` saved with ``save_to_disk`` and check it has the scorer columns."""
    from datasets import Dataset, DatasetDict, load_from_disk

    p = Path(path)
    if str(path):
        recover_folder(p)  # a rebuild killed between its renames (where they are two) left the old one aside
    if not str(path) or not p.exists():
        raise DataError(f"{p}: dataset folder not found (set data.path to a `keyshot synth` output)")
    if not p.is_dir():
        raise DataError(f"{p}: a file, not a dataset folder (set data.path to the folder save_to_disk wrote)")
    if (p / "dataset").is_dir() and not (p / "dataset_dict.json").exists():
        raise DataError(
            f"{p}: a keyshot synth run folder; its dataset is {p / 'dataset'} (set data.path to it)"
        )
    try:
        ds = load_from_disk(str(p))
    except Exception as exc:  # missing metadata, corrupt Arrow, wrong version: the folder is named
        raise DataError(
            f"{p}: not a readable dataset saved with save_to_disk ({type(exc).__name__}: {exc}); rebuild it "
            "with `keyshot synth build`"
        ) from None
    if isinstance(ds, Dataset):
        ds = DatasetDict({"train": ds})
    for split, part in ds.items():
        missing = [c for c in REQUIRED_COLUMNS if c not in part.column_names]
        if missing:
            raise DataError(f"{p}: split {split!r} lacks column(s) {missing}; has {part.column_names}")
    return ds


def dataset_prompt_version(ds) -> str | None:
    """The prompt version recorded in the rows (``prompt_version`` column); it must be one value."""
    versions: set[str] = set()
    for split, part in ds.items():
        if "prompt_version" in part.column_names:
            versions.update(v for v in part.unique("prompt_version") if v)
        elif len(part):
            logger.warning("split %r has no prompt_version column", split)
    if len(versions) > 1:
        raise DataError(f"the dataset mixes prompt versions {sorted(versions)}; train on one prompt set")
    return versions.pop() if versions else None


def dataset_description(ds) -> dict:
    """What ``keyshot synth`` recorded about the dataset (``info.description`` = ``{"keyshot": {...}}``), or {}."""
    for part in ds.values():
        try:
            data = json.loads(part.info.description or "")
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict) and isinstance(data.get("keyshot"), dict):
            return data["keyshot"]
    return {}


def dataset_data_hash(ds, splits: Sequence[str]) -> str:
    """The dataset's own hash (recorded by ``keyshot synth``), else sha256 over the splits' Arrow files."""
    recorded = dataset_description(ds).get("data_hash")
    if recorded:
        return str(recorded)
    digest = hashlib.sha256()
    files = []
    for split in splits:
        for entry in ds[split].cache_files:
            files.append((split, Path(entry["filename"])))
    if not files:  # an in-memory dataset: hash its fingerprints
        for split in splits:
            digest.update(f"{split}:{ds[split]._fingerprint}".encode())
        return "sha256:" + digest.hexdigest()[:16]
    total = sum(f.stat().st_size for _, f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="data hash", leave=False) as bar:
        for split, f in files:
            digest.update(f"{split}:{f.name}".encode())
            with f.open("rb") as fh:
                while chunk := fh.read(1 << 22):
                    digest.update(chunk)
                    bar.update(len(chunk))
    return "sha256:" + digest.hexdigest()[:16]


# ----------------------------------------------------------------------------- dataset and batches


@dataclass
class PlanStats:
    rows: int = 0
    kept: int = 0
    bounded: int = 0
    dropped_too_long: int = 0  # the text alone exceeds max_length
    dropped_no_image_room: int = 0  # the text leaves less room than the smallest image the processor allows


def answer_token_stats(answer_tokens: Sequence[int]) -> dict[str, int]:
    """``{"max", "p99", "rows"}`` of the answers' token counts (each with its ``<|im_end|>``): the answer
    length a scorer is trained on, recorded in its checkpoint (``keyshot.json``'s ``answer_tokens``)."""
    counts = np.asarray(answer_tokens, dtype=np.int64)
    if not counts.size:
        return {}
    p99 = int(np.percentile(counts, 99, method="higher"))
    return {"max": int(counts.max()), "p99": p99, "rows": int(counts.size)}


class ScorerDataset(torch.utils.data.Dataset):
    """A split of a scorer dataset, rendered on access (so in DataLoader workers).

    A row whose rendering does not have its planned length (a bug of the plan, see
    :meth:`render_problem`) is not fatal: it is logged with its numbers, flagged (in memory shared
    with the DataLoader workers, :attr:`mismatched_rows`) and the next planned row takes its place,
    so every rank still runs the same steps with full batches.
    """

    def __init__(
        self,
        hf_split,
        renderer: ScorerRenderer,
        *,
        max_samples: int | None = None,
        name: str = "train",
        repeat_by_count: bool = False,
    ):
        from datasets import Image as ImageFeature

        self.renderer = renderer
        self.name = name
        self.rows = (
            hf_split if max_samples is None else hf_split.select(range(min(max_samples, len(hf_split))))
        )
        headers = self.rows.select_columns(["messages", "image"]).cast_column(
            "image", ImageFeature(decode=False)
        )
        self.stats = PlanStats(rows=len(self.rows))
        self.plans: list[ExamplePlan] = []
        for i, row in enumerate(tqdm(headers, desc=f"plan {name}", leave=False, mininterval=2.0)):
            plan = renderer.plan(i, row["messages"], image_size(row["image"]))
            if not isinstance(plan, ExamplePlan):
                if plan.reason == NO_IMAGE_ROOM:
                    self.stats.dropped_no_image_room += 1
                else:
                    self.stats.dropped_too_long += 1
                continue
            self.stats.bounded += plan.bounded
            self.plans.append(plan)
        self.stats.kept = len(self.plans)
        if repeat_by_count and "count" in self.rows.column_names:
            # A row stands for every occurrence of its request in the source (the dataset keeps identical
            # rows once, with their count): an epoch trains on each occurrence, as the labels were drawn.
            counts = self.rows["count"]
            self.plans = [plan for plan in self.plans for _ in range(max(1, int(counts[plan.row] or 1)))]
        logger.info(
            "%s: %d rows, %d kept, %d shrunk to fit max_length=%d (smaller max_pixels), %d dropped (text "
            "alone too long), %d dropped (text leaves no room for the image at min_pixels); %d examples "
            "an epoch",
            name,
            self.stats.rows,
            self.stats.kept,
            self.stats.bounded,
            renderer.max_length,
            self.stats.dropped_too_long,
            self.stats.dropped_no_image_room,
            len(self.plans),
        )
        if not self.plans:
            raise DataError(f"{name}: no row fits max_length={renderer.max_length}")
        self._mismatched = torch.zeros(len(self.plans), dtype=torch.uint8).share_memory_()

    @property
    def lengths(self) -> list[int]:
        return [p.length for p in self.plans]

    @property
    def answer_tokens(self) -> dict[str, int]:
        """The kept rows' answer lengths (:func:`answer_token_stats`)."""
        return answer_token_stats([p.answer_tokens for p in self.plans])

    def mismatch_flags(self) -> torch.Tensor:
        """1 for each example this process and its DataLoader workers skipped (rendered off its plan)."""
        return self._mismatched.long()

    @property
    def mismatched_rows(self) -> list[int]:
        """Dataset rows (``plan.row``) of the examples :meth:`mismatch_flags` marks."""
        return sorted({self.plans[i].row for i in self._mismatched.nonzero().flatten().tolist()})

    def __len__(self) -> int:
        return len(self.plans)

    def _render(self, i: int) -> dict[str, torch.Tensor]:
        plan = self.plans[i]
        row = self.rows[plan.row]
        return self.renderer.render(row["messages"], row["image"], plan.max_pixels)

    def render_problem(self, i: int, example: dict[str, torch.Tensor] | None = None) -> str | None:
        """Why example ``i`` does not render as planned (its row and the numbers), or None when it does."""
        plan = self.plans[i]
        example = self._render(i) if example is None else example
        rendered = example["input_ids"].numel()
        visual = int(example["image_grid_thw"][0].prod()) // 4
        if rendered == plan.length and visual == plan.visual_tokens:
            return None
        grid = "x".join(str(int(v)) for v in example["image_grid_thw"][0])
        return (
            f"{self.name} row {plan.row}: rendered {rendered} tokens, planned {plan.length} ({plan.describe()}; "
            f"the processor made {visual} visual tokens, grid {grid})"
        )

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        for step in range(len(self.plans)):
            j = (i + step) % len(self.plans)
            if self._mismatched[j]:
                continue
            example = self._render(j)
            problem = self.render_problem(j, example)
            if problem is None:
                return example
            self._mismatched[j] = 1
            logger.warning("%s: skipped (the next planned row trains in its place)", problem)
        raise DataError(f"{self.name}: no planned row renders at its planned length (see the warnings above)")

    def target_score(self, i: int) -> int | None:
        """The row's reference score: the ``score`` column, else the score in its answer."""
        from keyshot.infer.protocol.parsing import parse_score

        row = self.rows[self.plans[i].row]
        if row.get("score") is not None:
            return int(row["score"])
        answer = row["messages"][-1]
        text = (
            "".join(p.get("text") or "" for p in answer["content"]) if answer["role"] == "assistant" else ""
        )
        return parse_score(text).score

    def prompt(self, i: int) -> dict[str, torch.Tensor]:
        row = self.rows[self.plans[i].row]
        return self.renderer.render_prompt(row["messages"], row["image"])


@dataclass
class ScorerCollator:
    """Right-pads a list of rendered examples into a batch; images are concatenated as the model expects."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        longest = max(e["input_ids"].numel() for e in examples)
        if self.pad_to_multiple_of:
            longest = math.ceil(longest / self.pad_to_multiple_of) * self.pad_to_multiple_of
        pads = {
            "input_ids": self.pad_token_id,
            "attention_mask": 0,
            "labels": IGNORE_INDEX,
            "mm_token_type_ids": 0,
        }
        batch: dict[str, torch.Tensor] = {}
        for key, value in pads.items():
            if key not in examples[0]:
                continue
            out = torch.full((len(examples), longest), value, dtype=examples[0][key].dtype)
            for row, e in enumerate(examples):
                out[row, : e[key].numel()] = e[key]
            batch[key] = out
        batch["pixel_values"] = torch.cat([e["pixel_values"] for e in examples])
        batch["image_grid_thw"] = torch.cat([e["image_grid_thw"] for e in examples])
        return batch


class _StepBatchSampler(abc.ABC):
    """Yields per-device batches in groups of ``world_size`` (one global micro-step per group).

    accelerate's sharding hands batch ``k`` to rank ``k % world_size``, so each rank sees one batch of
    every group. Samples beyond a whole number of global micro-steps are left out of that epoch
    (a different few each epoch). ``set_epoch`` reseeds the order.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        world_size: int = 1,
        seed: int = 0,
        accumulation: int = 1,
        window: int = 64,
    ):
        self.lengths = np.asarray(lengths)
        self.window = window  # the length-grouped order's sort window, in global micro-steps
        self.batch_size = batch_size
        self.world_size = world_size
        self.seed = seed
        self.epoch = 0
        self.drop_last = True
        self.step_samples = batch_size * world_size
        # Whole optimizer steps only: every step sees exactly the global batch.
        self.num_steps = len(self.lengths) // (self.step_samples * accumulation) * accumulation
        if self.num_steps == 0:
            raise DataError(
                f"{len(self.lengths)} examples cannot fill one global batch of {batch_size} per device × "
                f"{world_size} processes × {accumulation} accumulation steps"
            )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rng(self) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch])

    @abc.abstractmethod
    def global_steps(self) -> list[list[list[int]]]:
        """The epoch's global micro-steps, each a list of ``world_size`` per-device batches."""

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.global_steps():
            yield from step

    def __len__(self) -> int:
        return self.num_steps * self.world_size

    def _split_step(self, idx: Sequence[int]) -> list[list[int]]:
        return [
            list(map(int, idx[r * self.batch_size : (r + 1) * self.batch_size]))
            for r in range(self.world_size)
        ]


class RandomBatchSampler(_StepBatchSampler):
    """The naive baseline: shuffled examples in fixed-size batches, padded to each batch's longest."""

    def global_steps(self) -> list[list[list[int]]]:
        perm = self._rng().permutation(len(self.lengths))[: self.num_steps * self.step_samples]
        return [
            self._split_step(perm[s * self.step_samples : (s + 1) * self.step_samples])
            for s in range(self.num_steps)
        ]


class LengthGroupedBatchSampler(_StepBatchSampler):
    """Shuffle, then sort each window of ``window`` global micro-steps by length; shuffle the steps.

    Batches hold examples of similar length (little padding) and the ranks of one step get similar
    lengths (little waiting at the gradient all-reduce); the order stays random across windows. The
    longest step runs first, so a batch that does not fit in memory fails at once.
    """

    def global_steps(self) -> list[list[list[int]]]:
        rng = self._rng()
        perm = rng.permutation(len(self.lengths))[: self.num_steps * self.step_samples]
        chunk = self.window * self.step_samples
        steps: list[np.ndarray] = []
        for w in range(0, len(perm), chunk):
            part = perm[w : w + chunk]
            part = part[np.argsort(-self.lengths[part], kind="stable")]
            steps.extend(part[s : s + self.step_samples] for s in range(0, len(part), self.step_samples))
        order = rng.permutation(len(steps))
        longest = int(np.argmax([self.lengths[s].max() for s in steps]))
        order = [longest] + [int(o) for o in order if o != longest]
        return [self._split_step(steps[o]) for o in order]


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Share of a run's token slots that are padding when each batch is padded to its longest."""
    real = padded = 0
    for batch in batches:
        lens = [lengths[i] for i in batch]
        real += sum(lens)
        padded += max(lens) * len(lens)
    return 1.0 - real / padded if padded else 0.0


def build_batch_sampler(
    kind: str,
    lengths: Sequence[int],
    batch_size: int,
    world_size: int,
    seed: int,
    accumulation: int,
    window: int,
):
    if kind == "length_grouped":
        return LengthGroupedBatchSampler(lengths, batch_size, world_size, seed, accumulation, window)
    if kind == "random":
        return RandomBatchSampler(lengths, batch_size, world_size, seed, accumulation, window)
    raise DataError(f"unknown batching {kind!r}; choose length_grouped or random")
