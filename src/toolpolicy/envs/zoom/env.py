"""`zoom`: read a 3-digit code in a picture; look closer only where it is drawn too small.

Each task is a PICTURE x PICTURE picture with clutter (outlined boxes) and a code. The model
first sees it scaled down to VIEW x VIEW pixels:

- easy: the code is drawn large (FONT_LARGE pixels high, a quarter of that in the view):
  readable at once, and a zoom is needless;
- hard: the code is drawn small (FONT_SMALL pixels, under 4 in the view) in a pink square,
  one cell of a GRID x GRID grid; in the view the square shows but the digits do not, and
  `zoom` on the cell returns it at full resolution (a CELL-pixel region scaled to the view,
  so 1:1), where they read like an easy code.

The tools are `picture_tools` (tools/images.py) over the task's picture: zoom by default
(`tools` lists others: rotate, draw_box, draw_point). The policy (policy.yaml) refuses a
region outside the picture and a third zoom. Scoring inputs in `task.info`: the code, the
difficulty, `evidence` (the code's bounding box, in the picture's pixels), `min_tool_calls`
(1 on hard tasks, 0 on easy: every zoom on an easy task is needless). Rewards
(rewards/regions.py): a zoom is faithful when its region holds the whole evidence box.

`reading_pictures` are what the embedded VLM's vision tower learns to read before SFT
(model/reading.py): views and zoomed cells, each digit of a code labelled with its place in
the code, the pink square labelled as a mark (in a first view, with the x and y a zoom on
its cell names), and the code as the text of each picture where it is legible.

`expert_turns` is the imperfect demonstrator for the SFT cold start: on hard tasks it
zooms on the right cell only some of the time (on a wrong one, or not at all, otherwise,
and then guesses), and it zooms needlessly on some easy tasks. RL has to repair both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image as PILImage
from PIL import ImageDraw, ImageFont

from toolpolicy.envs.base import Env, Probability, Session
from toolpolicy.tools.images import picture_tools, png
from toolpolicy.tools.toolset import ToolSet
from toolpolicy.types import Message, Reading, Task, ToolCall

POLICY_FILE = Path(__file__).with_name("policy.yaml")
PICTURE, GRID, VIEW = 256, 4, 64
CELL = PICTURE // GRID
FONT_LARGE, FONT_SMALL = 56, 15
SYSTEM_PROMPT = (
    f"Read the 3-digit code in the picture ({PICTURE}x{PICTURE} pixels, shown small). If it is too small to read, "
    f"zoom into the pink square (x, y, width, height in pixels). Finish with: Answer: <code>"
)


@dataclass(frozen=True)
class ExpertStyle:
    """How often the demonstrator does what, per task."""

    zoom_on_hard: float = 0.5
    """Probability of zooming on a hard task (otherwise it guesses the code)."""
    right_cell: float = 0.8
    """Probability that a zoom on a hard task is on the pink square (else on another cell, then a guess)."""
    zoom_on_easy: float = 0.3
    """Probability of a needless zoom on an easy task (on a random cell; it answers right anyway)."""


def draw_task(info: dict[str, Any]) -> PILImage.Image:
    """The task's full picture, the same every time for the same `info` (its seed, code, cell)."""
    rng = random.Random(f"zoom/{info['seed']}")
    picture = PILImage.new("RGB", (PICTURE, PICTURE), (236, 236, 236))
    draw = ImageDraw.Draw(picture)
    for _ in range(6):  # clutter: outlined boxes in greys, blues and greens
        x, y = rng.randrange(PICTURE - 40), rng.randrange(PICTURE - 40)
        colour = rng.choice([(150, 150, 150), (90, 120, 200), (80, 160, 110)])
        draw.rectangle((x, y, x + rng.randint(20, 60), y + rng.randint(20, 60)), outline=colour, width=2)
    code = info["code"]
    if info["difficulty"] == "hard":
        row, col = info["cell"]
        draw.rectangle((col * CELL + 2, row * CELL + 2, (col + 1) * CELL - 3, (row + 1) * CELL - 3), fill=(255, 190, 200), outline=(220, 40, 60), width=3)
    x, y = info["at"]
    draw.text((x, y), code, fill=(0, 0, 0), font=_font(info["difficulty"]))
    return picture


def _font(difficulty: str) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=FONT_SMALL if difficulty == "hard" else FONT_LARGE)


def _placed(difficulty: str, code: str, rng: random.Random) -> dict[str, Any]:
    """Where the code goes (its top-left `at`, the hard task's `cell`) and its bounding box."""
    probe = ImageDraw.Draw(PILImage.new("RGB", (1, 1)))
    left, top, right, bottom = probe.textbbox((0, 0), code, font=_font(difficulty))
    width, height = right - left, bottom - top
    if difficulty == "hard":
        row, col = rng.randrange(GRID), rng.randrange(GRID)
        x, y = col * CELL + (CELL - width) // 2 - left, row * CELL + (CELL - height) // 2 - top
        cell: list[int] | None = [row, col]
    else:
        x, y = rng.randint(8, PICTURE - 8 - width) - left, rng.randint(8, PICTURE - 8 - height) - top
        cell = None
    return {"at": [x, y], "cell": cell, "evidence": [x + left, y + top, x + right, y + bottom]}


@dataclass(frozen=True)
class ZoomOptions:
    """zoom's options (env.OPTION in a config)."""

    hard_fraction: float = 0.5
    """The share of tasks whose code is drawn too small to read without a zoom."""
    tools: tuple[str, ...] = ("zoom",)
    """The picture tools the model is given (`picture_tools`: zoom, rotate, draw_box, draw_point)."""


class ZoomEnv(Env):
    """Codes in pictures, small or large; see the module docstring."""

    name = "zoom"
    system_prompt = SYSTEM_PROMPT
    policy_file = POLICY_FILE
    success_reward = "correct_answer"
    default_rewards = {
        "correct_answer": 1.0,
        "excess_tool_calls": -0.3,
        "faithful_zoom": 0.1,
        "unfaithful_zooms": -0.1,
        "invalid_call_count": -0.2,
        "tool_call_count": 0.0,
        "ignored_crop": 0.0,
    }

    def __init__(self, options: ZoomOptions = ZoomOptions()) -> None:
        blank = PILImage.new("RGB", (PICTURE, PICTURE))
        known = picture_tools(blank, VIEW).names
        unknown = sorted(set(options.tools) - set(known))
        if unknown:
            raise ValueError(f"zoom env: unknown tool(s) {unknown}; it has {list(known)}")
        self.hard_fraction = options.hard_fraction
        self.listed = tuple(options.tools)
        self.tools = listed_tools(blank, self.listed)  # the specs the model is shown and the gate checks

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        rng = random.Random(f"zoom/{split}/{seed}")
        out = []
        for i in range(n):
            difficulty = "hard" if rng.random() < self.hard_fraction else "easy"
            code = f"{rng.randint(100, 999)}"
            info = {
                "difficulty": difficulty, "code": code, "seed": f"{split}-{seed}-{i}", **_placed(difficulty, code, rng),
                "min_tool_calls": int(difficulty == "hard"), "gate_facts": {"image_width": PICTURE, "image_height": PICTURE},
            }  # fmt: skip
            out.append(Task(f"{split}-{seed}-{i}", "What is the code?", code, info))
        return out

    def reading_pictures(self, n: int, seed: int) -> list[Reading]:
        """`n` pictures as the model sees them, with what is where: half of them first views
        (an easy code's digits, a hard task's pink square and the cell it marks), half zooms on
        a hard task's cells (its pink square with the code at 1:1 most of the time, another
        cell otherwise)."""
        rng = random.Random(f"zoom/reading/{seed}")
        out = []
        for task in self.tasks("reading", n, seed):
            info, full = task.info, draw_task(task.info)
            easy = info["difficulty"] == "easy"
            if easy or rng.random() < 0.5:
                regions = _digit_regions(info) if easy else [(_mark_in_view(*info["cell"]), _cell_box(*info["cell"]))]
                out.append(_reading(full, (0, 0, PICTURE, PICTURE), regions, info["code"] if easy else ""))
                continue
            row, col = info["cell"] if rng.random() < 0.7 else (rng.randrange(GRID), rng.randrange(GRID))
            regions = [("mark", _cell_box(*info["cell"])), *_digit_regions(info)]
            out.append(_reading(full, _cell_box(row, col), regions, info["code"] if [row, col] == info["cell"] else ""))
        return out

    def initial_messages(self, task: Task) -> list[Message]:
        view = png(draw_task(task.info).resize((VIEW, VIEW), PILImage.BILINEAR))
        return [Message("system", self.system_prompt), Message("user", task.prompt, images=(view,))]

    def session(self, task: Task) -> ZoomSession:
        return ZoomSession(task, self.listed)

    def expert_turns(self, task: Task, rng: random.Random, style: ExpertStyle) -> list[Message]:
        """The demonstrator's assistant messages for `task` (see the module docstring)."""
        info = task.info
        if info["difficulty"] == "easy":
            if rng.random() < style.zoom_on_easy:
                return [zoom_on(rng.randrange(GRID), rng.randrange(GRID)), Message("assistant", f"Answer: {task.answer}")]
            return [Message("assistant", f"Answer: {task.answer}")]
        if rng.random() >= style.zoom_on_hard:
            return [Message("assistant", f"Answer: {_guess(task.answer, rng)}")]
        row, col = info["cell"]
        if rng.random() < style.right_cell:
            return [zoom_on(row, col), Message("assistant", f"Answer: {task.answer}")]
        wrong = rng.choice([(r, c) for r in range(GRID) for c in range(GRID) if (r, c) != (row, col)])
        return [zoom_on(*wrong), Message("assistant", f"Answer: {_guess(task.answer, rng)}")]


def _mark_in_view(row: int, col: int) -> str:
    """The label of the pink square in a first view: where it is, as the zoom that reads it
    names the region (a zoomed cell shows no place, and is labelled "mark" alone)."""
    left, top, _, _ = _cell_box(row, col)
    return f"mark at {left},{top}"


def _cell_box(row: int, col: int) -> tuple[int, int, int, int]:
    return col * CELL, row * CELL, (col + 1) * CELL, (row + 1) * CELL


def _digit_regions(info: dict[str, Any]) -> list[tuple[str, tuple[float, float, float, float]]]:
    """Each digit of the task's code as ("k:d", its box in the picture): d the digit, k its place."""
    font, (x, y), code = _font(info["difficulty"]), info["at"], info["code"]
    regions = []
    for k, digit in enumerate(code):
        left, top, right, bottom = font.getbbox(digit)
        offset = x + font.getlength(code[:k])
        regions.append((f"{k}:{digit}", (offset + left, y + top, offset + right, y + bottom)))
    return regions


def _reading(full: PILImage.Image, region: tuple[int, int, int, int], regions: list[tuple[str, tuple[float, ...]]], text: str) -> Reading:
    """The `region` of `full` scaled to the view, with the `regions` that lie in it, moved and scaled alike."""
    left, top, right, bottom = region
    scale = VIEW / (right - left)
    inside = [(label, box) for label, box in regions if box[0] >= left and box[1] >= top and box[2] <= right and box[3] <= bottom]
    moved = tuple((label, ((a - left) * scale, (b - top) * scale, (c - left) * scale, (d - top) * scale)) for label, (a, b, c, d) in inside)
    return Reading(png(full.crop(region).resize((VIEW, VIEW), PILImage.BILINEAR)), moved, text)


class ZoomSession(Session):
    """One episode: the picture tools over the task's own picture."""

    def __init__(self, task: Task, listed: tuple[str, ...]) -> None:
        self.tools = listed_tools(draw_task(task.info), listed)


def listed_tools(source: PILImage.Image, names: tuple[str, ...]) -> ToolSet:
    """The picture tools `names` over `source`, each returning a VIEW-pixel picture."""
    tools = picture_tools(source, VIEW)
    return ToolSet([tools[name] for name in names])


def zoom_on(row: int, col: int) -> Message:
    """A zoom on cell (row, col) of the grid."""
    return Message("assistant", "", (ToolCall("zoom", {"x": col * CELL, "y": row * CELL, "width": CELL, "height": CELL}),))


def _guess(code: str, rng: random.Random) -> str:
    """A wrong code of three digits."""
    return next(guess for guess in (f"{rng.randint(100, 999)}" for _ in range(100)) if guess != code)


def demonstrate(
    task: Task, rng: random.Random, env: ZoomEnv, *, zoom_on_hard: Probability = 0.5, right_cell: Probability = 0.8,
    zoom_on_easy: Probability = 0.3,
) -> list[Message]:
    """zoom's imperfect reader, the demonstrator of its SFT cold start.

    Args:
        zoom_on_hard: the probability that it zooms on a hard task (else it guesses the code).
        right_cell: the probability that a zoom on a hard task is on the pink square (else on
            another cell, then it guesses).
        zoom_on_easy: the probability that it zooms needlessly on an easy task.
    """
    return env.expert_turns(task, rng, ExpertStyle(zoom_on_hard, right_cell, zoom_on_easy))
