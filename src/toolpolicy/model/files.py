"""Checking a Hugging Face model folder before transformers reads it.

A folder cut short by a full disk or an interrupted copy otherwise fails deep inside
transformers or safetensors, far from the file at fault. `check_checkpoint` reads only
headers and small JSON files (never a tensor), so it is cheap enough to run before
every load, and its error names the file, what is wrong with it and how to fix it.
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

DAMAGED = "the checkpoint is damaged: save it again, or copy it again from where it came from"


class CheckpointError(Exception):
    """A model folder or trainer state that cannot be loaded; the message names the file and the fix."""


def check_checkpoint(folder: str | Path, parse_tokenizer: bool = True) -> None:
    """Raise CheckpointError unless `folder` holds a loadable model: config.json with a
    model_type, whole weights (single file or every shard of an index) and a tokenizer.

    parse_tokenizer=False leaves tokenizer.json unparsed (a real vocabulary's takes about
    0.6 s), for a caller that loads the tokenizer next and calls `diagnose_tokenizer` if that fails."""
    folder = Path(folder)
    if (folder / "adapter_config.json").is_file():  # a LoRA adapter: its own weights and tokenizer, then its base
        adapter = _read_json(folder / "adapter_config.json")
        check_safetensors(folder / "adapter_model.safetensors")
        _check_tokenizer(folder, parse_tokenizer)
        check_checkpoint(adapter["base_model_name_or_path"], parse_tokenizer)
        return
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder}: not a model checkpoint (no config.json); train one or fix the path")
    config = _read_json(config_file)
    if not isinstance(config, dict) or "model_type" not in config:
        raise CheckpointError(f"{config_file}: no model_type, so transformers cannot tell the architecture; {DAMAGED}")
    _check_weights(folder)
    _check_tokenizer(folder, parse_tokenizer)


def _read_json(path: Path) -> Any:
    """The JSON in `path`; CheckpointError naming the file, line and column if it is not JSON."""
    try:
        return json.loads(path.read_bytes())
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno}); {DAMAGED}") from None
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}); {DAMAGED}") from None


def check_safetensors(path: Path) -> None:
    """The header is whole JSON and the file is exactly as long as the header says
    (8-byte length + header + the largest data_offsets end), without reading a tensor."""
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors header; {DAMAGED}")
        (header_size,) = struct.unpack("<Q", prefix)  # little-endian u64, as the format specifies
        if 8 + header_size > size:
            raise CheckpointError(f"{path}: truncated inside its header ({size} bytes, header of {header_size}); {DAMAGED}")
        try:
            header = json.loads(f.read(header_size))
        except ValueError as error:  # JSONDecodeError or UnicodeDecodeError
            raise CheckpointError(f"{path}: the safetensors header is not valid JSON ({error}); {DAMAGED}") from None
    try:
        data_end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    except (AttributeError, KeyError, IndexError, TypeError):
        raise CheckpointError(f"{path}: the safetensors header lacks tensors' data_offsets; {DAMAGED}") from None
    expected = 8 + header_size + data_end
    if size != expected:
        cut = "truncated" if size < expected else "longer than its header says"
        raise CheckpointError(f"{path}: {cut} ({size} bytes, its header describes {expected}); {DAMAGED}")


def check_torch_zip(path: Path) -> None:
    """A torch.save archive whose central directory (written last) is there: not cut short."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path}: not a torch.save zip archive (truncated, or another kind of file); {DAMAGED}")


WEIGHTS: dict[str, Callable[[Path], None]] = {"model.safetensors": check_safetensors, "pytorch_model.bin": check_torch_zip}
"""Weight files transformers loads, in its order of preference; NAME.index.json lists NAME's shards."""


def _check_weights(folder: Path) -> None:
    for name, check in WEIGHTS.items():
        if (folder / name).is_file():
            check(folder / name)
            return
        index = folder / f"{name}.index.json"
        if index.is_file():
            listing = _read_json(index)
            shards = listing.get("weight_map") if isinstance(listing, dict) else None
            if not isinstance(shards, dict) or not shards:
                raise CheckpointError(f"{index}: no weight_map naming the shard files; {DAMAGED}")
            for shard in sorted(set(shards.values())):
                if not (folder / shard).is_file():
                    raise CheckpointError(f"{folder / shard}: missing, though {index.name} lists it; copy every shard into {folder}")
                check(folder / shard)
            return
    raise CheckpointError(
        f"{folder}: no weights (model.safetensors, model.safetensors.index.json with its shards, or pytorch_model.bin); "
        "save the model with save_pretrained or copy its weight files into the folder"
    )


def diagnose_tokenizer(folder: Path, error: Exception) -> CheckpointError:
    """The error for a tokenizer that did not load: a JSON file of it that does not parse,
    named with its line and column, else what the loader said."""
    _check_tokenizer(folder, parse=True)
    return CheckpointError(f"{folder}: the tokenizer does not load ({type(error).__name__}: {str(error)[:300]}); {DAMAGED}")


def _check_tokenizer(folder: Path, parse: bool) -> None:
    for name in ("tokenizer_config.json", "tokenizer.json", "vocab.json"):
        if (folder / name).is_file() and (parse or name == "tokenizer_config.json"):
            _read_json(folder / name)
    has_bpe_files = (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    if not ((folder / "tokenizer.json").is_file() or has_bpe_files or (folder / "tokenizer.model").is_file()):
        raise CheckpointError(
            f"{folder}: no tokenizer (tokenizer.json, vocab.json + merges.txt, or tokenizer.model); "
            "save the tokenizer into the folder with tokenizer.save_pretrained"
        )
