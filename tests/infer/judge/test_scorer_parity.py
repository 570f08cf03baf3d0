"""The two scorer back-ends agree: in-process transformers and the real vLLM server (fp32, greedy).

Also DESIGN contract 1: the processor tokenises a scorer request to as many tokens as vLLM counts.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from PIL import Image

from keyshot.infer.client.judge_client import JudgeClient
from keyshot.infer.judge.local_scorer import TransformersScorer
from keyshot.infer.judge.scorers import OpenAIScorer, checkpoint_image_policy
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.model.tiny_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from keyshot.infer.protocol.images import PreparedImage, prepare_image
from keyshot.infer.protocol.messages import scorer_messages
from keyshot.infer.protocol.prompts import load_prompt_set
from tests.support import paths

FIXTURES = paths.FIXTURES
TASK = "Search the knowledge base for the article about VPN access"
KEY_POINTS = "\n1. Open the knowledge base\n2. Search for VPN access"
MAX_TOKENS = 24


def screenshots(policy) -> list[PreparedImage]:
    """Real AgentLab screenshots plus a tall page and a tiny one (different visual token counts)."""
    trajectory = next(iter(load_trajectories(FIXTURES / "trajectories" / "agentlab")))
    images = [s.prepare(policy) for s in trajectory.screenshots[:3]]
    rng = np.random.default_rng(0)
    tall = Image.fromarray(rng.integers(0, 255, (2600, 700, 3), dtype=np.uint8))
    small = Image.fromarray(rng.integers(0, 255, (90, 160, 3), dtype=np.uint8))
    images += [prepare_image(tall, policy), prepare_image(small, policy)]
    assert len({img.visual_tokens for img in images}) >= 3  # padding happens inside a batch
    return images


@pytest.fixture(scope="module")
def transformers_scorer(scorer_checkpoint):
    return TransformersScorer(
        scorer_checkpoint, load_prompt_set(), dtype="float32", batch_size=3, max_new_tokens=MAX_TOKENS
    )


def test_checkpoint_policy_is_the_training_bounds(scorer_checkpoint):
    policy = checkpoint_image_policy(scorer_checkpoint)
    assert (policy.min_pixels, policy.max_pixels) == (TINY_MIN_PIXELS, TINY_MAX_PIXELS)


def test_transformers_renders_the_shared_messages(transformers_scorer):
    text = transformers_scorer.render(TASK, KEY_POINTS)
    prompts = load_prompt_set()
    user = prompts.user("key_screenshot").format(task=TASK, key_points=KEY_POINTS)
    assert text.startswith("<|im_start|>system\n" + prompts.system("key_screenshot") + "<|im_end|>\n")
    assert (user + "<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n") in text
    messages = scorer_messages(prompts, TASK, KEY_POINTS, image_url=None)
    assert text == transformers_scorer.processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_transformers_batching_does_not_change_answers(transformers_scorer):
    images = screenshots(transformers_scorer.image_policy)
    batched = transformers_scorer.generate(TASK, KEY_POINTS, images)  # batches of 3, left-padded
    single = [transformers_scorer.generate(TASK, KEY_POINTS, [img])[0] for img in images]
    assert [g.text for g in batched] == [g.text for g in single]
    assert [g.prompt_tokens for g in batched] == [g.prompt_tokens for g in single]
    assert all(g.completion_tokens <= MAX_TOKENS for g in batched)


@pytest.mark.slow
def test_vllm_and_transformers_give_the_same_answers(vllm_server, transformers_scorer):
    prompts = load_prompt_set()
    policy = transformers_scorer.image_policy
    images = screenshots(policy)
    served = OpenAIScorer(
        JudgeClient(vllm_server.endpoint(max_tokens=MAX_TOKENS, max_concurrency=4)), prompts, policy=policy
    )

    async def go():
        try:
            return await served.score_many(TASK, KEY_POINTS, images)
        finally:
            await served.aclose()

    remote = asyncio.run(go())
    local = asyncio.run(transformers_scorer.score_many(TASK, KEY_POINTS, images))
    assert all(r.error is None or "score" in r.error for r in remote)  # answered (the tiny model's noise)
    assert [r.raw for r in remote] == [loc.raw for loc in local]
    assert [(r.score, r.valid, r.thought) for r in remote] == [
        (loc.score, loc.valid, loc.thought) for loc in local
    ]
    assert [r.completion_tokens for r in remote] == [loc.completion_tokens for loc in local]
    # DESIGN contract 1: train (processor) and serve (vLLM) tokenise a request to the same length.
    assert [r.prompt_tokens for r in remote] == [
        transformers_scorer.prompt_tokens(TASK, KEY_POINTS, i) for i in images
    ]
    assert [r.prompt_tokens for r in remote] == [loc.prompt_tokens for loc in local]
