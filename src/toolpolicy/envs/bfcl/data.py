"""BFCL v4's multi-turn entries, read from the installed `bfcl-eval` package.

Nothing of BFCL's is copied into this repository: the question files, possible answers
and function docs are read from `bfcl_eval/data/` of the installed package, which is
installed without its dependencies (`pip install --no-deps bfcl-eval==2026.3.23`: it
pins numpy 1.26.4 and pulls every API client; only its data and its backends are used).

An entry is a conversation: a user message per turn, the backends it involves with their
initial state, and a ground truth of Python-syntax call strings per turn ("cd(folder='x')").
In `multi_turn_miss_func` some functions are withheld from the listed tools until a turn
that has no user message of its own: BFCL then shows the withheld docs and asks
"I have updated some more functions you can choose from. What about now?". In
`multi_turn_miss_param` and `miss_func` a turn whose ground truth is empty is one the
model cannot complete (a parameter or function is missing): BFCL checks nothing there.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from toolpolicy.jsonl import read_objects

CATEGORIES = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
"""BFCL v4's multi-turn categories (its memory, web-search and format-sensitivity entries are not multi-turn)."""

BACKENDS = (
    "GorillaFileSystem", "MathAPI", "MessageAPI", "TwitterAPI", "TicketAPI", "TradingBot", "TravelAPI", "VehicleControlAPI",
)
"""The multi-turn categories' backends (file system, math, messaging, posting, tickets, trading,
travel booking, vehicle control), by their class names in bfcl_eval."""

EVAL_SHARE = 5
"""One conversation in EVAL_SHARE goes to the eval split (see `split_of`), the rest to train."""

INSTALL_HINT = "install it with: pip install --no-deps bfcl-eval==2026.3.23"


class BfclDataError(RuntimeError):
    """bfcl-eval is missing or one of its files is not what this environment reads."""


@dataclass(frozen=True)
class Entry:
    """One multi-turn conversation of BFCL, with its ground truth."""

    id: str
    category: str
    turns: tuple[str, ...]
    """The user's message per turn; "" for a miss_func turn that only adds functions."""
    classes: tuple[str, ...]
    """The backends involved, in the entry's order (BFCL lists their functions in this order)."""
    initial_config: dict[str, Any]
    """Per backend, the scenario its `_load_scenario` loads."""
    ground_truth: tuple[tuple[str, ...], ...]
    """Per turn, the calls that complete it, as Python-syntax strings; empty: nothing can be done."""
    held_out: dict[int, tuple[str, ...]]
    """Turn index -> functions withheld until that turn (miss_func only)."""

    @property
    def long_context(self) -> bool:
        """Whether the backends load their long-context filler (BFCL: "long_context" in the category)."""
        return "long_context" in self.category


def data_dir() -> Path:
    """bfcl_eval/data/ of the installed package; BfclDataError with the install line if it is missing."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        raise BfclDataError(f"the bfcl_multi_turn environment needs the bfcl-eval package; {INSTALL_HINT}")
    return Path(spec.origin).parent / "data"


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise BfclDataError(f"{path} is missing from the installed bfcl-eval; {INSTALL_HINT}")
    return [row for _, row in read_objects(path, BfclDataError)]


@cache
def function_docs(class_name: str) -> tuple[dict[str, Any], ...]:
    """BFCL's function docs of one backend ({name, description, parameters, response})."""
    if class_name not in BACKENDS:
        raise BfclDataError(f"unknown BFCL backend {class_name!r}; known: {', '.join(BACKENDS)}")
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    return tuple(_rows(data_dir() / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]))


@cache
def load_entries(category: str) -> tuple[Entry, ...]:
    """Every entry of `category`, its questions joined with its possible answers by id."""
    if category not in CATEGORIES:
        raise BfclDataError(f"unknown BFCL multi-turn category {category!r}; known: {', '.join(CATEGORIES)}")
    questions = _rows(data_dir() / f"BFCL_v4_{category}.json")
    answers = {row["id"]: row["ground_truth"] for row in _rows(data_dir() / "possible_answer" / f"BFCL_v4_{category}.json")}
    return tuple(_entry(row, answers, category) for row in questions)


def _entry(row: dict[str, Any], answers: dict[str, list[list[str]]], category: str) -> Entry:
    where = f"{category} entry {row.get('id')!r}"
    if row["id"] not in answers:
        raise BfclDataError(f"{where} has no possible answer in possible_answer/BFCL_v4_{category}.json")
    turns = tuple("\n".join(m["content"] for m in turn if m["role"] == "user") for turn in row["question"])
    truth = tuple(tuple(calls) for calls in answers[row["id"]])
    if len(truth) != len(turns):
        raise BfclDataError(f"{where}: {len(turns)} turns but {len(truth)} ground-truth turns")
    unknown = [name for name in row["involved_classes"] if name not in BACKENDS]
    if unknown:
        raise BfclDataError(f"{where} involves backends this environment does not know: {unknown}")
    held_out = {int(turn): tuple(names) for turn, names in row.get("missed_function", {}).items()}
    return Entry(row["id"], category, turns, tuple(row["involved_classes"]), row["initial_config"], truth, held_out)


def split_of(entry_id: str) -> str:
    """"eval" for one conversation in EVAL_SHARE, "train" for the others.

    The four categories vary the same 200 conversations (multi_turn_base_7,
    multi_turn_miss_func_7, ... share their scenario and requests), so the split hashes the
    conversation's number, not the whole id: the variants of one conversation always land
    in the same split. Fixed by the id alone, whatever the seed or the number of tasks."""
    number = entry_id.rsplit("_", 1)[-1]
    digest = hashlib.sha256(number.encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % EVAL_SHARE == 0 else "train"
