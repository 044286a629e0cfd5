"""HermesTemplate: Qwen2.5 compatibility, the fragment invariant, and the Jinja export."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from toolpolicy.chat import COMPACT_PREAMBLE, GENERATION_PROMPT, SPECIAL_TOKENS, HermesTemplate
from toolpolicy.types import Message, ToolCall, ToolSpec

# Qwen2.5-Instruct's chat_template (tokenizer_config.json), kept here as the reference
# the default HermesTemplate must reproduce byte for byte.
QWEN25_JINJA = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

CALC = ToolSpec(
    "calculator",
    "Evaluate an arithmetic expression exactly.",
    {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 2*(3+4)"}}, "required": ["expression"]},
)
SEARCH = ToolSpec("search", "Search notes — with ünïcode.", {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})


def _call(expression: str) -> ToolCall:
    return ToolCall("calculator", {"expression": expression})


# Each conversation is (prefix, [assistant, observation, assistant, observation, ...]) so
# the fragment invariant can be checked turn by turn; the last observation may be empty.
CONVERSATIONS: list[tuple[list[Message], list[Message | list[Message]]]] = [
    ([Message("user", "Hi!")], [Message("assistant", "Hello.")]),
    (
        [Message("system", "Be brief."), Message("user", "What is 12*(3+4)?")],
        [
            Message("assistant", "", (_call("12*(3+4)"),)),
            [Message("tool", "84", name="calculator")],
            Message("assistant", "Answer: 84"),
        ],
    ),
    (
        [Message("user", "Two sums, ünïcode \"quotes\" and \\ slashes")],
        [
            Message("assistant", "Let me compute both.", (_call("1+1"), _call("2+2"))),
            [Message("tool", "2", name="calculator"), Message("tool", "4", name="calculator")],
            Message("assistant", "", (ToolCall("search", {"q": "nested", "opts": {"k": [1, 2.5, None, True]}}),)),
            [Message("tool", "nothing"), Message("user", "Try again"), Message("system", "Mid-conversation note.")],
            Message("assistant", "Done: 2 and 4."),
            [Message("user", "Thanks")],
        ],
    ),
    ([Message("system", "")], [Message("assistant", "")]),
]


def _flatten(prefix: list[Message], turns: list[Message | list[Message]]) -> list[Message]:
    out = list(prefix)
    for turn in turns:
        out.extend(turn if isinstance(turn, list) else [turn])
    return out


def _hf_render(chat_template: str, messages: list[Message], tools: tuple[ToolSpec, ...], generation_prompt: bool) -> str:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), chat_template=chat_template
    )
    return tokenizer.apply_chat_template(
        [m.to_dict() for m in messages],
        tools=[t.to_openai() for t in tools] or None,
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def test_special_tokens() -> None:
    assert SPECIAL_TOKENS == (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    )
    assert HermesTemplate().end_of_turn == "<|im_end|>"


def test_render_hand_written() -> None:
    messages = _flatten(*CONVERSATIONS[1])
    expected = (
        "<|im_start|>system\nBe brief.\n\n"
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression exactly.", '
        '"parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 2*(3+4)"}}, '
        '"required": ["expression"]}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 12*(3+4)?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*(3+4)"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n84\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nAnswer: 84<|im_end|>\n"
    )
    assert HermesTemplate().render(messages, (CALC,)) == expected


def test_render_assistant_fragments() -> None:
    template = HermesTemplate()
    assert template.render_assistant(Message("assistant", "Answer: 42")) == "Answer: 42<|im_end|>"
    assert template.render_assistant(Message("assistant", "", (_call("1+1"),))) == (
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call><|im_end|>'
    )
    assert template.render_assistant(Message("assistant", "Both.", (_call("1"), _call("2")))) == (
        'Both.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2"}}\n</tool_call><|im_end|>'
    )


def test_render_observation_groups_tool_messages() -> None:
    observation = HermesTemplate().render_observation([Message("tool", "2"), Message("tool", "4"), Message("user", "ok?")])
    assert observation == (
        "\n<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n4\n</tool_response><|im_end|>\n"
        "<|im_start|>user\nok?<|im_end|>\n<|im_start|>assistant\n"
    )
    with pytest.raises(ValueError):
        HermesTemplate().render_observation([Message("assistant", "not observed")])


@pytest.mark.parametrize("template", [HermesTemplate(), HermesTemplate.compact()], ids=["qwen25", "compact"])
@pytest.mark.parametrize("tools", [(), (CALC, SEARCH)], ids=["no_tools", "tools"])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_fragments_concatenate_to_render(template: HermesTemplate, tools: tuple[ToolSpec, ...], conversation) -> None:
    """render_prompt + (render_assistant + render_observation)* == render, turn by turn."""
    prefix, turns = conversation
    text = template.render_prompt(prefix, tools)
    seen = list(prefix)
    for turn in turns:
        if isinstance(turn, list):
            text += template.render_observation(turn)
            seen.extend(turn)
            assert text == template.render_prompt(seen, tools)
        else:
            text += template.render_assistant(turn)
            seen.append(turn)
            assert text + "\n" == template.render(seen, tools)


@pytest.mark.parametrize("tools", [(), (CALC, SEARCH)], ids=["no_tools", "tools"])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [False, True])
def test_default_matches_qwen25_template(tools, conversation, generation_prompt: bool) -> None:
    messages = _flatten(*conversation)
    expected = _hf_render(QWEN25_JINJA, messages, tools, generation_prompt)
    assert HermesTemplate().render(messages, tools, generation_prompt) == expected


@pytest.mark.parametrize(
    "template",
    [
        HermesTemplate(),
        HermesTemplate.compact(),
        HermesTemplate(tools_preamble='Odd "quotes" {{ braces }} @PREAMBLE_HEAD@\n{tools}\n}} done', default_system="Sys \\ ü"),
    ],
    ids=["qwen25", "compact", "odd_text"],
)
@pytest.mark.parametrize("tools", [(), (CALC, SEARCH)], ids=["no_tools", "tools"])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_jinja_template_matches_render(template: HermesTemplate, tools, conversation) -> None:
    messages = _flatten(*conversation)
    for generation_prompt in (False, True):
        assert _hf_render(template.jinja_template(), messages, tools, generation_prompt) == template.render(
            messages, tools, generation_prompt
        )


def test_jinja_template_accepts_openai_tool_calls() -> None:
    template = HermesTemplate.compact()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), chat_template=template.jinja_template()
    )
    openai_style = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}},
                {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}},
            ],
        },
    ]
    expected = template.render(
        [Message("user", "hi"), Message("assistant", "", (_call("1+1"), _call("2+2")))], add_generation_prompt=False
    )
    assert tokenizer.apply_chat_template(openai_style, tokenize=False) == expected


def test_compact_template() -> None:
    template = HermesTemplate.compact()
    assert template.render_prompt([Message("user", "hi")]) == "<|im_start|>user\nhi<|im_end|>\n" + GENERATION_PROMPT
    with_tools = template.render_prompt([Message("user", "hi")], (SEARCH,))
    assert with_tools.startswith("<|im_start|>system\n# Tools\n<tools>\nsearch(q: string) - ") and COMPACT_PREAMBLE[-20:] in with_tools
    assert len(with_tools) < len(HermesTemplate().render_prompt([Message("user", "hi")], (SEARCH,))) // 2 + 100


def test_preamble_needs_one_slot() -> None:
    with pytest.raises(ValueError):
        HermesTemplate(tools_preamble="no slot")
