"""Loading a policy (any local Hugging Face causal LM) and the embedded tiny model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from toolpolicy.chat import ENDOFTEXT, IM_END, HermesTemplate


def load_policy(path: str | Path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local checkpoint folder, in float32 on the CPU."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: not a model checkpoint (no config.json); train one or fix the path")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model, tokenizer


def codec(tokenizer: PreTrainedTokenizerBase) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """Text <-> ids with no added BOS/EOS and special tokens kept, as the engine needs."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    return encode, decode


def stop_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Ids that end an assistant turn: `<|im_end|>` and the end-of-text token."""
    return sorted({tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)})


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.convert_tokens_to_ids(ENDOFTEXT)


def make_template(compact: bool) -> HermesTemplate:
    return HermesTemplate.compact() if compact else HermesTemplate()


def char_codec() -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """Characters as ids: replaying demonstrations with it yields their exact text."""
    return (lambda text: [ord(c) for c in text]), (lambda ids: "".join(map(chr, ids)))


@dataclass
class PolicyModel:
    """A model with what the engine and the trainer need around it."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]

    @staticmethod
    def load(path: str | Path) -> PolicyModel:
        """The checkpoint at `path` (see `load_policy`) with its codec."""
        model, tokenizer = load_policy(path)
        return PolicyModel(model, tokenizer, *codec(tokenizer))

    @property
    def pad_id(self) -> int:
        return pad_id(self.tokenizer)

    @property
    def stop_ids(self) -> list[int]:
        return stop_ids(self.tokenizer)
