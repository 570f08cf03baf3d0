"""Build the scorer's training set: a ``datasets.DatasetDict`` with no screenshot in two splits, streamed to disk.

Each row is one screenshot request: ``messages`` (built by :func:`keyshot.infer.protocol.messages.scorer_example`, the
same builder infer uses, with the target answer as the assistant turn), ``image`` (the JPEG of
:func:`keyshot.infer.protocol.images.prepare_image`: exactly the pixels the scorer is served), ``answer`` and ``score``
(the consensus), ``teacher_scores`` (every teacher's score, validity and error), ``count`` and
provenance columns. Rows are keyed by content (the sha256 of the scorer image, the JPEG the row holds,
and of the request messages): identical rows (one episode in two layouts, an agent stuck on a page,
files of other bytes that prepare to the same image) are one row whose
``count`` says how many times it occurred; a trainer may weight a row's loss by it. Splits keep
trajectories that share a screenshot together, by agent where the agents can meet the requested
fractions, else by task group (:mod:`keyshot.data_synth.splits`); the card and ``keyshot_dataset.json`` say
which, why, the fractions asked for and reached, and what was collapsed or grouped.

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
import os
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from keyshot.data_synth.aggregate import AggregationConfig, AggregationReport, RowPlan, aggregate, collapse
from keyshot.data_synth.card import render_card, write_card
from keyshot.data_synth.dataset_meta import DatasetMeta, write_dataset_meta
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labels import JUDGE_ORIGIN, LABELS_FILE, StoreContents, read_store
from keyshot.data_synth.run_folder import DATASET_DIR, read_manifest
from keyshot.data_synth.splits import UNKNOWN_AGENT, SplitConfig, SplitPlan, plan_splits, split_rank
from keyshot.infer.common.fileio import replace_folder
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
            "count": Value("int32"),
        }
    )


# ---------------------------------------------------------------------------- config and result
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
class BuildResult:
    path: Path
    meta: DatasetMeta
    report: AggregationReport
    rows_written: dict[str, dict[tuple[str, int], int]]  # split -> (agent, score) -> rows
    unreadable: list[str]
    empty_splits: dict[str, str] = field(default_factory=dict)  # split asked for -> why it has no row

    def empty_split_lines(self) -> list[str]:
        return [f"split {split} is empty: {why}" for split, why in self.empty_splits.items()]


# ---------------------------------------------------------------------------- rows
@dataclass
class _RowSource:
    """Everything to build one row except the pixels."""

    plan: RowPlan
    image_path: str
    fields: dict


def _key_points(contents: StoreContents, plan: RowPlan) -> str:
    """The key points the row's target label was made with (else the run's judge's)."""
    origin = plan.target.key_points_origin
    record = contents.key_points.get((plan.uid, origin)) or contents.key_points.get((plan.uid, JUDGE_ORIGIN))
    if record is None or record.key_points is None:
        raise SynthError(f"label store: trajectory {plan.uid!r} has labels but no key points from {origin!r}")
    return record.key_points


def _screenshot_hashes(
    contents: StoreContents, policy: ImagePolicy, workers: int
) -> dict[str, list[str | None]]:
    """uid → the sha256 of each screenshot's scorer image: the JPEG the row holds and the teachers were
    sent (None: no pixels, or unreadable). Files of other bytes but the same pixels (a layout that
    re-saved them, a page that did not change but for a pixel) are the same screenshot; each distinct
    file is prepared once."""

    def file_digest(path: str) -> str | None:
        try:
            return hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return None

    def image_digest(path: str) -> str | None:
        try:
            return hashlib.sha256(prepare_image(Path(path), policy).jpeg).hexdigest()
        except ImageError:
            return None

    paths = sorted({p for t in contents.trajectories.values() for p in t.screenshots if p})
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="hash-image") as pool:
        files = dict(zip(paths, pool.map(file_digest, paths), strict=True))
        first = {digest: path for path, digest in reversed(files.items()) if digest is not None}
        images = dict(zip(first, pool.map(image_digest, first.values()), strict=True))
    hashes = {path: images[digest] if digest is not None else None for path, digest in files.items()}
    return {
        uid: [hashes[p] if p else None for p in t.screenshots] for uid, t in contents.trajectories.items()
    }


def _content_key(
    contents: StoreContents, prompts: PromptSet, hashes: dict[str, list[str | None]]
) -> Callable[[RowPlan], str]:
    """A row's content: its scorer image's hash and its request's (an unreadable screenshot: its place)."""

    def key(plan: RowPlan) -> str:
        image = hashes[plan.uid][plan.step]
        if image is None:
            return f"\0{plan.uid}\0{plan.step}"
        traj = contents.trajectories[plan.uid]
        request = scorer_example(prompts, traj.task, _key_points(contents, plan))
        blob = json.dumps(request, sort_keys=True, ensure_ascii=False).encode()
        return image + hashlib.sha256(blob).hexdigest()

    return key


def _row_sources(contents: StoreContents, plans: list[RowPlan], prompts: PromptSet) -> list[_RowSource]:
    out = []
    for plan in plans:
        traj = contents.trajectories[plan.uid]
        key_points = _key_points(contents, plan)
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
                    "count": plan.count,
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

    def started(self) -> Callable[[], Iterator[dict]] | None:
        """The rows as a generator for ``Dataset.from_generator``, its first row already made; None
        when the split has no row to write (datasets cannot build a split without one)."""
        rows = self()
        first = next(rows, None)
        if first is None:
            return None

        def resumed() -> Iterator[dict]:
            yield first
            yield from rows

        return resumed

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
        content = {k: row[k] for k in ("uid", "step", "messages", "answer", "score", "count")}
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

    cfg = cfg or BuildConfig()
    run = Path(run_dir)
    labels_path = run / LABELS_FILE
    if not labels_path.exists():
        raise SynthError(f"{labels_path}: no label store; run `keyshot synth run` or an import first")
    prompts, policy = resolve_build_settings(run, cfg)
    contents = read_store(labels_path)
    hashes = _screenshot_hashes(contents, policy, cfg.image_workers)
    content_key = _content_key(contents, prompts, hashes)
    split_plan = _plan_splits(contents, cfg, hashes, content_key)
    plans, report = aggregate(
        contents, cfg.aggregation, lambda traj: split_plan.split_of.get(traj.uid), content_key
    )
    report.config = asdict(cfg.aggregation)
    if not plans:
        raise SynthError(f"{run}: no dataset row survives aggregation (dropped: {report.dropped})")

    sources = _row_sources(contents, plans, prompts)
    split_names = sorted({p.split for p in plans}, key=split_rank)
    out = Path(cfg.output_dir) if cfg.output_dir else run / DATASET_DIR
    out.parent.mkdir(parents=True, exist_ok=True)
    features = dataset_features()
    hasher = hashlib.sha256()
    rows_written: dict[str, dict[tuple[str, int], int]] = {}
    unreadable: list[str] = []

    with tempfile.TemporaryDirectory(prefix=".build-", dir=out.parent) as tmp, _quiet_datasets():
        splits = {}
        empty: dict[str, str] = {}
        with tqdm(total=len(sources), desc="dataset rows", unit="row", disable=None) as bar:
            for split in split_names:
                stream = _RowStream(
                    [s for s in sources if s.plan.split == split], policy, bar, cfg.image_workers
                )
                rows = stream.started()
                if rows is None:  # datasets refuses a split without rows: it is left out, and said so
                    empty[split] = (
                        f"all {len(stream.sources)} of its rows have an unreadable screenshot (listed above); "
                        f"replace those screenshots and build again"
                    )
                    unreadable.extend(stream.unreadable)
                    continue
                splits[split] = Dataset.from_generator(
                    rows,
                    features=features,
                    cache_dir=str(Path(tmp) / "cache"),
                    fingerprint=uuid.uuid4().hex,
                    split=split,
                    writer_batch_size=cfg.writer_batch_size,
                )
                hasher.update(split.encode() + stream.hasher.digest())
                rows_written[split] = dict(sorted(stream.written.items()))
                unreadable.extend(stream.unreadable)
        if not splits:
            raise SynthError(f"{run}: no row could be written (every screenshot unreadable)")
        empty.update(_unplaced_splits(split_plan, cfg.splits, split_names))
        empty = dict(sorted(empty.items(), key=lambda kv: split_rank(kv[0])))
        meta = DatasetMeta(
            prompt_variant=prompts.variant,
            prompt_version=prompts.version,
            image_policy=policy.to_dict(),
            data_hash="sha256:" + hasher.hexdigest(),
            rows={s: len(d) for s, d in splits.items()},
            teachers=contents.teachers(),
            aggregation=asdict(cfg.aggregation),
            splits=_split_summary(split_plan, cfg.splits, contents, plans, hashes, splits),
            duplicates={"rows_collapsed": report.duplicates, "score_conflicts": report.duplicate_conflicts},
        )
        for ds in splits.values():
            ds.info.description = json.dumps({"keyshot": asdict(meta)}, ensure_ascii=False)
        staged = Path(tmp) / "dataset"
        DatasetDict(splits).save_to_disk(str(staged), max_shard_size=f"{cfg.shard_size_mb}MB")
        del splits
        write_dataset_meta(staged, meta)
        card = render_card(run, contents, meta, report, rows_written, unreadable)
        write_card(staged, card, contents, rows_written)
        replace_folder(staged, out)  # an older build is replaced only once the new one is complete
    logger.info("dataset written to %s: %s", out, meta.rows)
    return BuildResult(out, meta, report, rows_written, unreadable, empty)


def _unplaced_splits(split_plan: SplitPlan, cfg: SplitConfig, planned: list[str]) -> dict[str, str]:
    """Why each split the config asks for got no row to write, and what to do about it."""
    out = {}
    if cfg.agents:
        for split, agents in cfg.agents.items():
            if split not in planned:
                out[split] = (
                    f"no trajectory of its agents ({', '.join(agents) or 'none listed'}) has a row; "
                    f"add their trajectories or list other agents under splits.agents.{split}"
                )
        return out
    for split, share in split_plan.requested.items():
        if share > 0 and split not in planned:
            out[split] = (
                f"the {split_plan.groups} trajectory group(s) with rows went to other splits; add "
                f"trajectories, or set splits.fractions.{split}=0 to build without it"
            )
    return out


def _plan_splits(
    contents: StoreContents, cfg: BuildConfig, hashes: dict[str, list[str | None]], content_key
) -> SplitPlan:
    """Split the trajectories by the rows aggregation would make of them (identical rows counted once)."""
    every, _ = aggregate(contents, cfg.aggregation, lambda _traj: "", None)  # "": no split is balanced
    rows = dict.fromkeys((p.uid for p in every), 0)
    for plan in collapse(
        every, content_key, AggregationReport(), lambda p: contents.trajectories[p.uid].agent is None
    ):
        rows[plan.uid] += 1
    split_plan = plan_splits(contents.trajectories, hashes, rows, cfg.splits)
    left_out = sorted(
        {contents.trajectories[u].agent or UNKNOWN_AGENT for u in rows}
        - {contents.trajectories[u].agent or UNKNOWN_AGENT for u in split_plan.split_of}
    )
    if left_out:
        logger.warning("agents in no split (their rows are left out): %s", ", ".join(left_out))
    return split_plan


def _split_summary(
    split_plan: SplitPlan,
    cfg: SplitConfig,
    contents: StoreContents,
    plans: list[RowPlan],
    hashes: dict[str, list[str | None]],
    written: dict,
) -> dict:
    """What ``keyshot_dataset.json`` and the card say about the splits: the plan, the shares of the
    rows written, each agent's splits and, as a check, the screenshots found in two splits (none)."""
    total = sum(len(ds) for ds in written.values()) or 1
    splits_of_image: dict[str, set[str]] = {}
    agents: dict[str, set[str]] = {}
    for plan in plans:
        if plan.split in written:
            digest = hashes[plan.uid][plan.step]
            if digest is not None:
                splits_of_image.setdefault(digest, set()).add(plan.split)
            agents.setdefault(contents.trajectories[plan.uid].agent or UNKNOWN_AGENT, set()).add(plan.split)
    return {
        **split_plan.as_dict(),
        "achieved": {
            s: round(len(written[s]) / total, 4) if s in written else 0.0
            for s in sorted(set(written) | set(split_plan.requested) | set(cfg.agents), key=split_rank)
        },
        "screenshots_in_two_splits": sum(len(s) > 1 for s in splits_of_image.values()),
        "agents": {a: sorted(s, key=split_rank) for a, s in sorted(agents.items())},
        "config": asdict(cfg),
    }
