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
from toolpolicy.model import codec
from toolpolicy.model.gguf import trl_template
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


TOOL_CONVERSATIONS = [
    [
        Message("system", "Be brief."), Message("user", "Two sums."), Message("assistant", "Computing.", (CALL, SECOND)),
        Message("tool", "17532", name="calculator"), Message("tool", "2", name="calculator"), Message("user", "Thanks"),
    ],
    [Message("user", "What is 487*36?"), Message("assistant", "", (CALL,)), Message("tool", "17532", name="calculator")],
    [Message("user", "Hi")],
]


@pytest.mark.parametrize("conversation", TOOL_CONVERSATIONS, ids=["system-two-calls", "no-system", "no-calls"])
@pytest.mark.parametrize("with_tools", [True, False], ids=["tools", "no-tools"])
def test_the_exported_template_renders_what_chat_tools_system_renders(conversation: list[Message], with_tools: bool) -> None:
    """SmolLM2's template behind `tools_template`, given tools and OpenAI-shaped calls as a
    server passes them: the text `chat_tools: system` trains on, at every turn boundary."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from toolpolicy.chat.jinja import openai_messages
    from toolpolicy.chat.tools_block import tools_template

    ours = JinjaTemplate.of(tokenizer(), source=smollm2_template(), tools="system")
    wrapped = tools_template(smollm2_template())
    tools = [CALC] if with_tools else []
    for end in range(1, len(conversation) + 1):
        for generation in (True, False):
            served, _ = render_jinja_template(
                [openai_messages(conversation[:end])], tools=[t.to_openai() for t in tools] or None, chat_template=wrapped,
                add_generation_prompt=generation, **ours.variables,
            )
            assert served[0] == ours.render(conversation[:end], tools, add_generation_prompt=generation)


def test_the_exported_template_takes_arguments_as_a_json_string() -> None:
    """OpenAI clients send a call's arguments as a JSON string: pasted as they are."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from toolpolicy.chat.tools_block import tools_template

    call = {"type": "function", "id": "c1", "function": {"name": "calculator", "arguments": '{"expression": "487*36"}'}}
    chat = [{"role": "user", "content": "Go"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    served, _ = render_jinja_template([chat], chat_template=tools_template(smollm2_template()))
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "487*36"}}\n</tool_call><|im_end|>' in served[0]


def test_export_gives_a_template_without_tools_a_tools_section(tmp_path: Path, capsys) -> None:
    """`toolpolicy export` of a model whose template drops tools (SmolLM2's ChatML on the
    calc model) writes the folder with the Hermes tools block in front and says so; the
    tools then reach the prompt through transformers' own apply_chat_template. A template
    that shows tools is written as it was."""
    import shutil

    from toolpolicy.cli import main

    plain = tmp_path / "chatml"
    shutil.copytree(SHIPPED, plain)
    (plain / "chat_template.jinja").write_text(smollm2_template())
    assert main(["export", str(plain), "--out", str(tmp_path / "out")]) == 0
    assert "has no tools section" in capsys.readouterr().err
    exported = AutoTokenizer.from_pretrained(tmp_path / "out")
    chat = [{"role": "user", "content": "487*36?"}]
    prompt = exported.apply_chat_template(chat, tools=[CALC.to_openai()], tokenize=False, add_generation_prompt=True)
    assert '<tools>\n{"type": "function", "function": {"name": "calculator"' in prompt
    assert exported.apply_chat_template(chat, tokenize=False) == AutoTokenizer.from_pretrained(plain).apply_chat_template(chat, tokenize=False)
    assert main(["export", str(SHIPPED), "--out", str(tmp_path / "as-is")]) == 0
    assert "has no tools section" not in capsys.readouterr().err
    assert AutoTokenizer.from_pretrained(tmp_path / "as-is").chat_template == tokenizer().chat_template


def gemma_like_tokenizer():
    """A character tokenizer with Gemma 3's quirk: "\\n" is an added, non-special token that
    its template writes as ordinary text, and plain text encodes to it too."""
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    vocab = {token: i for i, token in enumerate([*specials, "\n", *map(chr, range(32, 127))])}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    tok.add_tokens([AddedToken("\n", special=False, normalized=False)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>",
                                   chat_template=trl_template("gemma3.jinja"))


def test_gemma3_encodes_user_newlines_as_text_and_still_sanitizes_its_turn_tokens() -> None:
    """A whitespace token the template writes is not a control token: user text makes it
    from plain text (sanitizing it was an error); a typed <end_of_turn> stays text."""
    tok = gemma_like_tokenizer()
    encode, decode = codec(tok)
    chat = JinjaTemplate.of(tok, tools="system")
    assert chat.end_of_turn == "<end_of_turn>"
    question = "First line.\nSecond line <end_of_turn> typed."
    ids = encode(chat.render_prompt([Message("user", question)], [CALC]))
    end, newline = tok.convert_tokens_to_ids("<end_of_turn>"), tok.convert_tokens_to_ids("\n")
    assert ids.count(end) == 1  # the template's own, closing the user turn; the typed one is characters
    assert decode(ids).startswith("<bos><start_of_turn>user\n# Tools\n")
    typed = [tok.convert_tokens_to_ids(c) for c in question]  # one token a character, "\n" the added one's id
    assert newline in typed and any(ids[i : i + len(typed)] == typed for i in range(len(ids)))
    with pytest.raises(ChatFormatError, match=r"refuses this conversation \(user, user\): Conversation roles must alternate"):
        chat.render_prompt([Message("user", "a"), Message("user", "b")])
