"""Key-screenshot scorers: step 2 of WebJudge, one 1-5 relevance score per screenshot.

Two back-ends behind one interface (:class:`KeyScreenshotScorer`):

* :class:`OpenAIScorer` calls any OpenAI-compatible endpoint through :class:`infer.client.JudgeClient`:
  a keyshot checkpoint served by vLLM (``keyshot serve``), or a large model used as the scorer (the
  reference configuration, where the judge scores every screenshot itself).
* :class:`TransformersScorer` runs a checkpoint in-process with transformers: batched greedy
  generation with left padding. It renders exactly the messages the endpoint back-end sends
  (:func:`infer.messages.scorer_messages`) with the checkpoint's chat template, so for the same
  checkpoint (fp32, greedy) both back-ends give the same answers.

Both read the answer with :func:`infer.parsing.parse_score`. When log-probabilities are asked for,
``expected_score`` is Σ p(d)·d over the digits 1-5 among the alternatives at the position of the
score digit (probabilities renormalised over those digits): a graded score that can be thresholded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer.checkpoint import CheckpointError, read_meta, saved_pixel_bounds
from infer.client import JudgeCallError, JudgeClient
from infer.images import DEFAULT_POLICY, ImagePolicy, PreparedImage
from infer.messages import scorer_messages
from infer.parsing import ScoreResult
from infer.prompts import PromptSet
from infer.steps import Protocol, ask_score

logger = logging.getLogger(__name__)

SCORE_DIGITS = "12345"


@dataclass
class ScreenshotScore:
    """A scorer's answer for one screenshot.

    ``score`` is 1..5, or None when the answer could not be read in strict mode (0 in reference
    mode, as the reference). ``error`` is set for unreadable answers and for failed calls;
    ``call_failed`` tells the two apart (a failed call has no answer: its trajectory is incomplete).
    """

    score: int | None
    thought: str
    raw: str
    valid: bool
    error: str | None = None
    expected_score: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    cost_usd: float = 0.0
    finish_reason: str | None = None
    call_failed: bool = False

    @classmethod
    def failed(cls, error: str) -> ScreenshotScore:
        return cls(score=None, thought="", raw="", valid=False, error=error, call_failed=True)


class KeyScreenshotScorer(ABC):
    """Scores screenshots for a task and its key points.

    Args:
        prompts: the prompt set the scorer was trained on (its ``key_screenshot`` step is used).
        parse_mode: ``strict`` or ``reference`` (see :mod:`infer.parsing`).
    """

    #: what :class:`~infer.verdicts.Verdict` usage records this scorer's calls under
    role: str = "scorer"

    def __init__(self, prompts: PromptSet, *, parse_mode: str = "strict"):
        self.prompts = prompts
        self.parse_mode = parse_mode
        self.protocol = Protocol(prompts, parse_mode)

    @property
    @abstractmethod
    def name(self) -> str:
        """The model that scores (for records and summaries)."""

    @property
    def image_policy(self) -> ImagePolicy | None:
        """The image policy this scorer's model was trained with, when known."""
        return None

    @abstractmethod
    async def score(self, task: str, key_points: str, image: PreparedImage) -> ScreenshotScore:
        """Score one screenshot. A failed call is returned as an invalid score with ``error``."""

    async def score_many(
        self, task: str, key_points: str, images: Sequence[PreparedImage]
    ) -> list[ScreenshotScore]:
        """Score several screenshots of one trajectory concurrently; results in input order.

        Identical images (an agent that waited on an unchanged page) are scored once; the copies
        are marked ``cached``.
        """
        first: dict[bytes, int] = {}
        unique: list[PreparedImage] = []
        slot = []
        for img in images:
            digest = hashlib.sha256(img.jpeg).digest()
            if digest not in first:
                first[digest] = len(unique)
                unique.append(img)
            slot.append(first[digest])
        scored = await self._score_unique(task, key_points, unique)
        out, seen = [], set()
        for i in slot:
            out.append(
                scored[i] if i not in seen else dataclasses.replace(scored[i], cached=True, cost_usd=0.0)
            )
            seen.add(i)
        return out

    async def _score_unique(
        self, task: str, key_points: str, images: Sequence[PreparedImage]
    ) -> list[ScreenshotScore]:
        # Let every call finish (and reach the cache) before an error such as a spent budget
        # propagates: a call abandoned in flight would be paid again on resume.
        results = await asyncio.gather(
            *(self.score(task, key_points, img) for img in images), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)

    def read(self, text: str) -> ScoreResult:
        return self.protocol.read_score(text)

    def to_score(self, text: str, logprobs: list[dict] | None, **usage) -> ScreenshotScore:
        """One answer -> ScreenshotScore (parse, expected score from logprobs), for every back-end."""
        result = self.read(text)
        expected = None
        if self.logprobs:
            expected = expected_score_from_logprobs(
                text, logprobs, result.score, self.parse_mode, self.prompts.variant
            )
        return ScreenshotScore(
            score=result.score,
            thought=result.thought,
            raw=text,
            valid=result.valid,
            error=result.error,
            expected_score=expected,
            **usage,
        )

    async def aclose(self) -> None:  # noqa: B027 (optional hook; most scorers hold nothing)
        """Release resources (HTTP connections, models)."""


# ---------------------------------------------------------------------------- expected score
def score_digit_offset(
    text: str, score: int | None, mode: str = "strict", variant: str = "online_mind2web"
) -> int | None:
    """Character offset in ``text`` of the digit the parser read as the score, or None.

    Strict: the last digit equal to ``score`` that directly follows a ``Score`` label. Reference:
    the first 1-5 after the first ``Score`` (``### Score`` for the general variant).
    """
    if score is None or not 1 <= score <= 5:
        return None
    if mode == "reference":
        label = "### Score" if variant == "general" else "Score"
        at = text.find(label)
        if at < 0:
            return None
        end = text.find(label, at + len(label))
        m = re.search(r"[1-5]", text[at + len(label) : end if end >= 0 else None])
        return at + len(label) + m.start() if m else None
    found = None
    for label in re.finditer(r"score", text, flags=re.IGNORECASE):
        m = re.match(r"[\s*:#\[\]()\uff1a]*([1-5])(?!\d)", text[label.end() : label.end() + 24])
        if m and int(m.group(1)) == score:
            found = label.end() + m.start(1)
    return found


def expected_score_from_logprobs(
    text: str,
    logprobs: list[dict] | None,
    score: int | None,
    mode: str = "strict",
    variant: str = "online_mind2web",
) -> float | None:
    """Σ p(d)·d over the digits 1-5 offered at the score digit's position (renormalised), or None.

    ``logprobs`` is the OpenAI ``choices[0].logprobs.content`` list: per generated token its text,
    logprob and ``top_logprobs`` alternatives.
    """
    if not logprobs:
        return None
    offset = score_digit_offset(text, score, mode, variant)
    if offset is None:
        return None
    tokens = [str(item.get("token") or "") for item in logprobs]
    position = None
    if "".join(tokens) == text:
        start = 0
        for i, tok in enumerate(tokens):
            if start <= offset < start + len(tok):
                position = i
                break
            start += len(tok)
    else:  # the server's token strings do not concatenate to the text (partial UTF-8 bytes)
        digit_positions = [i for i, tok in enumerate(tokens) if tok.strip() == str(score)]
        if digit_positions:
            position = digit_positions[0] if mode == "reference" else digit_positions[-1]
    if position is None or tokens[position].strip() != str(score):
        return None  # the digit shares its token with other characters: no clean distribution
    item = logprobs[position]
    probs: dict[int, float] = {}
    for alt in [*(item.get("top_logprobs") or []), item]:
        tok = str(alt.get("token") or "").strip()
        lp = alt.get("logprob")
        if len(tok) == 1 and tok in SCORE_DIGITS and isinstance(lp, int | float) and math.isfinite(lp):
            probs[int(tok)] = max(probs.get(int(tok), 0.0), math.exp(lp))
    total = sum(probs.values())
    if total <= 0:
        return None
    return sum(d * p for d, p in probs.items()) / total


# ---------------------------------------------------------------------------- checkpoint policy
def checkpoint_image_policy(model_dir: str | Path) -> ImagePolicy:
    """The image policy a keyshot checkpoint was trained with.

    ``keyshot.json``'s ``image_policy`` when present (its pixel bounds must equal the recorded
    ``min_pixels``/``max_pixels``), else keyshot's default policy with the pixel bounds of
    ``keyshot.json`` or, for a plain model folder, of its saved image processor.
    """
    meta = read_meta(model_dir)
    if meta is not None:
        if meta.image_policy:
            try:
                policy = ImagePolicy.from_dict(dict(meta.image_policy))
            except (TypeError, ValueError) as exc:
                raise CheckpointError(
                    f"{Path(model_dir) / 'keyshot.json'}: bad image_policy ({exc})"
                ) from None
            if (policy.min_pixels, policy.max_pixels) != (meta.min_pixels, meta.max_pixels):
                raise CheckpointError(
                    f"{Path(model_dir) / 'keyshot.json'}: image_policy pixel bounds "
                    f"({policy.min_pixels}, {policy.max_pixels}) differ from min_pixels/max_pixels "
                    f"({meta.min_pixels}, {meta.max_pixels})"
                )
            return policy
        return ImagePolicy(
            min_pixels=meta.min_pixels,
            max_pixels=meta.max_pixels,
            max_aspect=DEFAULT_POLICY.max_aspect,
            jpeg_quality=DEFAULT_POLICY.jpeg_quality,
        )
    bounds = saved_pixel_bounds(model_dir)
    if bounds is None:
        raise CheckpointError(
            f"{model_dir}: no keyshot.json and no processor pixel bounds; cannot tell which images it expects"
        )
    return ImagePolicy(min_pixels=bounds[0], max_pixels=bounds[1])


# ---------------------------------------------------------------------------- endpoint back-end
class OpenAIScorer(KeyScreenshotScorer):
    """Scores through an OpenAI-compatible endpoint (vLLM serving a checkpoint, or a large model).

    Args:
        client: the endpoint's client (its cache makes a re-run pay nothing).
        prompts: the prompt set.
        parse_mode: ``strict`` or ``reference``.
        logprobs: ask for this many top alternatives per token and fill ``expected_score``.
        max_tokens: answer length limit (default: the endpoint's ``max_tokens``).
        policy: the image policy of the served checkpoint (see :func:`checkpoint_image_policy`).
        retry_invalid: ask again when an answer has no readable score (useful for sampled large
            models; a greedy checkpoint would answer the same, so it is off by default).
        role: ``scorer``, or ``judge`` when the judge model scores (the reference configuration).
    """

    def __init__(
        self,
        client: JudgeClient,
        prompts: PromptSet,
        *,
        parse_mode: str = "strict",
        logprobs: int | None = None,
        max_tokens: int | None = None,
        policy: ImagePolicy | None = None,
        retry_invalid: bool = False,
        role: str = "scorer",
    ):
        super().__init__(prompts, parse_mode=parse_mode)
        self.client = client
        self.logprobs = logprobs
        self.max_tokens = max_tokens
        self._policy = policy
        self.retry_invalid = retry_invalid
        self.role = role

    @property
    def name(self) -> str:
        return self.client.endpoint.model

    @property
    def image_policy(self) -> ImagePolicy | None:
        return self._policy

    async def score(self, task: str, key_points: str, image: PreparedImage) -> ScreenshotScore:
        try:
            completion, _ = await ask_score(
                self.client,
                self.protocol,
                task,
                key_points,
                image.data_url,
                max_tokens=self.max_tokens,
                logprobs=self.logprobs,
                ask_again=self.retry_invalid,
            )
        except JudgeCallError as exc:
            return ScreenshotScore.failed(str(exc))
        return self.to_score(
            completion.text,
            completion.logprobs,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            cached=completion.cached,
            cost_usd=completion.cost_usd,
            finish_reason=completion.finish_reason,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


# ---------------------------------------------------------------------------- in-process back-end
@dataclass
class Generation:
    """One greedy answer of :class:`TransformersScorer`."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    logprobs: list[dict] | None = None


def scorer_dtype(device: str, dtype: str = "auto") -> str:
    """The torch dtype name the in-process scorer loads in: ``auto`` is bfloat16 on CUDA (a 7B in
    fp32 would need twice the memory for no gain) and float32 elsewhere (exact parity with vLLM
    ``--dtype float32`` on CPU)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if str(device).startswith("cuda") else "float32"


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
    """

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
    ):
        super().__init__(prompts, parse_mode=parse_mode)
        import torch
        from transformers import AutoModelForImageTextToText, AutoProcessor

        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise CheckpointError(f"{model_dir}: not a model folder (no config.json)")
        policy = checkpoint_image_policy(model_dir)
        processor = AutoProcessor.from_pretrained(model_dir)
        torch_dtype = getattr(torch, scorer_dtype(device, dtype))
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch_dtype).to(device)
        self._setup(model, processor, policy, device, batch_size, max_new_tokens, logprobs, model_dir)

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

        from infer.rendering import ScorerRenderer
        from infer.vision_attention import use_batched_window_attention

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
        use_batched_window_attention(self.model)  # without flash-attn: windows in batched SDPA calls
        self.model.eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else self.processor.tokenizer.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos])
        self._pad = (
            gen.pad_token_id if gen.pad_token_id is not None else self.processor.tokenizer.pad_token_id
        )
        self._lock = threading.Lock()  # one generate at a time, whatever the event loop does

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
        inputs = self.encode(task, key_points, images).to(self.device)
        prompt_lengths = inputs["attention_mask"].sum(dim=1).tolist()
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
