"""The in-process key-screenshot scorer: a checkpoint run with transformers, behind the same interface as
the endpoint back-end (:class:`keyshot.infer.judge.scorers.KeyScreenshotScorer`).

Batched greedy generation with left padding. It renders exactly the messages the endpoint back-end sends
(:func:`keyshot.infer.protocol.messages.scorer_messages`) through the scorer's one renderer (:mod:`keyshot.infer.protocol.chat_template`) with
the checkpoint's chat template, so for the same checkpoint (fp32, greedy) both back-ends give the same
answers (tests/infer/judge/test_scorer_parity.py). torch and transformers are imported when a scorer is built.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshot.infer.client.replies import answer_cut
from keyshot.infer.judge.scorers import KeyScreenshotScorer, ScreenshotScore
from keyshot.infer.model.checkpoint import CheckpointDescription, CheckpointError, describe_checkpoint
from keyshot.infer.protocol.images import ImagePolicy, PreparedImage
from keyshot.infer.protocol.messages import scorer_messages
from keyshot.infer.protocol.prompts import PromptSet

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """One greedy answer of :class:`TransformersScorer`."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    logprobs: list[dict] | None = None


def on_cuda(device: str) -> bool:
    """Whether the in-process scorer's ``device`` is a GPU (``cuda`` or ``cuda:N``)."""
    return str(device).startswith("cuda")


def scorer_dtype(device: str, dtype: str = "auto") -> str:
    """The torch dtype name the in-process scorer loads in: ``auto`` is bfloat16 on CUDA (a 7B in
    fp32 would need twice the memory for no gain) and float32 elsewhere (exact parity with vLLM
    ``--dtype float32`` on CPU)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if on_cuda(device) else "float32"


class TransformersScorer(KeyScreenshotScorer):
    """Scores in-process with transformers (greedy, batched, left-padded).

    Args:
        model_dir: a checkpoint folder (weights, processor, chat template; ``keyshot.json`` optional).
        prompts: the prompt set.
        device: ``cpu`` or ``cuda``.
        dtype: ``auto`` (bfloat16 on CUDA, float32 elsewhere), ``float32`` (exact parity with vLLM
            ``--dtype float32``), ``bfloat16`` or ``float16``.
        batch_size: screenshots per forward pass.
        max_new_tokens: answer length limit.
        logprobs: keep this many top alternatives per generated token and fill ``expected_score``.
        checkpoint: the folder's description when the caller has read it (else it is read here).
        tower_cuda_graphs: on CUDA, replay the vision tower from a CUDA graph for up to this many grids
            (a batch's screenshot sizes), each captured the first time it is seen
            (:func:`keyshot.infer.model.vision_graphs.use_tower_cuda_graphs`); 0: off.
    """

    backend = "transformers"

    def __init__(
        self,
        model_dir: str | Path,
        prompts: PromptSet,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 4,
        max_new_tokens: int = 512,
        parse_mode: str = "strict",
        logprobs: int | None = None,
        checkpoint: CheckpointDescription | None = None,
        tower_cuda_graphs: int = 0,
    ):
        super().__init__(prompts, parse_mode=parse_mode)
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        if tower_cuda_graphs and not on_cuda(device):
            raise ValueError(f"tower_cuda_graphs needs device cuda, not {device}; set it to 0")
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise CheckpointError(f"{model_dir}: not a model folder (no config.json)")
        self.checkpoint = checkpoint or describe_checkpoint(model_dir)
        policy = self.checkpoint.require_image_policy()
        processor = AutoProcessor.from_pretrained(model_dir)
        torch_dtype = getattr(torch, scorer_dtype(device, dtype))
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch_dtype).to(device)
        self._setup(model, processor, policy, device, batch_size, max_new_tokens, logprobs, model_dir)
        self.tower_cuda_graphs = tower_cuda_graphs

    @classmethod
    def from_model(
        cls,
        model: Any,
        processor: Any,
        prompts: PromptSet,
        policy: ImagePolicy,
        *,
        device: str,
        batch_size: int = 4,
        max_new_tokens: int = 512,
        parse_mode: str = "strict",
        logprobs: int | None = None,
    ) -> TransformersScorer:
        """A scorer over a model already in memory (``bench/gpu.py`` builds the 7B shape on the GPU)."""
        self = cls.__new__(cls)
        KeyScreenshotScorer.__init__(self, prompts, parse_mode=parse_mode)
        self._setup(
            model, processor, policy, device, batch_size, max_new_tokens, logprobs, Path("(in memory)")
        )
        return self

    def _setup(
        self,
        model: Any,
        processor: Any,
        policy: ImagePolicy,
        device: str,
        batch_size: int,
        max_new_tokens: int,
        logprobs: int | None,
        model_dir: Path,
    ) -> None:
        import torch

        from keyshot.infer.model.vision_attention import use_fast_vision_tower
        from keyshot.infer.protocol.chat_template import ScorerRenderer

        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.model_dir = model_dir
        self.device = device
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.logprobs = logprobs
        self._policy = policy
        self._torch = torch
        self.processor = processor
        self.processor.tokenizer.padding_side = "left"
        self.renderer = ScorerRenderer(
            processor, policy, max_length=model.config.get_text_config().max_position_embeddings
        )
        self.model = model
        use_fast_vision_tower(self.model)  # batched windows, matrix-product patch embedding, padded MLPs
        self.model.eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.processor.tokenizer.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos])
        self._pad = (
            gen.pad_token_id if gen.pad_token_id is not None else self.processor.tokenizer.pad_token_id
        )
        self._lock = threading.Lock()  # one generate at a time, whatever the event loop does
        self.tower_cuda_graphs = 0

    @property
    def name(self) -> str:
        return str(self.model_dir)

    @property
    def image_policy(self) -> ImagePolicy:
        return self._policy

    def render(self, task: str, key_points: str) -> str:
        """The prompt text of a scorer request, rendered by the checkpoint's chat template."""
        messages = scorer_messages(self.prompts, task, key_points, image_url=None)
        return self.renderer.chat_text(messages, generation_prompt=True)

    def encode(self, task: str, key_points: str, images: Sequence[PreparedImage]) -> Any:
        """Processor inputs (token ids, pixel values, grids) for a batch of one task's screenshots."""
        text = self.render(task, key_points)
        return self.processor(
            text=[text] * len(images), images=[img.pil() for img in images], padding=True, return_tensors="pt"
        )

    def prompt_tokens(self, task: str, key_points: str, image: PreparedImage) -> int:
        """Tokens of one scorer request as the processor counts them (vLLM's ``usage.prompt_tokens``)."""
        return int(self.encode(task, key_points, [image])["input_ids"].shape[1])

    def generate(self, task: str, key_points: str, images: Sequence[PreparedImage]) -> list[Generation]:
        """Greedy answers for ``images`` (blocking), in ``batch_size`` chunks."""
        out: list[Generation] = []
        for start in range(0, len(images), self.batch_size):
            out.extend(self._generate_batch(task, key_points, images[start : start + self.batch_size]))
        return out

    def _generate_batch(
        self, task: str, key_points: str, images: Sequence[PreparedImage]
    ) -> list[Generation]:
        torch = self._torch
        encoded = self.encode(task, key_points, images)
        grid = encoded["image_grid_thw"]  # read on the host, before it moves
        inputs = encoded.to(self.device)
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
        with self._lock:
            self._graph_tower(grid)
        with self._lock, torch.inference_mode():
            result = self.model.generate(
                **inputs,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                return_dict_in_generate=True,
                output_logits=bool(self.logprobs),
                pad_token_id=self._pad,
            )
        new_tokens = result.sequences[:, inputs["input_ids"].shape[1] :]
        tokenizer = self.processor.tokenizer
        generations = []
        for row, ids in enumerate(new_tokens.tolist()):
            length, finish = len(ids), "length"
            for i, tok in enumerate(ids):
                if tok in self._eos:
                    length, finish = i + 1, "stop"
                    break
            kept = ids[:length]
            # vLLM's incremental detokenizer never emits an incomplete UTF-8 sequence at the end of
            # an answer; a batch decode renders it as U+FFFD. Drop it so both back-ends agree.
            text = tokenizer.decode(kept, skip_special_tokens=True).rstrip("\ufffd")
            logprobs = None
            if self.logprobs:
                logprobs = self._token_logprobs(result.logits, row, kept, finish)
            generations.append(
                Generation(
                    text=text,
                    prompt_tokens=int(prompt_lengths[row]),
                    completion_tokens=length,
                    finish_reason=finish,
                    logprobs=logprobs,
                )
            )
        return generations

    def _graph_tower(self, grid_thw: Any) -> None:
        """Capture the tower for this batch's grid, while fewer than ``tower_cuda_graphs`` are."""
        if not self.tower_cuda_graphs:
            return
        from keyshot.infer.model.vision_graphs import captured_grids, use_tower_cuda_graphs
        from keyshot.infer.model.vision_packing import grid_of

        grid = grid_of(grid_thw)
        held = captured_grids(self.model)
        if grid not in held and len(held) < self.tower_cuda_graphs:
            use_tower_cuda_graphs(self.model, [grid])

    def _token_logprobs(self, logits: Sequence[Any], row: int, ids: list[int], finish: str) -> list[dict]:
        torch = self._torch
        tokenizer = self.processor.tokenizer
        out = []
        visible = ids[:-1] if finish == "stop" else ids  # the stop token is not part of the text
        for step, tok in enumerate(visible):
            lp = torch.log_softmax(logits[step][row].float(), dim=-1)
            top = torch.topk(lp, self.logprobs)
            out.append(
                {
                    "token": tokenizer.decode([tok], skip_special_tokens=True),
                    "logprob": float(lp[tok]),
                    "top_logprobs": [
                        {"token": tokenizer.decode([int(t)]), "logprob": float(v)}
                        for v, t in zip(top.values.tolist(), top.indices.tolist(), strict=True)
                    ],
                }
            )
        return out

    def _to_score(self, gen: Generation) -> ScreenshotScore:
        return self.to_score(
            gen.text,
            gen.logprobs,
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            finish_reason=gen.finish_reason,
            cut=answer_cut(gen.finish_reason, gen.completion_tokens, self.max_new_tokens),
        )

    async def score(self, task: str, key_points: str, image: PreparedImage) -> ScreenshotScore:
        return (await self.score_many(task, key_points, [image]))[0]

    async def _score_unique(
        self, task: str, key_points: str, images: Sequence[PreparedImage]
    ) -> list[ScreenshotScore]:
        if not images:
            return []
        try:
            generations = await asyncio.to_thread(self.generate, task, key_points, list(images))
        except (RuntimeError, ValueError) as exc:  # e.g. out of memory, an image the processor rejects
            logger.warning("transformers scorer failed on a batch of %d: %s", len(images), exc)
            return [ScreenshotScore.failed(f"{type(exc).__name__}: {exc}") for _ in images]
        return [self._to_score(g) for g in generations]
