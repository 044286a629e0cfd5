"""Qwen2.5-VL's pictures: placeholders per picture, the patches its forward takes, 3-D positions.

Qwen2.5-VL reads a picture at close to its own size. Its processor resizes the picture so each
side is a multiple of patch x merge (14 x 2 = 28 pixels) and its area lies within the
processor's [min_pixels, max_pixels] (`smart_resize`), and cuts it into a grid of (t, h, w)
patches of 14 x 14 pixels (t = 1 for a picture: its one frame fills the 2-frame temporal
patch). The vision tower merges each 2 x 2 block of patch features into one feature, so the
picture takes t*h*w / 4 `<|image_pad|>` placeholders: a 56 x 56 picture 4, a 112 x 56 one 8.
The forward takes every picture's patches flattened into one tensor with each picture's grid
beside it (`QwenPixels`).

Positions are not one per token (multimodal RoPE, M-RoPE): each token has a (temporal,
height, width) triple. A text token has the same number thrice, one more than the token
before; a picture's placeholders are laid out on its merged grid from the position where the
picture starts, and the text after it goes on from that start plus the grid's longer side
(`mrope_positions`). A row's positions so depend on its pictures' grids, and the position of
the token after a row, which a KV cache's next token takes, is in general not the row's length.

`QwenVision` is the counterpart of `vision.VisionInput` (LLaVA's) for a `qwen2_5_vl` model. It
is not yet in `vision.VISION_MODEL_TYPES`: the sampler and the trainer pass pictures as one
[n, 3, S, S] tensor and positions as one per token, which this model does not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers import BaseImageProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from toolpolicy.chat.images import ImageSpan
from toolpolicy.tools.images import picture
from toolpolicy.types import Image

Grid = tuple[int, int, int]
"""A picture's (temporal, height, width) patches, as the processor's image_grid_thw row."""


class QwenPixels(NamedTuple):
    """Pictures as Qwen2.5-VL's forward takes them (`model(**pixels._asdict(), ...)`).

    pixel_values:   [P, 3*t*p*p]  every picture's patches in order, P = sum of t*h*w
                                  (t the temporal patch, 2; p the patch side, 14)
    image_grid_thw: [n, 3]        each picture's (t, h, w) patches, in order
    """

    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor


@dataclass(frozen=True)
class QwenVision:
    """A Qwen2.5-VL model's pictures: its image processor's grids, placeholders and patches."""

    processor: BaseImageProcessor
    """The model's image processor (a Qwen2VLImageProcessor): resize bounds, patch and merge sizes."""
    pad_id: int
    """The id of IMAGE_PAD in the model's vocabulary (config.image_token_id)."""

    @property
    def merge(self) -> int:
        """Side of the block of patches the vision tower merges into one placeholder's feature."""
        return int(self.processor.merge_size)

    def grid(self, image: Image) -> Grid:
        """The (t, h, w) patches the processor cuts `image` into, from its size alone."""
        patch = int(self.processor.patch_size)
        height, width = smart_resize(
            image.height, image.width, factor=patch * self.merge,
            min_pixels=self.processor.size["shortest_edge"], max_pixels=self.processor.size["longest_edge"],
        )
        return 1, height // patch, width // patch

    def pads(self, image: Image) -> int:
        """Placeholders `image` takes: its grid's patches over the merged block."""
        t, h, w = self.grid(image)
        return t * h * w // self.merge**2

    @property
    def span(self) -> ImageSpan:
        """The chat template's spelling of a picture for this model."""
        return ImageSpan(self.pads)

    def pixels(self, images: Sequence[Image]) -> QwenPixels:
        """The pictures' patches and grids, as the processor makes them."""
        if not images:
            width = 3 * int(self.processor.temporal_patch_size) * int(self.processor.patch_size) ** 2
            return QwenPixels(torch.zeros(0, width), torch.zeros(0, 3, dtype=torch.long))
        out = self.processor(images=[picture(image) for image in images], return_tensors="pt")
        return QwenPixels(out["pixel_values"], out["image_grid_thw"])

    def positions(self, ids: Sequence[int], images: Sequence[Image], start: int = 0) -> tuple[torch.Tensor, int]:
        """`mrope_positions` of `ids`, whose pictures are `images` in order."""
        return mrope_positions(ids, [self.grid(image) for image in images], self.pad_id, self.merge, start)


def mrope_positions(ids: Sequence[int], grids: Sequence[Grid], pad_id: int, merge: int = 2, start: int = 0) -> tuple[torch.Tensor, int]:
    """Qwen2.5-VL's (temporal, height, width) positions of one row of token ids, and the
    position of the token after it (a KV cache's next token takes it).

    ids:    [L] one row without padding; its pictures are runs of `pad_id`, the k-th picture
            the next t*h*w / merge^2 of them for (t, h, w) = grids[k]
    grids:  each picture's patches (the processor's image_grid_thw), in order
    start:  the position of ids[0]: 0 for a whole row, the position after the cached
            tokens for a fragment that continues them
    ->      positions [3, L] (long) and the position after the row

    A text token's three are its text position; a picture's placeholders sit on its merged
    (t, h/merge, w/merge) grid, offset by the position where it starts; the text after it
    continues from that start plus max(h, w) / merge. Equal to `get_rope_index` of the
    model (positions and, as the position after the row, L plus its rope delta).

    >>> positions, after = mrope_positions([7, 9, 9, 9, 9, 8], [(1, 4, 4)], pad_id=9)
    >>> positions.tolist()
    [[0, 1, 1, 1, 1, 3], [0, 1, 1, 2, 2, 3], [0, 1, 2, 1, 2, 3]]
    >>> after
    4
    """
    pieces: list[torch.Tensor] = []
    pictures = iter(grids)
    position, index = start, 0
    while index < len(ids):
        if ids[index] != pad_id:  # a run of text, up to the next placeholder
            end = next((i for i in range(index, len(ids)) if ids[i] == pad_id), len(ids))
            pieces.append(torch.arange(position, position + end - index).expand(3, -1))  # [3, end - index]
            position, index = position + end - index, end
            continue
        grid = next(pictures, None)
        if grid is None:
            raise ValueError(f"the row has more runs of placeholder {pad_id} than the {len(grids)} picture grid(s) given")
        t, h, w = grid[0], grid[1] // merge, grid[2] // merge
        if index + t * h * w > len(ids) or any(token != pad_id for token in ids[index : index + t * h * w]):
            raise ValueError(f"a picture of grid {tuple(grid)} takes {t * h * w} placeholders, but its run at {index} is shorter")
        cells = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        pieces.append(torch.stack(cells).reshape(3, -1) + position)  # [3, t*h*w]
        position, index = position + max(h, w), index + t * h * w
    if next(pictures, None) is not None:
        raise ValueError(f"{len(grids)} picture grid(s) given, but the row has fewer runs of placeholder {pad_id}")
    return (torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)), position
