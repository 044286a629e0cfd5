"""Pictures in and out of tools: the project's Image (PNG bytes) and a PIL picture.

A tool that shows the model a picture returns an `Image` (or a ToolResult with `images`);
`png` and `picture` are the way between that and PIL, which draws, crops and resizes.
`picture_tools` are the image tools of the literature on thinking with images (zoom into
a region, rotate, draw a box or a point), bound to one picture.
"""

from __future__ import annotations

import io

from PIL import Image as PILImage
from PIL import ImageDraw

from toolpolicy.tools.decorator import ToolError, tool
from toolpolicy.tools.toolset import ToolSet
from toolpolicy.types import Image


def png(picture: PILImage.Image) -> Image:
    """A PIL picture as an Image (PNG bytes)."""
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return Image(buffer.getvalue(), picture.width, picture.height)


def picture(image: Image) -> PILImage.Image:
    """An Image as a PIL picture (RGB)."""
    return PILImage.open(io.BytesIO(image.png)).convert("RGB")


def picture_tools(source: PILImage.Image, view: int) -> ToolSet:
    """Tools over one picture `source`, each returning a `view` x `view` picture.

    zoom        a region at full resolution, scaled to the view (looking closer)
    rotate      the whole picture turned by a multiple of 90 degrees, scaled to the view
    draw_box    the whole picture with a rectangle drawn on it, scaled to the view
    draw_point  the whole picture with a point marked, scaled to the view

    Coordinates are the full picture's pixels, (0, 0) its top-left corner. A region or
    point outside the picture is the model's error (ToolError); a policy can refuse it
    before it runs (rule on args and state.image_width / image_height).
    """
    width, height = source.size

    def inside(x: int, y: int, w: int = 1, h: int = 1) -> None:
        if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > width or y + h > height:
            raise ToolError(f"the region x={x}, y={y}, width={w}, height={h} is not inside the {width}x{height} picture")

    def shown(picture: PILImage.Image) -> Image:
        return png(picture.resize((view, view), PILImage.BILINEAR))

    @tool
    def zoom(x: int, y: int, width: int, height: int) -> Image:
        """Look closer: a region of the picture at full resolution.

        Args:
            x: left edge of the region, in the picture's pixels.
            y: top edge of the region.
            width: width of the region.
            height: height of the region.
        """
        inside(x, y, width, height)
        return shown(source.crop((x, y, x + width, y + height)))

    @tool
    def rotate(degrees: int) -> Image:
        """The whole picture turned counter-clockwise.

        Args:
            degrees: 90, 180 or 270.
        """
        if degrees not in (90, 180, 270):
            raise ToolError(f"degrees must be 90, 180 or 270, not {degrees}")
        return shown(source.rotate(degrees, expand=True))

    @tool
    def draw_box(x: int, y: int, width: int, height: int) -> Image:
        """The whole picture with a rectangle drawn on it, to mark a region.

        Args:
            x: left edge of the rectangle, in the picture's pixels.
            y: top edge of the rectangle.
            width: width of the rectangle.
            height: height of the rectangle.
        """
        inside(x, y, width, height)
        marked = source.copy()
        ImageDraw.Draw(marked).rectangle((x, y, x + width - 1, y + height - 1), outline=(0, 0, 255), width=max(1, width // 32))
        return shown(marked)

    @tool
    def draw_point(x: int, y: int) -> Image:
        """The whole picture with a point marked on it.

        Args:
            x: the point's column, in the picture's pixels.
            y: the point's row.
        """
        inside(x, y)
        marked = source.copy()
        radius = max(2, min(width, height) // 64)
        ImageDraw.Draw(marked).ellipse((x - radius, y - radius, x + radius, y + radius), fill=(0, 0, 255))
        return shown(marked)

    return ToolSet([zoom, rotate, draw_box, draw_point])
