"""Build the scorer's training set: a ``datasets.DatasetDict`` split by agent, streamed to disk.

Each row is one screenshot of one trajectory: ``messages`` (built by
:func:`keyshot.infer.protocol.messages.scorer_example`, the same builder infer uses, with the target answer as the
assistant turn), ``image`` (the JPEG of :func:`keyshot.infer.protocol.images.prepare_image`: exactly the pixels the
scorer is served), ``answer`` and ``score`` (the consensus), ``teacher_scores`` (every teacher's
score, validity and error) and provenance columns. Splits are by agent, so no agent's trajectories
appear in two splits: listed per split, or a seeded hash split of the agents.

Rows are generated one at a time (``Dataset.from_generator``) and written in small batches, so
memory does not grow with the number of screenshots. The folder is written atomically::

    DATASET/  dataset_dict.json, train/ validation/ test/ (Arrow shards), README.md (the card),
              scores.png, keyshot_dataset.json (prompt version, image policy, data hash)

Load it with ``datasets.load_from_disk(DATASET)``; publish it with
``load_from_disk(DATASET).push_to_hub("org/name")`` (keyshot never uploads anything itself).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import uuid
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from keyshot.data_synth.aggregate import AggregationConfig, AggregationReport, RowPlan, aggregate
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labels import JUDGE_ORIGIN, LABELS_FILE, StoreContents, read_store
from keyshot.data_synth.run_folder import DATASET_DIR, read_manifest, write_json_atomic
from keyshot.infer.protocol.images import (
    DEFAULT_POLICY,
    ImageError,
    ImagePolicy,
    PreparedImage,
    prepare_image,
)
from keyshot.infer.protocol.messages import scorer_example
from keyshot.infer.protocol.prompts import PromptSet, load_prompt_set

logger = logging.getLogger(__name__)

META_FILE = "keyshot_dataset.json"
SPLIT_ORDER = ("train", "validation", "test")
UNKNOWN_AGENT = "unknown"


# ---------------------------------------------------------------------------- splits
@dataclass
class SplitConfig:
    """``agents``: split name → agent names (agents listed nowhere are left out, and reported).
    Without ``agents``, agents are split by a seeded hash in the proportions of ``fractions``."""

    agents: dict[str, list[str]] = field(default_factory=dict)
    fractions: dict[str, float] = field(
        default_factory=lambda: {"train": 0.6, "validation": 0.2, "test": 0.2}
    )
    seed: int = 0

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for split, names in self.agents.items():
            for name in names:
                if name in seen:
                    raise ValueError(
                        f"splits.agents: agent {name!r} is listed in both {seen[name]!r} and {split!r}"
                    )
                seen[name] = split
        if not self.agents and (
            not self.fractions
            or any(v < 0 for v in self.fractions.values())
            or sum(self.fractions.values()) <= 0
        ):
            raise ValueError("splits.fractions must give each split a share >= 0, with a positive total")


def _hash01(seed: int, name: str) -> str:
    return hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()


def assign_splits(agents: list[str], cfg: SplitConfig) -> dict[str, str]:
    """Agent → split. With lists, unlisted agents get no split. With fractions, agents are ordered by
    a seeded hash and cut by largest remainders; every split with a positive share gets at least one
    agent when there are enough agents."""
    agents = sorted(set(agents))
    if cfg.agents:
        return {a: split for split, names in cfg.agents.items() for a in names if a in agents}
    total = sum(cfg.fractions.values())
    shares = {s: f / total for s, f in cfg.fractions.items()}
    n = len(agents)
    counts = {s: math.floor(shares[s] * n) for s in shares}
    by_remainder = sorted(shares, key=lambda s: (-(shares[s] * n - counts[s]), s))
    for s in by_remainder[: n - sum(counts.values())]:
        counts[s] += 1
    positive = [s for s in shares if shares[s] > 0]
    if n >= len(positive):
        for s in positive:
            while counts[s] == 0:
                donor = max(counts, key=lambda d: (counts[d], d))
                counts[donor] -= 1
                counts[s] += 1
    ordered = sorted(agents, key=lambda a: _hash01(cfg.seed, a))
    out: dict[str, str] = {}
    i = 0
    for split in sorted(shares, key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else 99, s)):
        for a in ordered[i : i + counts[split]]:
            out[a] = split
        i += counts[split]
    return out


# ---------------------------------------------------------------------------- features
def dataset_features():
    from datasets import Features, Image, List, Value

    text_part = {"type": Value("string"), "text": Value("string")}
    return Features(
        {
            "image": Image(),
            "messages": List({"role": Value("string"), "content": List(text_part)}),
            "answer": Value("string"),
            "score": Value("int32"),
            "teacher_scores": List(
                {
                    "teacher": Value("string"),
                    "model": Value("string"),
                    "score": Value("int32"),
                    "valid": Value("bool"),
                    "error": Value("string"),
                }
            ),
            "uid": Value("string"),
            "task_id": Value("string"),
            "step": Value("int32"),
            "agent": Value("string"),
            "benchmark": Value("string"),
            "task": Value("string"),
            "key_points": Value("string"),
            "teacher": Value("string"),
            "teacher_models": List(Value("string")),
            "prompt_version": Value("string"),
            "source": Value("string"),
            "human_label": Value("string"),
        }
    )


# ---------------------------------------------------------------------------- config and meta
@dataclass
class BuildConfig:
    """How a run's labels become a dataset. ``prompt_variant``/``image_policy`` default to the
    run's (``run.json``) and may differ from it only for runs made of imported labels alone."""

    aggregation: AggregationConfig = field(default_factory=AggregationConfig)
    splits: SplitConfig = field(default_factory=SplitConfig)
    output_dir: str | None = None
    prompt_variant: str | None = None
    image_policy: dict | None = None
    writer_batch_size: int = 64
    shard_size_mb: int = 32  # small Arrow shards keep save_to_disk's per-batch copies small
    image_workers: int = 1  # threads preparing screenshots (more help only on machines with idle cores)


@dataclass
class DatasetMeta:
    """What training writes into the checkpoint metadata (``keyshot_dataset.json``)."""

    prompt_variant: str
    prompt_version: str
    image_policy: dict
    data_hash: str
    rows: dict[str, int]
    teachers: list[str]
    aggregation: dict
    splits: dict


def read_dataset_meta(dataset_dir: str | os.PathLike) -> DatasetMeta:
    """The prompt version, image policy and data hash of a dataset built by keyshot."""
    path = Path(dataset_dir) / META_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SynthError(f"{path}: missing; {dataset_dir} was not built by keyshot synth build") from None
    except json.JSONDecodeError as exc:
        raise SynthError(f"{path}: not valid JSON ({exc.msg})") from None
    try:
        return DatasetMeta(**data)
    except TypeError as exc:
        raise SynthError(f"{path}: not a keyshot dataset description ({exc})") from None


@dataclass
class BuildResult:
    path: Path
    meta: DatasetMeta
    report: AggregationReport
    rows_written: dict[str, dict[tuple[str, int], int]]  # split -> (agent, score) -> rows
    unreadable: list[str]


# ---------------------------------------------------------------------------- rows
@dataclass
class _RowSource:
    """Everything to build one row except the pixels."""

    plan: RowPlan
    image_path: str
    fields: dict


def _row_sources(contents: StoreContents, plans: list[RowPlan], prompts: PromptSet) -> list[_RowSource]:
    out = []
    for plan in plans:
        traj = contents.trajectories[plan.uid]
        origin = plan.target.key_points_origin
        kp_record = contents.key_points.get((plan.uid, origin)) or contents.key_points.get(
            (plan.uid, JUDGE_ORIGIN)
        )
        if kp_record is None or kp_record.key_points is None:
            raise SynthError(
                f"label store: trajectory {plan.uid!r} has labels but no key points from {origin!r}"
            )
        key_points = kp_record.key_points
        out.append(
            _RowSource(
                plan=plan,
                image_path=str(traj.screenshots[plan.step]),
                fields={
                    "messages": scorer_example(prompts, traj.task, key_points, plan.answer),
                    "answer": plan.answer,
                    "score": plan.score,
                    "teacher_scores": [
                        {
                            "teacher": lb.teacher,
                            "model": lb.model,
                            "score": lb.score,
                            "valid": lb.valid,
                            "error": lb.error,
                        }
                        for lb in plan.labels
                    ],
                    "uid": plan.uid,
                    "task_id": traj.task_id,
                    "step": plan.step,
                    "agent": traj.agent or UNKNOWN_AGENT,
                    "benchmark": traj.benchmark,
                    "task": traj.task,
                    "key_points": key_points,
                    "teacher": plan.target.teacher,
                    "teacher_models": sorted({lb.model for lb in plan.labels if lb.model}),
                    "prompt_version": prompts.version,
                    "source": plan.target.source if plan.target.source != "api" else traj.source,
                    "human_label": traj.human_label,
                },
            )
        )
    return out


def _prepare(path: str, policy: ImagePolicy) -> PreparedImage | ImageError:
    try:
        return prepare_image(Path(path), policy)
    except ImageError as exc:
        return exc


class _RowStream:
    """Generates the rows of one split in order and hashes what it yields.

    Images are prepared just in time by ``workers`` threads (PIL releases the GIL while decoding,
    resizing and encoding) with at most ``2 × workers`` prepared images waiting, so memory stays flat.
    """

    def __init__(
        self, sources: list[_RowSource], policy: ImagePolicy, progress: tqdm | None, workers: int = 1
    ):
        self.sources = sources
        self.policy = policy
        self.progress = progress
        self.workers = max(1, workers)
        self.hasher = hashlib.sha256()
        self.written: dict[tuple[str, int], int] = {}  # (agent, score) -> rows
        self.unreadable: list[str] = []

    def _prepared(self) -> Iterator[tuple[_RowSource, PreparedImage | ImageError]]:
        if self.workers == 1:
            for src in self.sources:
                yield src, _prepare(src.image_path, self.policy)
            return
        window: deque[tuple[_RowSource, Future]] = deque()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="prepare-image") as pool:
            for src in self.sources:
                window.append((src, pool.submit(_prepare, src.image_path, self.policy)))
                if len(window) >= 2 * self.workers:
                    head, future = window.popleft()
                    yield head, future.result()
            while window:
                head, future = window.popleft()
                yield head, future.result()

    def __call__(self) -> Iterator[dict]:
        for src, prepared in self._prepared():
            if self.progress is not None:
                self.progress.update(1)
            if isinstance(prepared, ImageError):
                logger.warning("skipping row %s step %d: %s", src.plan.uid, src.plan.step, prepared)
                self.unreadable.append(str(prepared))
                continue
            row = dict(src.fields)
            row["image"] = {"bytes": prepared.jpeg, "path": None}
            self._hash(row, prepared.jpeg)
            key = (row["agent"], src.plan.score)
            self.written[key] = self.written.get(key, 0) + 1
            yield row

    def _hash(self, row: dict, jpeg: bytes) -> None:
        content = {k: row[k] for k in ("uid", "step", "messages", "answer", "score")}
        self.hasher.update(json.dumps(content, sort_keys=True, ensure_ascii=False).encode())
        self.hasher.update(hashlib.sha256(jpeg).digest())


# ---------------------------------------------------------------------------- build
def resolve_build_settings(run_dir: Path, cfg: BuildConfig) -> tuple[PromptSet, ImagePolicy]:
    manifest = read_manifest(run_dir)
    variant = cfg.prompt_variant or (manifest.prompt_variant if manifest else "online_mind2web")
    try:
        prompts = load_prompt_set(variant)
    except ValueError as exc:
        raise SynthError(f"build: {exc}") from None
    if cfg.image_policy is not None:
        try:
            policy = ImagePolicy.from_dict(cfg.image_policy)
        except (TypeError, ValueError) as exc:
            raise SynthError(f"build: image_policy: {exc}") from None
    elif manifest is not None and manifest.image_policy is not None:
        policy = ImagePolicy.from_dict(manifest.image_policy)
    else:
        policy = DEFAULT_POLICY
    if manifest is not None:
        if manifest.prompt_version != prompts.version:
            raise SynthError(
                f"{run_dir}: labels were made with prompt version {manifest.prompt_version!r}, "
                f"the build asks for {prompts.version!r}"
            )
        if manifest.image_policy is not None and ImagePolicy.from_dict(manifest.image_policy) != policy:
            raise SynthError(
                f"{run_dir}: teachers saw images under policy {manifest.image_policy}; the build asks for "
                f"{policy.to_dict()} (the dataset must hold the pixels the teachers labelled)"
            )
    return prompts, policy


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    """Silence datasets' own per-split progress bars while ours counts the rows."""
    import datasets

    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def build_dataset(run_dir: str | os.PathLike, cfg: BuildConfig | None = None) -> BuildResult:
    """Aggregate a run's labels and write the DatasetDict, its card and ``keyshot_dataset.json``."""
    from datasets import Dataset, DatasetDict

    from keyshot.data_synth.card import write_card

    cfg = cfg or BuildConfig()
    run = Path(run_dir)
    labels_path = run / LABELS_FILE
    if not labels_path.exists():
        raise SynthError(f"{labels_path}: no label store; run `keyshot synth run` or an import first")
    prompts, policy = resolve_build_settings(run, cfg)
    contents = read_store(labels_path)
    agents = sorted({t.agent or UNKNOWN_AGENT for t in contents.trajectories.values()})
    split_of = assign_splits(agents, cfg.splits)
    plans, report = aggregate(contents, cfg.aggregation, lambda agent: split_of.get(agent or UNKNOWN_AGENT))
    report.config = asdict(cfg.aggregation)
    unassigned = sorted(a for a in agents if a not in split_of)
    if unassigned:
        logger.warning("agents in no split (their rows are left out): %s", ", ".join(unassigned))
    if not plans:
        raise SynthError(f"{run}: no dataset row survives aggregation (dropped: {report.dropped})")

    sources = _row_sources(contents, plans, prompts)
    split_names = sorted(
        {p.split for p in plans}, key=lambda s: (SPLIT_ORDER.index(s) if s in SPLIT_ORDER else 99, s)
    )
    out = Path(cfg.output_dir) if cfg.output_dir else run / DATASET_DIR
    out.parent.mkdir(parents=True, exist_ok=True)
    features = dataset_features()
    hasher = hashlib.sha256()
    rows_written: dict[str, dict[tuple[str, int], int]] = {}
    unreadable: list[str] = []

    with tempfile.TemporaryDirectory(prefix=".build-", dir=out.parent) as tmp, _quiet_datasets():
        splits = {}
        with tqdm(total=len(sources), desc="dataset rows", unit="row", disable=None) as bar:
            for split in split_names:
                stream = _RowStream(
                    [s for s in sources if s.plan.split == split], policy, bar, cfg.image_workers
                )
                ds = Dataset.from_generator(
                    stream,
                    features=features,
                    cache_dir=str(Path(tmp) / "cache"),
                    fingerprint=uuid.uuid4().hex,
                    split=split,
                    writer_batch_size=cfg.writer_batch_size,
                )
                if len(ds) == 0:
                    logger.warning(
                        "split %s: every row's screenshot was unreadable; the split is left out", split
                    )
                    continue
                splits[split] = ds
                hasher.update(split.encode() + stream.hasher.digest())
                rows_written[split] = dict(sorted(stream.written.items()))
                unreadable.extend(stream.unreadable)
        if not splits:
            raise SynthError(f"{run}: no row could be written (every screenshot unreadable)")
        meta = DatasetMeta(
            prompt_variant=prompts.variant,
            prompt_version=prompts.version,
            image_policy=policy.to_dict(),
            data_hash="sha256:" + hasher.hexdigest(),
            rows={s: len(d) for s, d in splits.items()},
            teachers=contents.teachers(),
            aggregation=asdict(cfg.aggregation),
            splits={"agents": {a: s for a, s in sorted(split_of.items())}, "config": asdict(cfg.splits)},
        )
        for ds in splits.values():
            ds.info.description = json.dumps({"keyshot": asdict(meta)}, ensure_ascii=False)
        staged = Path(tmp) / "dataset"
        DatasetDict(splits).save_to_disk(str(staged), max_shard_size=f"{cfg.shard_size_mb}MB")
        del splits
        write_json_atomic(staged / META_FILE, asdict(meta))
        write_card(staged, run, contents, meta, report, rows_written, unreadable)
        _replace_dir(staged, out)
    logger.info("dataset written to %s: %s", out, meta.rows)
    return BuildResult(out, meta, report, rows_written, unreadable)


def _replace_dir(staged: Path, out: Path) -> None:
    """Move ``staged`` to ``out``, replacing an older build only once the new one is complete."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(out, old)
        os.replace(staged, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, out)
