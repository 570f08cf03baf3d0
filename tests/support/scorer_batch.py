"""A collated training batch of the tiny scorer: two rendered rows with screenshots of two sizes, right-padded
as the recipe's collator pads them (the answer is the only labelled span of each row)."""

from __future__ import annotations

import random
from pathlib import Path

from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for
from keyshot.infer.protocol.messages import scorer_answer, scorer_example
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.scorer_data import screenshot
from keyshot.train.batches import ScorerCollator


def scorer_batch(model_dir: Path) -> dict:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=2048)
    prompts = load_prompt_set("online_mind2web")
    rng = random.Random(0)
    rows = [
        (
            scorer_example(prompts, "book a flight", "\n1. a", scorer_answer("the form is sent", 4)),
            (320, 240),
        ),
        (
            scorer_example(
                prompts, "a longer task " * 6, "\n1. a\n2. b", scorer_answer("nothing happened", 1)
            ),
            (640, 360),
        ),
    ]
    examples = [renderer.render(row, screenshot(3, size, rng)) for row, size in rows]
    return ScorerCollator(pad_token_id=processor.tokenizer.pad_token_id, pad_to_multiple_of=8)(examples)
