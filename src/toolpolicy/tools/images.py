"""Pictures in and out of tools: the project's Image (PNG bytes) and a PIL picture.

A tool that shows the model a picture returns an `Image` (or a ToolResult with `images`);
these two functions are the way between that and PIL, which draws, crops and resizes.
"""

from __future__ import annotations

import io

from PIL import Image as PILImage

from toolpolicy.types import Image


def png(picture: PILImage.Image) -> Image:
    """A PIL picture as an Image (PNG bytes)."""
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return Image(buffer.getvalue(), picture.width, picture.height)


def picture(image: Image) -> PILImage.Image:
    """An Image as a PIL picture (RGB)."""
    return PILImage.open(io.BytesIO(image.png)).convert("RGB")
