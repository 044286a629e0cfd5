"""SFT data from a file: OpenAI chat records, as JSON Lines or a local Hugging Face dataset.

    sft_data: data/sft.jsonl           # one record per line (see toolpolicy.chat.records)
    sft_data: data/my_dataset          # a folder written by datasets' save_to_disk
    sft_data: data/train.parquet       # or one .parquet / .arrow file

Every record must be a usable conversation: the first one that is not stops the run
with its file and line (or row), so nothing is skipped silently. Conversations are
rendered by `recorded_trajectory`, the engine's own fragment framing, so a dialogue
exported from a run and read back trains on the very tokens the run produced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from toolpolicy.chat import ChatTemplate
from toolpolicy.chat.records import Conversation, RecordError, conversation_from_record
from toolpolicy.jsonl import read_objects
from toolpolicy.rollout import Limits, Trajectory, recorded_trajectory
from toolpolicy.types import Task

JSONL_SUFFIXES = (".jsonl", ".json")
DATASET_FILES = {".parquet": "from_parquet", ".arrow": "from_file"}
"""Single-file Hugging Face datasets by suffix, and the `datasets.Dataset` constructor of each."""


class SftDataError(ValueError):
    """An SFT data file that cannot be used; the message names the file and the line or row."""


def read_records(path: Path) -> Iterator[tuple[str, Any]]:
    """("file:line" or "folder: row N", record) for every record of the file or dataset."""
    if not path.exists():
        raise SftDataError(f"sft_data: {path} does not exist")
    if path.is_file() and path.suffix in JSONL_SUFFIXES:
        yield from read_objects(path, SftDataError)
        return
    if path.is_file() and path.suffix not in DATASET_FILES:
        known = ", ".join((*JSONL_SUFFIXES, *DATASET_FILES))
        raise SftDataError(f"sft_data: {path}: unknown file type {path.suffix!r} (use {known}, or a save_to_disk folder)")
    for row, record in enumerate(_dataset(path)):
        yield f"{path}: row {row}", record


def _dataset(path: Path) -> Any:
    """The rows of a local Hugging Face dataset: a save_to_disk folder (its "train" split
    if it holds several) or a .parquet / .arrow file. Never downloads."""
    import datasets  # here: only datasets on disk need it

    try:
        if path.is_file():
            return getattr(datasets.Dataset, DATASET_FILES[path.suffix])(str(path))
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as error:
        raise SftDataError(f"sft_data: {path}: not a dataset datasets can read ({error})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise SftDataError(f"sft_data: {path}: a DatasetDict without a 'train' split (has {', '.join(loaded)})")
        return loaded["train"]
    return loaded


def load_conversations(path: str | Path) -> list[tuple[str, Conversation]]:
    """Every conversation of `path`, with where it came from; the first bad record raises
    SftDataError naming its file and line (or row) and the field at fault."""
    out = []
    for where, record in read_records(Path(path)):
        try:
            out.append((where, conversation_from_record(record)))
        except RecordError as error:
            raise SftDataError(f"{where}: {error}") from None
    if not out:
        raise SftDataError(f"sft_data: {path} holds no records")
    return out


def data_examples(
    path: str | Path, template: ChatTemplate, encode: Callable[[str], list[int]], limits: Limits
) -> list[Trajectory]:
    """The SFT examples of a data file: each conversation rendered in the model's chat format,
    assistant turns trained and everything else masked, cut where the episode budgets
    (`limits`) would cut a rollout: the model never trains past what it may sample."""
    examples = []
    for where, conversation in load_conversations(path):
        try:
            examples.append(recorded_trajectory(conversation.messages, conversation.tools, template, encode, limits, Task(where, "", "")))
        except ValueError as error:  # a chat template that cannot render the conversation
            raise SftDataError(f"{where}: cannot be rendered in the model's chat format: {error}") from None
    return examples
