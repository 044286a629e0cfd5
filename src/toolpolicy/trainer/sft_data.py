"""SFT data from a file: OpenAI chat records, as JSON Lines or a local Hugging Face dataset.

    sft_data: data/sft.jsonl           # one record per line (see toolpolicy.chat.records)
    sft_data: data/my_dataset          # a folder written by datasets' save_to_disk
    sft_data: data/train.parquet       # or one .parquet / .arrow file

Every record must be a usable conversation: the first one that is not stops the run
with its file and line (or row), so nothing is skipped silently. Conversations are
rendered by `recorded_trajectory`, the engine's own fragment framing, so a dialogue
exported from a run and read back trains on the very tokens the run produced.

Each record's tools are checked against the environment's, which RL and eval prompt
with (`record_tools`): a record without "tools" is shown the environment's, a record
whose tools differ trains as it is, each said in one warning line, and a call to a tool
the record does not offer stops the run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from toolpolicy.chat import ChatTemplate
from toolpolicy.chat.records import Conversation, RecordError, conversation_from_record, unoffered_call
from toolpolicy.envs.base import Env, shows_each_task_its_tools
from toolpolicy.jsonl import read_objects
from toolpolicy.rollout import EpisodeLimits, Trajectory, recorded_trajectory
from toolpolicy.types import Task, ToolSpec

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


def record_tools(conversations: list[tuple[str, Conversation]], env: Env) -> tuple[list[list[ToolSpec]], list[str]]:
    """The tools each conversation is shown, checked against the environment's (those RL
    and eval prompt with), and the warnings to print, one line per kind of mismatch:

    - a record without "tools" is shown the environment's tools (a warning); in an
      environment whose tasks each show their own tools (`task_specs`) it is an error;
    - a record whose tools differ from the environment's (names, order, descriptions or
      parameters) is trained as it is (a warning: its prompt differs from RL's);
    - an assistant call to a tool the record does not offer is an error.
    Errors raise SftDataError naming the file and line (or row) and the field."""
    per_task = shows_each_task_its_tools(env)  # no one set of tools to compare with
    theirs = env.tools.specs()
    shown: list[list[ToolSpec]] = []
    missing: list[str] = []
    differing: list[str] = []
    for where, conversation in conversations:
        tools = conversation.tools
        if tools is None and per_task:
            raise SftDataError(f"{where}: tools: missing; environment {env.name!r} shows each task its own tools, so a "
                               "record lists the ones it was shown")
        if tools is None:
            missing.append(where)
            tools = theirs
        elif not per_task and (difference := tools_difference(tools, theirs)) is not None:
            differing.append(f"{where}: {difference}")
        if (unoffered := unoffered_call(conversation.messages, tools)) is not None:
            raise SftDataError(f"{where}: {unoffered}")
        shown.append(tools)
    warnings = []
    n = len(conversations)
    if missing:
        names = ", ".join(spec.name for spec in theirs) or "none"
        warnings.append(f"sft_data: {len(missing)} of {n} records have no 'tools' (first: {missing[0]}): they are shown "
                        f"the environment's ({names}), as in RL and eval")
    if differing:
        warnings.append(f"sft_data: {len(differing)} of {n} records list other tools than the environment's, so their "
                        f"prompts differ from RL's and eval's (first: {differing[0]})")
    return shown, warnings


def tools_difference(tools: Sequence[ToolSpec], theirs: Sequence[ToolSpec]) -> str | None:
    """How a record's tools differ from the environment's, as "tools: ...", or None if they
    show the model the same (name, description, parameters, in the same order)."""
    mine, env = {s.name: s for s in tools}, {s.name: s for s in theirs}
    extra, lacking = [n for n in mine if n not in env], [n for n in env if n not in mine]
    if extra or lacking:
        parts = ([f"lists {', '.join(extra)}"] if extra else []) + ([f"lacks {', '.join(lacking)}"] if lacking else [])
        return f"tools: {' and '.join(parts)} (the environment's: {', '.join(env) or 'none'})"
    changed = [n for n in mine if (mine[n].description, mine[n].parameters) != (env[n].description, env[n].parameters)]
    if changed:
        return f"tools: {', '.join(changed)}: description or parameters differ from the environment's"
    if list(mine) != list(env):
        return f"tools: listed in another order than the environment's ({', '.join(env)})"
    return None


def data_examples(
    path: str | Path, template: ChatTemplate, encode: Callable[[str], list[int]], limits: EpisodeLimits, env: Env
) -> list[Trajectory]:
    """The SFT examples of a data file: each conversation rendered in the model's chat format,
    assistant turns trained and everything else masked, cut where the episode budgets
    (`limits`) would cut a rollout: the model never trains past what it may sample. Each
    is shown the tools `record_tools` gives it, checked against `env`'s."""
    conversations = load_conversations(path)
    tools, warnings = record_tools(conversations, env)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    examples = []
    for (where, conversation), shown in zip(conversations, tools):
        try:
            examples.append(recorded_trajectory(conversation.messages, shown, template, encode, limits, Task(where, "", "")))
        except ValueError as error:  # a chat template that cannot render the conversation
            raise SftDataError(f"{where}: cannot be rendered in the model's chat format: {error}") from None
    return examples
