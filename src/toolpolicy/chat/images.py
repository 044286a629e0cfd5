"""How a model's text stands for a picture: a span of vision tokens the encoder's features fill.

A vision-language model reads an image as a run of placeholder tokens in its text, one per
feature its vision encoder makes of the image, framed by a start and an end token; the
model puts the encoder's features in place of the placeholders' embeddings. The spelling
is Qwen2-VL's (`<|vision_start|>`, `<|image_pad|>`, `<|vision_end|>`), which the embedded
vision model shares. How many pads an image takes is the model's (its processor's resize
and patch size), so the span is given by the model, not by the chat format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from toolpolicy.types import Image, Message

VISION_START = "<|vision_start|>"
IMAGE_PAD = "<|image_pad|>"
VISION_END = "<|vision_end|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD)
"""In Qwen2-VL's id order (151652, 151653, 151655)."""


@dataclass(frozen=True)
class ImageSpan:
    """The text of a picture for one model: VISION_START, `pads(image)` IMAGE_PADs, VISION_END."""

    pads: Callable[[Image], int]

    def text(self, image: Image) -> str:
        """>>> ImageSpan(lambda image: 2).text(Image(b"", 8, 8))
        '<|vision_start|><|image_pad|><|image_pad|><|vision_end|>'
        """
        return VISION_START + IMAGE_PAD * self.pads(image) + VISION_END


class ImagesUnreadable(ValueError):
    """A message with pictures, rendered for a model that reads no pictures."""


def image_text(span: ImageSpan | None, message: Message) -> str:
    """The spans of `message`'s pictures, in order ("" without pictures); an error naming the
    message when the model reads none (never a silent drop)."""
    if not message.images:
        return ""
    if span is None:
        raise ImagesUnreadable(
            f"a {message.role} message{f' from {message.name}' if message.name else ''} carries {len(message.images)} "
            "image(s), but the model has no vision encoder: use a vision-language model (for the embedded model, set "
            "embedded.image_size), or make the tool return text"
        )
    return "".join(span.text(image) for image in message.images)


def image_runs(ids: Sequence[int], pad_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of `pad_id` in `ids`: where each picture's features go, in order.

    >>> image_runs([5, 9, 9, 6, 9, 7], pad_id=9)
    [(1, 3), (4, 5)]
    """
    runs: list[tuple[int, int]] = []
    for position, token in enumerate(ids):
        if token != pad_id:
            continue
        if runs and runs[-1][1] == position:
            runs[-1] = (runs[-1][0], position + 1)
        else:
            runs.append((position, position + 1))
    return runs
