"""The embedded model: a BPE tokenizer and a tiny Qwen2 built from the environment's text.

Nothing is downloaded. The tokenizer is byte-level BPE (as Qwen2.5's) trained on
conversations the environment generates, with every digit its own token so that
numbers can be copied digit by digit, and with ChatML + Hermes tool-call special
tokens so the same template and parser serve a real Qwen2.5 checkpoint. The
model is a `Qwen2ForCausalLM` from a small config, saved with `save_pretrained`
(safetensors), so every later stage loads it like any Hugging Face checkpoint.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from toolpolicy.chat import ENDOFTEXT, IM_END, SPECIAL_TOKENS, HermesTemplate
from toolpolicy.chat.images import VISION_TOKENS
from toolpolicy.model.vision import VisionShape, build_vision_model

PAD_TOKEN = ENDOFTEXT
EOS_TOKEN = IM_END


@dataclass(frozen=True)
class ModelShape:
    """Size of the embedded Qwen2: a few million parameters at the defaults."""

    vocab_size: int = 1024
    hidden_size: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 768
    max_positions: int = 1024


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, template: HermesTemplate, extra_special: Sequence[str] = ()
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a Hugging Face fast tokenizer, with
    `extra_special` tokens (a vision model's VISION_TOKENS) after the chat format's own."""
    specials = (*SPECIAL_TOKENS, *extra_special)
    special_split = re.compile("|".join(re.escape(t) for t in specials))

    def pieces() -> Iterable[str]:
        # Special tokens are added whole; BPE merges are learned only from the text between them.
        for text in texts:
            yield from (piece for piece in special_split.split(text) if piece)

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    core.train_from_iterator(pieces(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[t for t in specials if t not in (EOS_TOKEN, PAD_TOKEN)],
        chat_template=template.jinja_template(),
        model_max_length=4096,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, shape: ModelShape, seed: int) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 whose vocabulary matches `tokenizer`."""
    config = text_config(tokenizer, shape)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def text_config(tokenizer: PreTrainedTokenizerFast, shape: ModelShape) -> Qwen2Config:
    """The embedded Qwen2's config: `shape`, `tokenizer`'s vocabulary and special ids."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )


def save_embedded(
    out_dir: Path, texts: Iterable[str], template: HermesTemplate, shape: ModelShape, seed: int, vision: VisionShape | None = None,
    prepare: Callable[[torch.nn.Module], None] | None = None,
) -> Path:
    """Build tokenizer and model and save both to `out_dir` as a Hugging Face checkpoint; with
    `vision`, the embedded VLM (model/vision.py) whose language model is of `shape`. `prepare`
    trains the fresh model in place before it is saved (the VLM's reading warm-up)."""
    tokenizer = train_tokenizer(texts, shape.vocab_size, template, VISION_TOKENS if vision is not None else ())
    if vision is None:
        model = build_model(tokenizer, shape, seed)
    else:
        model = build_vision_model(tokenizer, text_config(tokenizer, shape), vision, seed)
    if prepare is not None:
        prepare(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
