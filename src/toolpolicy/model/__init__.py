"""Loading a policy (any local Hugging Face causal LM) and the embedded tiny model."""

from __future__ import annotations

from collections.abc import Callable
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
