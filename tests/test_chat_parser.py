"""parse_assistant: each error kind by hand, never raising on any text, and render/parse round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpolicy.chat import SPECIAL_TOKENS, HermesTemplate, parse_assistant
from toolpolicy.types import Message, ToolCall

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'


def test_single_call_with_stop_string() -> None:
    turn = parse_assistant(CALL + "<|im_end|>")
    assert turn == parse_assistant(CALL + "<|endoftext|>")
    assert turn.content == ""
    assert turn.tool_calls == (ToolCall("calculator", {"expression": "2+2"}),)
    assert turn.errors == ()


def test_content_and_parallel_calls() -> None:
    text = f"I'll compute both.\n{CALL}\n{CALL.replace('2+2', '3*3')}<|im_end|>"
    turn = parse_assistant(text)
    assert turn.content == "I'll compute both."
    assert [c.arguments["expression"] for c in turn.tool_calls] == ["2+2", "3*3"]


def test_plain_answer_and_text_after_stop() -> None:
    turn = parse_assistant("Answer: 42<|im_end|>\n<|im_start|>user\n<tool_call>junk")
    assert (turn.content, turn.tool_calls, turn.errors) == ("Answer: 42", (), ())


def test_arguments_as_json_string_and_missing_arguments() -> None:
    turn = parse_assistant('<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b"}</tool_call>')
    assert turn.tool_calls == (ToolCall("a", {"x": 1}), ToolCall("b", {}))


def test_raw_newline_inside_a_json_string_is_accepted() -> None:
    turn = parse_assistant('<tool_call>{"name": "py", "arguments": {"code": "a = 1\nprint(a)"}}</tool_call>')
    assert turn.tool_calls == (ToolCall("py", {"code": "a = 1\nprint(a)"}),)


def test_stray_close_tag_stays_in_content() -> None:
    turn = parse_assistant("The tag </tool_call> closes a call.")
    assert (turn.content, turn.tool_calls, turn.errors) == ("The tag </tool_call> closes a call.", (), ())


@pytest.mark.parametrize(
    ("text", "kind", "hint"),
    [
        ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+', "unclosed_tag", "</tool_call>"),
        ('<tool_call>{"name": "calculator" "arguments": {}}</tool_call>', "bad_json", "Expecting ',' delimiter at char 22"),
        ('<tool_call>{"name": "a", "arguments": {"x": NaN}}</tool_call>', "bad_json", "NaN"),
        ("<tool_call>" + "[" * 1500 + "</tool_call>", "bad_json", "nested too deeply"),
        ('<tool_call>["calculator", {"expression": "1"}]</tool_call>', "not_an_object", "not an array"),
        ('<tool_call>"calculator"</tool_call>', "not_an_object", "not a string"),
        ('<tool_call>{"arguments": {"expression": "1"}}</tool_call>', "missing_name", '"name"'),
        ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', "missing_name", '"name"'),
        ('<tool_call>{"name": "a", "arguments": [1, 2]}</tool_call>', "bad_arguments", "not an array"),
        ('<tool_call>{"name": "a", "arguments": "not json"}</tool_call>', "bad_arguments", "not a string"),
        ('<tool_call>{"name": "a", "arguments": null}</tool_call>', "bad_arguments", "not null"),
        ('<tool_call>{"name": "a", "arguments": {"s": "' + "x" * 3000 + '"}}</tool_call>', "too_long", "over the limit of 2000"),
    ],
)
def test_error_kinds(text: str, kind: str, hint: str) -> None:
    turn = parse_assistant(text, max_call_chars=2000)
    assert turn.tool_calls == ()
    [error] = turn.errors
    assert error.kind == kind
    assert hint in error.message
    assert len(error.raw) <= 200


def test_bad_json_message_tells_the_model_the_shape() -> None:
    [error] = parse_assistant('<tool_call>{"name": "calculator" "arguments": {}}</tool_call>').errors
    assert error.message == (
        "Tool call is not valid JSON (Expecting ',' delimiter at char 22). "
        'Write {"name": "<tool name>", "arguments": {...}} inside <tool_call></tool_call>.'
    )


def test_good_and_bad_calls_in_one_turn() -> None:
    turn = parse_assistant(f"{CALL}<tool_call>oops</tool_call>{CALL}<tool_call>{{")
    assert len(turn.tool_calls) == 2
    assert [e.kind for e in turn.errors] == ["bad_json", "unclosed_tag"]


# --- properties -------------------------------------------------------------------------

TAGS = st.sampled_from([*SPECIAL_TOKENS, "{", "}", '"name"', '"arguments"', ":", ",", "[", "]", "\n", " "])
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _free_of_special_tokens(text: str) -> bool:
    return not any(token in text for token in SPECIAL_TOKENS)


@settings(max_examples=300)
@given(st.lists(st.text(max_size=30) | TAGS, max_size=30).map("".join))
def test_never_raises_on_text_with_tags(text: str) -> None:
    turn = parse_assistant(text)
    assert isinstance(turn.content, str)
    assert all(len(error.raw) <= 200 for error in turn.errors)


CALL_ERROR_KINDS = {"unclosed_tag", "bad_json", "not_an_object", "missing_name", "bad_arguments", "too_long"}
"""Every kind a CallError may have (types.CallError)."""


@given(st.text(alphabet='{}[]":,0123456789.eE+-tfnul\\ \n', max_size=200))
def test_never_raises_on_json_like_garbage(body: str) -> None:
    """Garbage in a block neither raises nor vanishes: the one block becomes exactly one
    call (with object arguments) or one error of a known kind, and none of it leaks into
    the content (the alphabet has no '<', so the body cannot close the block early)."""
    for text in (
        f"<tool_call>{body}</tool_call>",
        f'<tool_call>{{"name": "a", "arguments": {body}}}</tool_call>',
        f'<tool_call>{{"name": "a", "arguments": {json.dumps(body)}}}</tool_call>',
    ):
        turn = parse_assistant(text)
        assert turn.content == ""
        assert len(turn.tool_calls) + len(turn.errors) == 1
        assert all(isinstance(call.arguments, dict) and call.name for call in turn.tool_calls)
        assert all(error.kind in CALL_ERROR_KINDS and error.message for error in turn.errors)


@given(st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=4), st.data())
def test_never_raises_on_truncated_calls(arguments: dict, data: st.DataObject) -> None:
    text = HermesTemplate().render_assistant(Message("assistant", "", (ToolCall("tool", arguments),)))
    prefix = text[: data.draw(st.integers(0, len(text)))]
    turn = parse_assistant(prefix)
    if "<tool_call>" in prefix and "</tool_call>" not in prefix:
        assert [e.kind for e in turn.errors] == ["unclosed_tag"]


NAMES = st.text(min_size=1, max_size=20).filter(_free_of_special_tokens)
CALLS = st.builds(
    ToolCall,
    NAMES,
    st.dictionaries(st.text(max_size=8).filter(_free_of_special_tokens), JSON_VALUES, max_size=4).filter(
        lambda args: _free_of_special_tokens(json.dumps(args, ensure_ascii=False))
    ),
)
CONTENTS = st.text(max_size=40).map(str.strip).filter(_free_of_special_tokens)


@settings(max_examples=200)
@given(CONTENTS, st.lists(CALLS, max_size=3))
def test_render_then_parse_round_trip(content: str, calls: list[ToolCall]) -> None:
    text = HermesTemplate().render_assistant(Message("assistant", content, tuple(calls)))
    turn = parse_assistant(text, max_call_chars=10**6)
    assert turn.errors == ()
    assert turn.content == content
    assert turn.tool_calls == tuple(calls)


# --- other families' call syntaxes ----------------------------------------------------

LLAMA_STOPS = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")


def llama(text: str) -> object:
    return parse_assistant(text, syntax="llama3_json", stops=LLAMA_STOPS)


def test_llama3_json_call_with_parameters_and_python_tag() -> None:
    turn = llama('{"name": "calculator", "parameters": {"expression": "2+2"}}<|eot_id|>')
    assert (turn.content, turn.tool_calls, turn.errors) == ("", (ToolCall("calculator", {"expression": "2+2"}),), ())
    assert llama('<|python_tag|>{"name": "calculator", "arguments": {"expression": "2+2"}}<|eom_id|>').tool_calls == turn.tool_calls


def test_llama3_json_several_calls_and_plain_answers() -> None:
    turn = llama('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}')
    assert turn.tool_calls == (ToolCall("a", {"x": 1}), ToolCall("b", {}))
    answer = llama("The answer is {x}.<|eot_id|>junk")
    assert (answer.content, answer.tool_calls, answer.errors) == ("The answer is {x}.", (), ())


@pytest.mark.parametrize(
    ("text", "kind"),
    [('{"name": "a", "parameters": {"x": 1}', "bad_json"), ('{"parameters": {}}', "missing_name"), ('{"name": "a", "parameters": [1]}', "bad_arguments")],
)
def test_llama3_json_errors(text: str, kind: str) -> None:
    turn = llama(text)
    assert turn.tool_calls == () and [e.kind for e in turn.errors] == [kind]


MISTRAL_STOPS = ("</s>",)


def mistral(text: str) -> object:
    return parse_assistant(text, syntax="mistral", stops=MISTRAL_STOPS)


def test_mistral_json_array_keeps_ids() -> None:
    turn = mistral('Sure.[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcdef123"}, {"name": "b", "arguments": {}}]</s>')
    assert turn.content == "Sure."
    assert turn.tool_calls == (ToolCall("a", {"x": 1}, "abcdef123"), ToolCall("b", {}))


def test_mistral_v11_name_args_form() -> None:
    turn = mistral('[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[CALL_ID]zyxwvu987[ARGS]{}</s>')
    assert turn.tool_calls == (ToolCall("a", {"x": 1}), ToolCall("b", {}, "zyxwvu987"))


def test_mistral_errors() -> None:
    assert [e.kind for e in mistral("[TOOL_CALLS]not a call").errors] == ["bad_json"]
    assert [e.kind for e in mistral('[TOOL_CALLS][{"name": "a", "arguments": {}').errors] == ["bad_json"]
    assert [e.kind for e in mistral('[TOOL_CALLS][{"arguments": {}}]').errors] == ["missing_name"]


def test_reasoning_is_split_off_and_calls_inside_it_are_not_calls() -> None:
    text = f"<think>\nMaybe {CALL}?\n</think>\n\nI'll compute.\n{CALL}<|im_end|>"
    turn = parse_assistant(text, reasoning=True)
    assert turn.reasoning == f"Maybe {CALL}?"
    assert (turn.content, len(turn.tool_calls)) == ("I'll compute.", 1)
    # a </think> whose opener was in the prompt, and a turn cut while thinking
    opened_by_prompt = parse_assistant("plan</think>done", reasoning=True)
    assert (opened_by_prompt.reasoning, opened_by_prompt.content) == ("plan", "done")
    cut = parse_assistant(f"<think>still {CALL}", reasoning=True)
    assert (cut.reasoning, cut.content, cut.tool_calls) == (f"still {CALL}", "", ())
    # without reasoning the block is content and its call is a call
    assert len(parse_assistant(text).tool_calls) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list('{}[]":;, abx\n') + ["[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<think>", "</think>", '"name"']), max_size=40))
def test_other_syntaxes_never_raise(pieces: list[str]) -> None:
    text = "".join(pieces)
    for syntax in ("llama3_json", "mistral"):
        turn = parse_assistant(text, syntax=syntax, stops=(), reasoning=True)
        assert all(isinstance(e.message, str) and e.message for e in turn.errors)
