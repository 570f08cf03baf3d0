"""Reading a chat request as the fake server gets it: its messages' text and images, the WebJudge step
its system prompt is, the screenshots it carries and a deterministic count of its prompt tokens."""

from __future__ import annotations

from PIL import Image

from keyshot.infer.loaders.common import data_url_bytes
from keyshot.infer.protocol import images
from keyshot.infer.protocol.decode import to_rgb
from keyshot.infer.protocol.prompts import PROMPT_SETS, STEPS, load_prompt_set


class ResponderError(ValueError):
    """A request the responder cannot answer (answered with HTTP 400, so tests fail loudly)."""


def _content_parts(content: object) -> tuple[str, list[str]]:
    """(joined text, image URLs) of one message's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content, []
    texts: list[str] = []
    images: list[str] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            images.append(url.get("url", "") if isinstance(url, dict) else str(url))
    return "\n".join(texts), images


def system_text(request: dict) -> str:
    for msg in request.get("messages", []):
        if msg.get("role") == "system":
            return _content_parts(msg.get("content"))[0]
    return ""


def user_parts(request: dict) -> tuple[str, list[str]]:
    """Text and image URLs of the last user message."""
    for msg in reversed(request.get("messages", [])):
        if msg.get("role") == "user":
            return _content_parts(msg.get("content"))
    return "", []


def identify_step(request: dict) -> str:
    """The WebJudge step ("key_points", "key_screenshot", "outcome") whose system prompt this is."""
    system = system_text(request)
    for variant in PROMPT_SETS.names():
        prompts = load_prompt_set(variant)
        for step in STEPS:
            if system == prompts.system(step):
                return step
    raise ResponderError(f"system prompt is not a WebJudge prompt (starts {system[:60]!r})")


def decode_data_url(url: str) -> bytes:
    """The image bytes of a request's image URL, read as keyshot reads a data URL
    (:func:`~keyshot.infer.loaders.common.data_url_bytes`)."""
    data = data_url_bytes(url)
    if data is None:
        raise ResponderError(f"image is not a base64 data URL (starts {url[:40]!r})")
    return data


def decode_image(url: str) -> Image.Image:
    """The request's image as RGB pixels, decoded as keyshot decodes a screenshot (header first, within
    the pixel budget: :func:`~keyshot.infer.protocol.images.decode_image`)."""
    return to_rgb(images.decode_image(decode_data_url(url)))


def count_prompt_tokens(request: dict) -> int:
    """Deterministic stand-in for a tokenizer: len(text)//4 per message, 1000 per image."""
    total = 0
    for msg in request.get("messages", []):
        text, images = _content_parts(msg.get("content"))
        total += len(text) // 4 + 1000 * len(images)
    return max(total, 1)
