"""A damaged model folder or trainer state is a one-line CheckpointError naming the file and
what is wrong, found before transformers or torch reads a tensor."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from toolpolicy.model.files import CheckpointError, check_checkpoint
from toolpolicy.trainer.checkpoint import load_trainer_state

CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the shipped checkpoint, whole, to damage."""
    return Path(shutil.copytree(CALC_SFT, tmp_path / "model"))


def cut(path: Path, size: int) -> None:
    """Keep the first `size` bytes (negative: drop that many from the end), as a full disk does."""
    data = path.read_bytes()
    path.write_bytes(data[:size])


def overwrite(path: Path, at: int, junk: bytes) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + len(junk)] = junk
    path.write_bytes(bytes(data))


def assert_names(error: pytest.ExceptionInfo[CheckpointError], path: Path, *phrases: str) -> None:
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    for phrase in phrases:
        assert phrase in message, message


def test_a_whole_checkpoint_passes(folder: Path) -> None:
    check_checkpoint(folder)


DAMAGE: dict[str, tuple[Callable[[Path], None], str, tuple[str, ...]]] = {
    # name: (what happens to the folder, the file the error names, phrases it says)
    "weights one byte short": (lambda f: cut(f / "model.safetensors", -1), "model.safetensors", ("truncated", "its header describes")),
    "weights cut inside the header": (lambda f: cut(f / "model.safetensors", 100), "model.safetensors", ("truncated inside its header",)),
    "weights header not JSON": (
        lambda f: overwrite(f / "model.safetensors", 8, b"\x00garbage"), "model.safetensors", ("header is not valid JSON",),
    ),
    "weights longer than the header says": (
        lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes() + b"\x00"),
        "model.safetensors", ("longer than its header says",),
    ),
    "config cut short": (lambda f: cut(f / "config.json", 40), "config.json", ("not valid JSON", "line 3 column")),
    "config without model_type": (
        lambda f: (f / "config.json").write_text(json.dumps({"hidden_size": 8})), "config.json", ("no model_type",),
    ),
    "no config": (lambda f: (f / "config.json").unlink(), "", ("no config.json",)),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), "", ("no weights", "save_pretrained")),
    "tokenizer not JSON": (lambda f: overwrite(f / "tokenizer.json", 0, b"{]"), "tokenizer.json", ("not valid JSON", "line 1 column 2")),
    "no tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "", ("no tokenizer", "tokenizer.save_pretrained")),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_an_error_that_names_the_file(damage: str, folder: Path) -> None:
    spoil, name, phrases = DAMAGE[damage]
    spoil(folder)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(folder)
    assert_names(error, folder / name if name else folder, *phrases)


@pytest.mark.parametrize("damage", ["tokenizer not JSON", "tokenizer cut short"])
def test_loading_a_damaged_tokenizer_names_the_file(damage: str, folder: Path) -> None:
    """Loading parses tokenizer.json only when the tokenizer fails to load; the error still names it."""
    from toolpolicy.model import PolicyModel

    if damage == "tokenizer cut short":
        cut(folder / "tokenizer.json", -10)
    else:
        overwrite(folder / "tokenizer.json", 0, b"{]")
    with pytest.raises(CheckpointError) as error:
        PolicyModel.load(folder)
    assert_names(error, folder / "tokenizer.json", "not valid JSON")


def test_sharded_weights_need_every_shard_whole(folder: Path) -> None:
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, folder / shard, metadata={"format": "pt"})
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    check_checkpoint(folder)

    second = folder / "model-00002-of-00002.safetensors"
    cut(second, -4)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(folder)
    assert_names(error, second, "truncated")
    second.unlink()
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(folder)
    assert_names(error, second, "missing", "model.safetensors.index.json")


def test_pytorch_bin_weights_and_other_tokenizer_files(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    torch.save({"w": torch.zeros(4)}, folder / "pytorch_model.bin")
    (folder / "tokenizer.json").unlink()
    (folder / "vocab.json").write_text("{}")
    (folder / "merges.txt").write_text("#version: 0.2\n")
    check_checkpoint(folder)  # a BPE tokenizer in vocab.json + merges.txt
    (folder / "merges.txt").unlink()
    (folder / "vocab.json").unlink()
    (folder / "tokenizer.model").write_bytes(b"sentencepiece")
    check_checkpoint(folder)  # a sentencepiece tokenizer

    cut(folder / "pytorch_model.bin", -30)
    with pytest.raises(CheckpointError) as error:
        check_checkpoint(folder)
    assert_names(error, folder / "pytorch_model.bin", "not a torch.save zip archive")


def damage_pickle(path: Path) -> None:
    """Spoil bytes inside the archive's pickle record, leaving the zip itself whole."""
    data = path.read_bytes()
    overwrite(path, data.index(b"step"), b"\xff\xfe\xfd\xfc")


STATE_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing": (lambda p: p.unlink(), "missing"),
    "cut short": (lambda p: cut(p, -100), "not a torch.save zip archive"),
    "empty": (lambda p: p.write_bytes(b""), "not a torch.save zip archive"),
    "damaged pickle": (damage_pickle, "unreadable"),
    "another kind of state": (lambda p: torch.save({"step": 3}, p), "not a trainer state (no optimizer, scheduler, rng)"),
}


@pytest.mark.parametrize("damage", sorted(STATE_DAMAGE))
def test_a_damaged_trainer_state_is_an_error_that_names_the_file(damage: str, tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.pt"
    torch.save({"step": 3, "optimizer": {"state": {0: {"exp_avg": torch.ones(64)}}}, "scheduler": {}, "rng": {}}, path)
    assert load_trainer_state(path)["step"] == 3
    spoil, phrase = STATE_DAMAGE[damage]
    spoil(path)
    for mmap in (False, True):
        with pytest.raises(CheckpointError) as error:
            load_trainer_state(path, mmap=mmap)
        assert_names(error, path, phrase)


def test_eval_of_a_truncated_checkpoint_is_one_line_naming_the_file(tmp_path, capsys) -> None:
    """Through the command: a damaged model file is a one-line user error, no traceback."""
    from toolpolicy.cli import main

    from conftest import SMOKE

    broken = tmp_path / "model"
    shutil.copytree(CALC_SFT, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    assert main(["eval", str(SMOKE), "--set", f"run.dir={tmp_path / 'run'}", "--set", f"eval.checkpoint={broken}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(weights) in err.strip().splitlines()[-1]
