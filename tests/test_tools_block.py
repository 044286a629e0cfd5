"""Templates without a tools section: the silent drop is an error, and `chat_tools: system`
shows the tools as a Hermes block on the model's own turns.

SmolLM2-135M-Instruct's own template (plain ChatML) is read from the GGUF file its
package ships; the tokenizer is the shipped calc model's, which has the same ChatML
control tokens."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from toolpolicy.chat import ChatFormatError, HermesTemplate, JinjaTemplate
from toolpolicy.chat.tools_block import drops_tools, hermes_turns
from toolpolicy.types import Message, ToolCall, ToolSpec

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"
CALC = ToolSpec("calculator", "Evaluate an arithmetic expression.", {"type": "object", "properties": {"expression": {"type": "string"}}})
CALL = ToolCall("calculator", {"expression": "487*36"}, "c1")
SECOND = ToolCall("calculator", {"expression": "1+1"}, "c2")


@functools.cache
def smollm2_template() -> str:
    """The chat template inside SmolLM2's GGUF file (metadata only; no tensor is read)."""
    from gguf import GGUFReader

    from toolpolicy.model.gguf import smollm2_file

    reader = GGUFReader(str(smollm2_file()))
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


@functools.cache
def tokenizer():
    return AutoTokenizer.from_pretrained(SHIPPED)


def test_hermes_turns_writes_tools_calls_and_results_into_plain_turns() -> None:
    conversation = [
        Message("system", "Be brief."),
        Message("user", "Two sums."),
        Message("assistant", "Computing.", (CALL, SECOND)),
        Message("tool", "17532", name="calculator"),
        Message("tool", "2", name="calculator"),
        Message("user", "Thanks"),
    ]
    out = hermes_turns(conversation, [CALC])
    assert [m.role for m in out] == ["system", "user", "assistant", "user", "user"]
    assert out[0].content.startswith("Be brief.\n\n# Tools\n\nYou may call one or more functions")
    assert '{"type": "function", "function": {"name": "calculator"' in out[0].content
    assert out[2] == Message(
        "assistant",
        'Computing.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "487*36"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>',
    )
    assert out[3].content == "<tool_response>\n17532\n</tool_response>\n<tool_response>\n2\n</tool_response>"
    assert out[4] == Message("user", "Thanks")  # a user's own turn after results stays its own
    assert hermes_turns(conversation[1:], [])[0] == Message("user", "Two sums.")  # no tools: no system turn opened


def test_a_template_without_tools_is_an_error_that_names_the_fix() -> None:
    smollm2 = smollm2_template()
    assert drops_tools(JinjaTemplate(smollm2, "hermes", "<|im_end|>", ("<|im_end|>",)).render_prompt)
    with pytest.raises(ChatFormatError, match="same prompt with and without tools.*chat_tools: system"):
        JinjaTemplate.of(tokenizer(), "hermes", smollm2)
    with pytest.raises(ChatFormatError, match="chat_tools: system"):
        JinjaTemplate.of(tokenizer(), source=smollm2)  # auto: no call syntax in it either
    with pytest.raises(ChatFormatError, match="set chat_format: hermes"):
        JinjaTemplate.of(tokenizer(), "mistral", smollm2, tools="system")
    assert not drops_tools(HermesTemplate().render_prompt)


def test_chatml_with_the_tools_block_renders_as_qwen25_does() -> None:
    """SmolLM2's ChatML plus the Hermes block is Qwen2.5's rendering, byte for byte, whenever
    the conversation has a system message (without one, each model keeps its own default)."""
    template = JinjaTemplate.of(tokenizer(), source=smollm2_template(), tools="system")
    assert template.syntax == "hermes" and template.end_of_turn == "<|im_end|>"
    qwen = HermesTemplate()
    conversation = [
        Message("system", "Be brief."),
        Message("user", "What is 487 * 36?"),
        Message("assistant", "", (CALL,)),
        Message("tool", "17532", name="calculator"),
        Message("assistant", "17532"),
        Message("user", "And 1+1, twice?"),
        Message("assistant", "Sure.", (SECOND, SECOND)),
        Message("tool", "2", name="calculator"),
        Message("tool", "2", name="calculator"),
    ]
    for end in range(2, len(conversation) + 1):
        assert template.render(conversation[:end], [CALC]) == qwen.render(conversation[:end], [CALC]), end
    assert template.render_prompt(conversation[:2], [CALC]) == qwen.render_prompt(conversation[:2], [CALC])
    assert template.render_assistant(conversation[2]) == qwen.render_assistant(conversation[2])
    assert template.render_observation(conversation[3:4], after=conversation[2]) == qwen.render_observation(conversation[3:4])


def test_the_tools_block_keeps_the_prefix_property_and_parses_its_own_calls() -> None:
    template = JinjaTemplate.of(tokenizer(), source=smollm2_template(), tools="system")
    assert template.prefix_problems([CALC]) == []
    written = template.render_assistant(Message("assistant", "", (CALL,)))
    parsed = template.parse(written, max_call_chars=4096)
    assert parsed.tool_calls == (ToolCall("calculator", {"expression": "487*36"}),) and not parsed.errors
