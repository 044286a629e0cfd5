"""Loading a policy (any local Hugging Face causal LM, in its own chat format) and the embedded tiny model."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
)
from transformers.utils.chat_template_utils import encode_marked_chat

from toolpolicy.chat import ChatFormatError, ChatTemplate, HermesTemplate, JinjaTemplate
from toolpolicy.model.adapters import adapter_base, is_adapter, load_adapter
from toolpolicy.model.files import check_checkpoint, diagnose_tokenizer
from toolpolicy.model.gguf import local_checkpoint
from toolpolicy.model.placement import Placement, place
from toolpolicy.model.vision import VisionInput, reads_pictures, vision_input


@dataclass(frozen=True)
class ChatChoice:
    """How to read a checkpoint's chat format (the config's chat_* fields)."""

    syntax: str = "auto"
    """Tool-call syntax: auto (from the template), hermes, llama3_json or mistral."""
    template_file: str = ""
    """A Jinja template used instead of the checkpoint's own."""
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra template variables (e.g. enable_thinking)."""
    tools: str = "template"
    """Where tools are shown: template (its own tools section) or system (a Hermes block; see chat/tools_block.py)."""


def load_policy(path: str | Path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Model and tokenizer from a local checkpoint folder (or a GGUF file, see `gguf.py`), in
    float32 on the CPU. A missing or damaged file is a CheckpointError naming it (see
    `files.check_checkpoint`)."""
    folder = local_checkpoint(path)
    check_checkpoint(folder, parse_tokenizer=False)
    tokenizer = load_tokenizer(folder)
    kind = AutoModelForImageTextToText if reads_pictures(AutoConfig.from_pretrained(folder)) else AutoModelForCausalLM
    model = kind.from_pretrained(folder, dtype=torch.float32)
    return model, tokenizer


def load_tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    """The folder's tokenizer; a CheckpointError naming the damaged file when it does not load."""
    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as error:  # the library's own error for a damaged file; name the file instead
        raise diagnose_tokenizer(folder, error) from None


def codec(tokenizer: PreTrainedTokenizerBase) -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """Text <-> ids with no added BOS/EOS. The template's own control tokens become their
    ids; control-token spellings the template marked inside user-supplied text stay text."""

    def encode(text: str) -> list[int]:
        return encode_marked_chat(tokenizer, text)

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=False)

    return encode, decode


def make_template(compact: bool) -> HermesTemplate:
    return HermesTemplate.compact() if compact else HermesTemplate()


def chat_template(tokenizer: PreTrainedTokenizerBase, choice: ChatChoice) -> ChatTemplate:
    """The checkpoint's chat format: the embedded model's ChatML in Python when its
    template is one of ours, else its Jinja template (or `choice.template_file`)."""
    source = Path(choice.template_file).read_text() if choice.template_file else None
    if source is None and choice.syntax in ("auto", "hermes") and not choice.kwargs and choice.tools == "template":
        for template in (HermesTemplate.compact(), HermesTemplate()):
            if tokenizer.chat_template == template.jinja_template():
                return template
    return JinjaTemplate.of(tokenizer, choice.syntax, source, choice.kwargs, choice.tools)


def stop_ids(tokenizer: PreTrainedTokenizerBase, template: ChatTemplate, generation: GenerationConfig | None) -> list[int]:
    """Ids that end an assistant turn: the template's stop strings and the checkpoint's
    `generation_config.eos_token_id`. Each stop string must be one token."""
    vocabulary = tokenizer.get_vocab()
    ids: set[int] = set()
    for stop in template.stops:
        if stop not in vocabulary:
            raise ChatFormatError(f"the stop string {stop!r} of the chat template is not one token of this tokenizer")
        ids.add(vocabulary[stop])
    eos = generation.eos_token_id if generation is not None else None
    ids.update(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return sorted(ids)


def warn_prefix_problems(path: str | Path, problems: list[str]) -> None:
    """Say on stderr which turn shapes the template renders differently from the engine."""
    if problems:
        print(
            f"warning: on these turn shapes the chat template of {path} does not render a conversation as its "
            f"prompt plus one fragment per turn: {'; '.join(problems)}. toolpolicy "
            "appends each new message's framing to the sampled ids and never re-tokenises, so the model trains on "
            "the conversation as the rollout produced it. To make training and serving render alike, set "
            "chat_template: to a prefix-preserving training template (trl ships qwen3_training.jinja).",
            file=sys.stderr,
        )


def char_codec() -> tuple[Callable[[str], list[int]], Callable[[list[int]], str]]:
    """Characters as ids: replaying demonstrations with it yields their exact text."""
    return (lambda text: [ord(c) for c in text]), (lambda ids: "".join(map(chr, ids)))


def _generation_config(folder: Path) -> GenerationConfig | None:
    return GenerationConfig.from_pretrained(folder) if (folder / "generation_config.json").is_file() else None


@dataclass
class PolicyModel:
    """A model with what the engine and the trainer need around it: its codec, chat
    format, the ids that stop a turn and the id that pads a batch."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    chat: ChatTemplate
    stop_ids: list[int]
    pad_id: int
    vision: VisionInput | None = None
    """How the model reads pictures (a vision-language model's); None: text only."""

    @staticmethod
    def load(path: str | Path, choice: ChatChoice = ChatChoice(), placement: Placement = Placement()) -> PolicyModel:
        """The checkpoint at `path` (see `load_policy`; a LoRA adapter folder loads on its
        base; a GGUF file as its plain folder) with its codec and chat format, on the device and
        in the precision of `placement`."""
        model, tokenizer, base = load_trained(path, placement)
        chat = chat_template(tokenizer, choice)
        stops = stop_ids(tokenizer, chat, _generation_config(base))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
        if isinstance(chat, JinjaTemplate):  # its parser cuts at every stop token, not only the template's own
            chat = replace(chat, stops=tuple(dict.fromkeys([*chat.stops, *tokenizer.convert_ids_to_tokens(stops)])))
            warn_prefix_problems(path, chat.prefix_problems())
        vision = vision_input(model, tokenizer)
        if vision is not None and isinstance(chat, (HermesTemplate, JinjaTemplate)):
            chat = replace(chat, image_span=vision.span)
        return PolicyModel(model, tokenizer, *codec(tokenizer), chat, stops, pad, vision)


def load_trained(path: str | Path, placement: Placement = Placement()) -> tuple[torch.nn.Module, PreTrainedTokenizerBase, Path]:
    """The weights and tokenizer at `path` (see `load_policy`; a LoRA adapter folder loads on
    its base; a GGUF file as its plain folder) placed by `placement`, and the base's folder."""
    folder = local_checkpoint(path)
    base = adapter_base(folder) if is_adapter(folder) else folder
    model, tokenizer = load_policy(base)
    model = place(model, placement)
    if base != folder:
        check_checkpoint(folder, parse_tokenizer=False)
        model, tokenizer = load_adapter(model, folder), load_tokenizer(folder)
    return model, tokenizer, base


def run_model(run_dir: str | Path) -> Path | None:
    """A run folder's newest model: RUN/rl/final, else RUN/sft/final, else RUN/model (the
    embedded model SFT built), the first that holds weights or a LoRA adapter; None if none does."""
    run_dir = Path(run_dir)
    for candidate in (run_dir / "rl" / "final", run_dir / "sft" / "final", run_dir / "model"):
        if (candidate / "config.json").is_file() or is_adapter(candidate):
            return candidate
    return None


def newest_model(source: str | Path) -> Path:
    """A run folder's newest model (`run_model`), or `source` itself (a model folder)."""
    return run_model(source) or Path(source)


