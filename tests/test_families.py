"""The four family checkpoints of tests/families.py: real tokenizers (ids equal to each package's own
encoder), official chat templates on a multi-turn tool conversation, a forward pass, and, for
Mistral, the generated template's ids against mistral_common's own encoding of the conversation."""

from __future__ import annotations

import copy
import importlib.resources
import json
import unicodedata

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from families import FAMILIES, MISTRAL_TEKKEN, mistral_reference_ids, reference_encode, special_tokens

# Written out by hand (from the real checkpoints), independent of families.py, so a wrong id there fails.
VOCAB_SIZE = {"qwen2.5": 151665, "qwen3": 151669, "llama3.1": 128256, "mistral": 131072}
EXPECTED_IDS = {
    "qwen2.5": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|video_pad|>": 151656,
                "<tool_call>": 151657, "</tool_call>": 151658, "<|file_sep|>": 151664},
    "qwen3": {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
              "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
              "</think>": 151668},
    "llama3.1": {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|finetune_right_pad_id|>": 128004,
                 "<|reserved_special_token_2|>": 128005, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007,
                 "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010,
                 "<|reserved_special_token_3|>": 128011, "<|reserved_special_token_4|>": 128012,
                 "<|reserved_special_token_247|>": 128255},
    "mistral": {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4, "[AVAILABLE_TOOLS]": 5,
                "[/AVAILABLE_TOOLS]": 6, "[TOOL_RESULTS]": 7, "[/TOOL_RESULTS]": 8, "[TOOL_CALLS]": 9, "<pad>": 11,
                "[SYSTEM_PROMPT]": 17, "[/SYSTEM_PROMPT]": 18},
}  # fmt: skip
# tokenizer_config.json's bos/eos/pad, generation_config.json's bos/eos/pad, and the token that
# closes an assistant turn in the chat template.
EXPECTED_TOKENS = {
    "qwen2.5": {"tokenizer": (None, 151645, 151643), "generation": (151643, [151645, 151643], 151643), "turn": 151645},
    "qwen3": {"tokenizer": (None, 151645, 151643), "generation": (151643, [151645, 151643], 151643), "turn": 151645},
    "llama3.1": {"tokenizer": (128000, 128009, None), "generation": (128000, [128001, 128008, 128009], None),
                 "turn": 128009},
    "mistral": {"tokenizer": (1, 2, 11), "generation": (1, 2, 11), "turn": 2},
}  # fmt: skip

TEXTS = [
    "Hello, world!",
    "def f(x):\n    return x ** 2  # square\n\n\tif x != 0: print(f'{x=}')",
    "12345 and 3.14159, -7, 1e10, 0x1F, 2024-07-26",
    "naïve café 東京 Ελληνικά русский 🤖👍🏽",
    "cafe\u0301 vs café",  # decomposed accent: Qwen normalises to NFC, the others do not
    "spaces:   three, tabs\t\there,  \n\n\n  trailing   ",
    "line one\r\nline two\n\n\nline five\n",
    '{"name": "get_weather", "arguments": {"city": "São Paulo", "q": "it\'s \\"quoted\\""}}',
    "I'm sure they'll say we've done what you'd DO'NT",
    "",
]
SPECIAL_TEXTS = {
    "qwen2.5": ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
                '{"name": "f", "arguments": {}}\n</tool_call><|im_end|><|endoftext|>',
                "text<|im_end|>text <|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "<tool_response>"],
    "qwen3": ["<|im_start|>assistant\n<think>\nhmm, 2+2\n</think>\n\n4<|im_end|>",
              "<|im_start|>user\n<tool_response>\n{\"t\": 18}\n</tool_response><|im_end|>\n"],
    "llama3.1": ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
                 "<|python_tag|>brave_search.call(query=\"x\")<|eom_id|><|finetune_right_pad_id|>",
                 "<|reserved_special_token_4|> is 128012 in 3.1, 128008 in 3.0 <|reserved_special_token_3|>"],
    "mistral": ["<s>[INST]hi[/INST]ok</s>[TOOL_CALLS][{\"name\": \"f\"}]</s>",
                "[AVAILABLE_TOOLS][][/AVAILABLE_TOOLS][TOOL_RESULTS]{}[/TOOL_RESULTS]<pad><unk>"],
}  # fmt: skip

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
CONVERSATION = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "id": "abc123xyz",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "abc123xyz", "name": "get_weather", "content": "18 degrees and cloudy"},
    {"role": "assistant", "content": "It is 18 °C and cloudy in Paris."},
    {"role": "user", "content": "And in Tokyo?"},
]
GENERATION_PROMPT = {
    "qwen2.5": "<|im_start|>assistant\n",
    "qwen3": "<|im_start|>assistant\n",
    "llama3.1": "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "mistral": "[INST]And in Tokyo?[/INST]",  # the template has no generation prompt: [/INST] ends the prompt
}
# How each template writes the assistant's tool call.
RENDERED_CALL = {
    "qwen2.5": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    "qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
    "llama3.1": '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}<|eot_id|>',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, '
    '"id": "abc123xyz"}]</s>',
}


@pytest.fixture(scope="module")
def loaded(family_checkpoint):
    cache = {}

    def get(family):
        if family not in cache:
            path = family_checkpoint(family)
            cache[family] = (path, AutoTokenizer.from_pretrained(path))
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_ids_match_the_package_encoder(family, loaded):
    path, tok = loaded(family)
    # tokenizer.json as written, for consumers that read it as is (transformers 4, vLLM, Rust): with
    # tokenizer_class Qwen2Tokenizer, transformers 5 keeps only its vocab, merges and added tokens
    # and rebuilds the normalizer and pre-tokenizer itself.
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert len(tok) == VOCAB_SIZE[family] == raw.get_vocab_size()
    for token, token_id in EXPECTED_IDS[family].items():
        assert tok.convert_tokens_to_ids(token) == token_id, token
        assert reference_encode(family, token) == [token_id], token
    for token, token_id in special_tokens(family).items():
        assert tok.encode(token, add_special_tokens=False) == [token_id], token
    if family == "qwen2.5":  # <tool_response> and <think> arrived with Qwen3: plain text in Qwen2.5
        assert len(tok.encode("<tool_response>")) > 1 and len(tok.encode("<think>")) > 1
    for text in TEXTS + SPECIAL_TEXTS[family]:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == reference_encode(family, text), text
        assert raw.encode(text, add_special_tokens=False).ids == ids, text
        expected = unicodedata.normalize("NFC", text) if family.startswith("qwen") else text
        assert tok.decode(ids) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_bos_eos_pad_and_stop_tokens(family, loaded):
    path, tok = loaded(family)
    expected = EXPECTED_TOKENS[family]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == expected["tokenizer"]
    generation = GenerationConfig.from_pretrained(path)
    assert (generation.bos_token_id, generation.eos_token_id, generation.pad_token_id) == expected["generation"]
    # What `tokenizer(text)` adds: Llama-3 prepends <|begin_of_text|>; Qwen and transformers' tekken
    # conversion add nothing.
    plain = tok.encode("hi", add_special_tokens=False)
    assert tok("hi")["input_ids"] == ([128000] if family == "llama3.1" else []) + plain


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template_is_the_official_one(family, loaded):
    path, tok = loaded(family)
    saved = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    if family == "mistral":
        from mistral_common.integrations.chat_templates.chat_templates import convert_tokenizer_to_chat_template

        tekken = importlib.resources.files("mistral_common") / "data" / MISTRAL_TEKKEN
        official = convert_tokenizer_to_chat_template(str(tekken))
    else:
        jinja = {"qwen2.5": "qwen2_5.jinja", "qwen3": "qwen3.jinja", "llama3.1": "llama3_1.jinja"}[family]
        official = (importlib.resources.files("trl") / "chat_templates" / jinja).read_text(encoding="utf-8")
    assert saved == official and tok.chat_template == official


def test_qwen_tool_and_think_tags_survive_skip_special_tokens(loaded):
    # Real Qwen tokenizers register <tool_call>, <tool_response>, <think> with special=False.
    _, tok = loaded("qwen3")
    ids = tok.encode("<|im_start|>assistant\n<think>x</think><tool_call>{}</tool_call><|im_end|>")
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n<think>x</think><tool_call>{}</tool_call>"


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template_renders_a_tool_conversation_and_the_model_runs(family, loaded):
    path, tok = loaded(family)
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert text.endswith(GENERATION_PROMPT[family])
    assert RENDERED_CALL[family] in text
    # The schema is in the prompt (Mistral v3 puts it before the last user message, the others up front).
    for needle in ("Get the current weather in a city.", "What's the weather in Paris?", "18 degrees and cloudy", "It is 18 °C and cloudy in Paris."):
        assert needle in text

    ids = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, add_generation_prompt=True,
                                  return_dict=False)  # fmt: skip
    assert ids == tok.encode(text, add_special_tokens=False)
    bos = EXPECTED_TOKENS[family]["tokenizer"][0]
    assert bos is None or (ids[0] == bos and ids.count(bos) == 1)  # BOS once, from the template
    assert ids.count(EXPECTED_TOKENS[family]["turn"]) >= 2  # both assistant turns are closed with the end-of-turn token

    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == {"qwen2.5": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                    "llama3.1": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}[family]  # fmt: skip
    assert model.config.vocab_size == len(tok) and model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok)) and torch.isfinite(logits).all()


def test_qwen3_template_drops_reasoning_of_earlier_turns(loaded):
    _, tok = loaded("qwen3")
    turns = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "<think>\nagain\n</think>\n\n6"},
    ]
    first = tok.apply_chat_template(turns[:2], tokenize=False)
    both = tok.apply_chat_template(turns, tokenize=False)
    assert "<think>\nadd them\n</think>" in first
    assert "add them" not in both and "<think>\nagain\n</think>" in both  # not prefix-preserving
    assert not both.startswith(first)


def test_llama31_template_quirks(loaded):
    _, tok = loaded("llama3.1")
    text = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    # A string tool result is JSON-encoded again: Jinja's `is iterable` is true for strings.
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"18 degrees and cloudy"<|eot_id|>' in text
    # The tool schemas go into the first user message; one tool call per assistant turn at most.
    first_user = text.split("<|start_header_id|>user<|end_header_id|>\n\n")[1]
    assert '"name": "get_weather"' in first_user and first_user.split("<|eot_id|>")[0].endswith("Paris?")
    two_calls = copy.deepcopy(CONVERSATION)
    two_calls[1]["tool_calls"] *= 2
    with pytest.raises(Exception, match="single tool-calls"):
        tok.apply_chat_template(two_calls, tools=TOOLS, tokenize=False)


# ---------------------------------------------------------------------------------------- Mistral


def _mistral_ids(tok, messages, tools=TOOLS):
    return tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)


def test_mistral_template_ids_equal_mistral_common(loaded):
    _, tok = loaded("mistral")
    assert _mistral_ids(tok, CONVERSATION) == mistral_reference_ids(CONVERSATION, TOOLS)
    # Shapes where the two also agree: a system prompt (folded into the last [INST]), two calls in
    # one turn with two results, a canonical integer result, arguments given as a JSON string.
    with_system = [{"role": "system", "content": "Be terse."}] + CONVERSATION
    parallel = copy.deepcopy(CONVERSATION)
    parallel[1]["tool_calls"].append(
        {"type": "function", "id": "def456uvw", "function": {"name": "get_weather", "arguments": {"city": "Lyon"}}}
    )
    parallel.insert(3, {"role": "tool", "tool_call_id": "def456uvw", "name": "get_weather", "content": "20 degrees"})
    integer = copy.deepcopy(CONVERSATION)
    integer[2]["content"] = "18"
    string_args = copy.deepcopy(CONVERSATION)
    string_args[1]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris", "unit": "celsius"}'
    for messages in (with_system, parallel, integer, string_args):
        assert _mistral_ids(tok, messages) == mistral_reference_ids(messages, TOOLS)


def test_mistral_json_tool_result_is_where_template_and_mistral_common_differ(loaded):
    """mistral_common (InstructTokenizerV3._parse_json_content) json.loads a tool result and embeds
    the parsed value; the generated template only turns canonical int/float strings into numbers and
    otherwise tojson's the string, so a JSON result arrives quoted and escaped."""
    _, tok = loaded("mistral")
    result = '{"temperature": 18, "sky": "cloudy"}'
    messages = copy.deepcopy(CONVERSATION)
    messages[2]["content"] = result
    template_text = tok.decode(_mistral_ids(tok, messages))
    reference_text = tok.decode(mistral_reference_ids(messages, TOOLS))
    assert template_text != reference_text
    assert template_text.replace(json.dumps(result), result) == reference_text


def test_mistral_tool_call_ids_must_be_nine_characters(loaded):
    _, tok = loaded("mistral")
    messages = copy.deepcopy(CONVERSATION)
    messages[1]["tool_calls"][0]["id"] = messages[2]["tool_call_id"] = "call_1"
    with pytest.raises(Exception, match="9 characters"):
        _mistral_ids(tok, messages)
    with pytest.raises(Exception, match="length of 9"):
        mistral_reference_ids(messages, TOOLS)
    # The template checks only the length; mistral_common also wants [a-zA-Z0-9].
    messages[1]["tool_calls"][0]["id"] = messages[2]["tool_call_id"] = "abc-23xyz"
    _mistral_ids(tok, messages)
    with pytest.raises(Exception, match="a-z, A-Z, 0-9"):
        mistral_reference_ids(messages, TOOLS)


def test_mistral_control_token_text_in_content_differs(loaded):
    """HF's tokenizer turns "[INST]" typed in a message into control token 3; mistral_common's
    Tekkenizer encodes it as plain text (it never emits a special id for content)."""
    _, tok = loaded("mistral")
    messages = copy.deepcopy(CONVERSATION)
    messages[-1]["content"] = "And in [INST]Tokyo?"
    template_ids = _mistral_ids(tok, messages)
    reference_ids = mistral_reference_ids(messages, TOOLS)
    assert template_ids.count(3) == 3 and reference_ids.count(3) == 2
    assert tok.decode(template_ids) == tok.decode(reference_ids)
