"""Training-side checkpoints: the resumable training state, and the writer of the final servable folder.

This module is about *training*: what a run saves to resume after a kill or a requeue, and how it
writes its result. What a servable checkpoint folder is and how ``keyshot serve``/``keyshot judge``
read it (``keyshot.json``) is :mod:`keyshot.infer.model.checkpoint`.

``RUN/checkpoints/step_00000400/`` holds ``accelerator.save_state`` (model, optimizer, LR scheduler,
RNG states; DeepSpeed shards included) plus ``trainer_state.json`` (optimizer step, epoch, batches
of the epoch already consumed). A folder is written as ``step_N.partial`` and renamed when every
rank has finished, so a kill never leaves a half checkpoint that looks complete; the newest
``keep_last`` are kept.

``RUN/final/`` is a plain Hugging Face folder that ``AutoModelForImageTextToText`` and vLLM load as
it is: safetensors weights, the processor with the training pixel bounds, the chat template, a
greedy ``generation_config.json`` and ``keyshot.json`` (:mod:`keyshot.infer.model.checkpoint`). A LoRA run also
keeps its adapter in ``RUN/final_adapter/`` and merges it into ``RUN/final/``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import recover_folder, recover_folders, replace_folder, write_text_atomic
from keyshot.infer.model.checkpoint import CheckpointMeta, write_meta

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class ResumeError(KeyshotError, RuntimeError):
    """A checkpoint that cannot be resumed from."""


@dataclass
class TrainerState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epoch in progress
    batches_in_epoch: int = 0  # per-rank micro-batches of that epoch already consumed
    samples_seen: int = 0
    total_steps: int = 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


def _atomic_write_text(path: Path, text: str) -> None:
    write_text_atomic(path, text)


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep_last: int):
        self.root = Path(run_dir) / CHECKPOINTS
        self.keep_last = keep_last

    def completed(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        recover_folders(self.root)  # a step folder a killed save left aside
        found = []
        for d in self.root.iterdir():
            m = _STEP_DIR.match(d.name)
            if m and (d / STATE_FILE).exists():
                found.append((int(m.group(1)), d))
        return sorted(found)

    def latest(self) -> Path | None:
        done = self.completed()
        return done[-1][1] if done else None

    def save(self, accelerator, state: TrainerState) -> Path:
        """Save the full training state for ``state.step`` (every rank must call this)."""
        final = self.root / f"step_{state.step:08d}"
        partial = final.with_name(final.name + ".partial")
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(partial))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _atomic_write_text(partial / STATE_FILE, state.to_json())
            replace_folder(partial, final)  # a step saved again: the old folder or the new, never neither
            self._rotate()
            logger.info("checkpoint saved: %s", final)
        accelerator.wait_for_everyone()
        return final

    def _rotate(self) -> None:
        for _, old in self.completed()[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        for leftover in self.root.glob("step_*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)

    def load(self, accelerator, path: Path) -> TrainerState:
        try:
            data = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
            state = TrainerState(**data)
        except (OSError, json.JSONDecodeError, TypeError) as exc:
            raise ResumeError(f"{path / STATE_FILE}: unreadable trainer state ({exc})") from None
        accelerator.load_state(str(path))
        logger.info(
            "resumed from %s: step %d, epoch %d, batch %d",
            path,
            state.step,
            state.epoch,
            state.batches_in_epoch,
        )
        return state


def greedy_generation_config(model):
    """The base model's stop/pad tokens with greedy decoding and no sampling knobs."""
    from transformers import GenerationConfig

    base = getattr(model, "generation_config", None)
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    eos = getattr(base, "eos_token_id", None) or text.eos_token_id
    pad = getattr(base, "pad_token_id", None) or getattr(text, "pad_token_id", None)
    bos = getattr(base, "bos_token_id", None) or getattr(text, "bos_token_id", None)
    return GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, do_sample=False)


@contextmanager
def _swapped_in(out_dir: Path):
    """Yield a ``.partial`` folder beside ``out_dir``; on success it replaces ``out_dir`` whole
    (:func:`~keyshot.infer.common.fileio.replace_folder`: at every instant the old folder or the new)."""
    out_dir = Path(out_dir)
    recover_folder(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    replace_folder(tmp, out_dir)


def write_model_folder(model, processor, out_dir: Path, meta: CheckpointMeta, state_dict=None) -> Path:
    """Write a servable folder (weights, processor, chat template, greedy generation config, keyshot.json).

    Written next to ``out_dir`` and renamed into place, so ``out_dir`` is either the old or the new folder.
    """
    model.config.get_text_config().use_cache = True  # serving and generate() want the KV cache
    model.generation_config = greedy_generation_config(model)
    # save_pretrained reverts the key renaming recorded at load time. Under ZeRO-3 that record also holds
    # the legacy renamings and a PrefixChange, whose reversal gives "model.model.*" keys that nothing can
    # load. Without a record, transformers reverts its default mapping for the class: the layout of the
    # base checkpoint (model.layers.*, visual.*), which transformers and vLLM load.
    if getattr(model, "_weight_conversions", None) is not None:
        model._weight_conversions = None
    with _swapped_in(out_dir) as tmp:
        model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        processor.save_pretrained(tmp)
        write_meta(tmp, meta)
    return Path(out_dir)


def write_adapter_folder(peft_model, processor, out_dir: Path, meta: CheckpointMeta, state_dict=None) -> Path:
    """A LoRA adapter folder (peft files, processor, keyshot.json), written atomically."""
    with _swapped_in(out_dir) as tmp:
        peft_model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        processor.save_pretrained(tmp)
        write_meta(tmp, meta)
    return Path(out_dir)
