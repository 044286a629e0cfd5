"""The embedded VLM's reading warm-up: its vision tower learns what is where before SFT.

A vision tower trained from scratch through the language model's answers alone learns
slowly: a 3-digit answer gives three labels for a whole picture, and the tower first has to
find where the digits are (600 SFT steps of configs/zoom.yaml left the embedded VLM blind:
0% on easy codes). The warm-up gives one label a patch instead, much as LLaVA's first stage
aligns its projector on captions before instruction tuning: an environment's
`reading_pictures` (types.Reading) name what lies where (a digit and its place in a code, a
marked square); each patch takes the label of the region over its centre (the last listed
wins; the patch under a region's own centre is always that region's, so a thin region is
never lost) or none; and a linear probe over the features the language model receives (the
tower, then the projector) learns those labels by cross-entropy. A second probe on every
patch learns the picture's `text` (what it reads as a whole), one character a place: so the
tower gathers the reading into each patch, and the language model finds it wherever it
looks, not only at the patches where the characters are (a 4-layer embedded language model
learned to name a code centred in a crop from the place labels alone, but not one drawn
anywhere in the view). The probes are dropped; the tower and projector keep what they
learned, and SFT then only has to teach the language model to look it up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from toolpolicy.model.vision import VisionInput
from toolpolicy.types import Image, Reading

NOTHING = 0
"""The label of a patch no region covers; region labels are 1, 2, ... in `label_names` order."""
UNREAD = -100
"""A text place a picture does not have (its text is shorter, or it has none): no loss there."""
BATCH_SIZE, LR = 32, 1e-3
HELD_OUT = 0.05
"""Fraction of the pictures kept out of training to score the warm-up."""


@dataclass(frozen=True)
class ReadingScore:
    """How well the warmed-up tower reads its held-out pictures."""

    steps: int
    pictures: int
    labels: int
    patch_accuracy: float
    """Held-out patches under a region whose label the probe gets right."""
    text_accuracy: float
    """Held-out pictures with a text whose every character the text probe gets right, from the
    mean of its patches' guesses (nan when none has a text)."""
    seconds: float


def label_names(readings: Sequence[Reading]) -> list[str]:
    """Every region label of `readings`, sorted (label i + 1 is names[i]).

    >>> from toolpolicy.types import Image
    >>> blank = Image(b"", 4, 4)
    >>> label_names([Reading(blank, (("b", (0, 0, 1, 1)),)), Reading(blank, (("a", (0, 0, 1, 1)),))])
    ['a', 'b']
    """
    return sorted({label for reading in readings for label, _ in reading.regions})


def patch_labels(reading: Reading, names: dict[str, int], grid: int) -> list[int]:
    """The label of each of the `grid` x `grid` patches of `reading`'s picture, row by row.

    A patch takes the label of the last region whose box holds its centre, and the patch
    under a region's centre always takes that region's label.

    >>> from toolpolicy.types import Image
    >>> thin = Reading(Image(b"", 4, 4), (("wide", (0, 0, 4, 2)), ("dot", (2.6, 0.1, 2.9, 0.4))))
    >>> patch_labels(thin, {"wide": 1, "dot": 2}, 2)
    [1, 2, 0, 0]
    """
    width, height = reading.image.width / grid, reading.image.height / grid
    labels = [NOTHING] * (grid * grid)
    for label, (left, top, right, bottom) in reading.regions:
        for row in range(grid):
            for col in range(grid):
                x, y = (col + 0.5) * width, (row + 0.5) * height
                if left <= x < right and top <= y < bottom:
                    labels[row * grid + col] = names[label]
        centre_col = min(int((left + right) / 2 / width), grid - 1)
        centre_row = min(int((top + bottom) / 2 / height), grid - 1)
        labels[centre_row * grid + centre_col] = names[label]
    return labels


def text_labels(reading: Reading, characters: dict[str, int], places: int) -> list[int]:
    """`reading.text` as one character index a place, UNREAD past its end.

    >>> from toolpolicy.types import Image
    >>> text_labels(Reading(Image(b"", 4, 4), (), "ba"), {"a": 0, "b": 1}, 3)
    [1, 0, -100]
    """
    return [characters[c] for c in reading.text] + [UNREAD] * (places - len(reading.text))


def warm_up_reading(model: torch.nn.Module, readings: Sequence[Reading], steps: int, seed: int) -> ReadingScore:
    """Train `model`'s vision tower and projector (a LlavaForConditionalGeneration) to tell
    `readings`' labels apart patch by patch for `steps` steps (see the module docstring)."""
    started = time.perf_counter()
    config = model.config
    vision = VisionInput.of(config)
    grid = vision.image_size // vision.patch
    names = {name: i + 1 for i, name in enumerate(label_names(readings))}
    characters = {c: i for i, c in enumerate(sorted({c for reading in readings for c in reading.text}))}
    places = max((len(reading.text) for reading in readings), default=0)
    trained_on = len(readings) - max(1, int(len(readings) * HELD_OUT))  # the rest is held out
    if trained_on < 1 or not names:
        raise ValueError(f"the reading warm-up needs labelled pictures to train on; got {len(readings)} picture(s) with {len(names)} label(s)")
    pictures = [reading.image for reading in readings]
    labels = torch.tensor([patch_labels(reading, names, grid) for reading in readings])  # [R, grid^2]
    wanted = torch.tensor([text_labels(reading, characters, places) for reading in readings]).view(len(readings), places)  # [R, places]
    probes = Probes(config.text_config.hidden_size, len(names) + 1, places, max(len(characters), 1))
    trained = [*model.model.vision_tower.parameters(), *model.model.multi_modal_projector.parameters(), *probes.parameters()]
    optimizer = torch.optim.AdamW(trained, lr=LR)
    rng = random.Random(f"reading/{seed}")
    torch.manual_seed(seed)
    model.train()
    bar = tqdm(range(steps), desc="reading warm-up")
    for _ in bar:
        rows = rng.sample(range(trained_on), min(BATCH_SIZE, trained_on))
        patches, texts = probes(_features(model, vision, [pictures[i] for i in rows]))
        loss = reading_loss(patches, texts, labels[rows], wanted[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    model.eval()
    with torch.no_grad():
        patch_accuracy, text_accuracy = _held_out(model, probes, vision, pictures[trained_on:], labels[trained_on:], wanted[trained_on:])
    for parameter in model.parameters():
        parameter.grad = None
    return ReadingScore(steps, len(readings), len(names), patch_accuracy, text_accuracy, time.perf_counter() - started)


def reading_loss(patches: torch.Tensor, texts: torch.Tensor, labels: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each patch's label plus, where the picture has a text, of its text read
    from every patch.

    patches [B, N, labels]  texts [B, N, places, characters]  labels [B, N]  wanted [B, places] (UNREAD where none)
    """
    loss = torch.nn.functional.cross_entropy(patches.flatten(0, 1), labels.flatten())
    if (wanted != UNREAD).any():
        every_patch = wanted[:, None].expand(-1, texts.shape[1], -1)  # [B, N, places]
        loss = loss + torch.nn.functional.cross_entropy(texts.flatten(0, 2), every_patch.flatten(), ignore_index=UNREAD)
    return loss


def _held_out(
    model: torch.nn.Module, probes: Probes, vision: VisionInput, pictures: Sequence[Image], labels: torch.Tensor, wanted: torch.Tensor
) -> tuple[float, float]:
    """ReadingScore's patch_accuracy and text_accuracy on `pictures`, whose patch labels are
    `labels` [R, N] and texts `wanted` [R, places]."""
    right = covered = read = with_text = 0
    for start in range(0, len(pictures), BATCH_SIZE):
        rows = slice(start, start + BATCH_SIZE)
        patches, texts = probes(_features(model, vision, pictures[rows]))
        shown, meant = labels[rows], wanted[rows]  # [B, N], [B, places]
        right += int((patches.argmax(-1) == shown)[shown != NOTHING].sum())
        covered += int((shown != NOTHING).sum())
        legible = (meant != UNREAD).any(-1)  # [B]
        guessed = texts.mean(1).argmax(-1)  # [B, places]
        read += int(((guessed == meant) | (meant == UNREAD)).all(-1)[legible].sum())
        with_text += int(legible.sum())
    return right / max(covered, 1), (read / with_text if with_text else float("nan"))


class Probes(torch.nn.Module):
    """The warm-up's linear probes over each patch's features: its label, and the picture's text."""

    def __init__(self, width: int, labels: int, places: int, characters: int) -> None:
        super().__init__()
        self.places, self.characters = places, characters
        self.label = torch.nn.Linear(width, labels)
        self.text = torch.nn.Linear(width, places * characters)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features [B, N, width] -> label logits [B, N, labels], text logits [B, N, places, characters]"""
        return self.label(features), self.text(features).unflatten(-1, (self.places, self.characters))


def _features(model: torch.nn.Module, vision: VisionInput, pictures: Sequence[Image]) -> torch.Tensor:
    """What the language model receives for each patch of `pictures`.   -> [B, grid^2, width]"""
    config = model.config
    features = model.get_image_features(
        pixel_values=vision.pixels(pictures),
        vision_feature_layer=config.vision_feature_layer, vision_feature_select_strategy=config.vision_feature_select_strategy,
    ).pooler_output  # fmt: skip
    return torch.stack(list(features))
