"""Tools for a chat template that has no tools section: a Hermes block in the model's own turns.

SmolLM2's template (plain ChatML) and Gemma 3's render a conversation the same way with
or without tools: a model loaded with either never sees what it may call. `chat_tools:
system` gives such a model the tools the way Qwen2.5's template does, on the model's own
turns: the tools block (Qwen2.5's wording, one JSON schema a line) appended to the system
message, each call written as `<tool_call>` JSON after the assistant's text, and each run
of tool results as one user turn of `<tool_response>` blocks. `hermes_turns` rewrites the
messages; the model's own template then renders them with no `tools` argument, so its
turn framing, special tokens and default texts stay its own.

`drops_tools` is the check that makes the silent case an error: a template whose prompt
does not change when a tool is added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from toolpolicy.chat.template import QWEN25_PREAMBLE, TOOLS_SLOT, render_call, to_json
from toolpolicy.chat.tokens import TOOL_RESPONSE_END, TOOL_RESPONSE_START
from toolpolicy.types import Message, ToolSpec

PROBE_TOOL = ToolSpec("lookup", "Look a key up.", {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})
"""The tool `drops_tools` renders a prompt with."""


def tools_block(tools: Sequence[ToolSpec]) -> str:
    """Qwen2.5's tools preamble listing `tools`, one OpenAI JSON schema a line."""
    return QWEN25_PREAMBLE.replace(TOOLS_SLOT, "\n".join(to_json(spec.to_openai()) for spec in tools))


def hermes_turns(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[Message]:
    """`messages` with the tools and calls written into plain turns, for a template that renders
    neither: the tools block ends the system message (one is opened when there is none), an
    assistant's calls follow its text as `<tool_call>` blocks, and each run of tool messages
    becomes one user message of `<tool_response>` blocks.

    >>> from toolpolicy.types import ToolCall
    >>> call = Message("assistant", "", (ToolCall("add", {"a": 1}),))
    >>> [m.role for m in hermes_turns([Message("user", "1+?"), call, Message("tool", "1")], [])]
    ['user', 'assistant', 'user']
    """
    out: list[Message] = []
    if tools:
        has_system = bool(messages) and messages[0].role == "system"
        system = f"{messages[0].content}\n\n" if has_system else ""
        out.append(Message("system", system + tools_block(tools)))
        messages = messages[1:] if has_system else messages
    previous = ""
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            text = "\n".join(([message.content] if message.content else []) + [render_call(c) for c in message.tool_calls])
            out.append(Message("assistant", text, reasoning=message.reasoning))
        elif message.role == "tool":
            response = f"{TOOL_RESPONSE_START}\n{message.content}\n{TOOL_RESPONSE_END}"
            if previous == "tool":  # a run of results is one user turn, as Qwen2.5 renders it
                out[-1] = Message("user", f"{out[-1].content}\n{response}")
            else:
                out.append(Message("user", response))
        else:
            out.append(message)
        previous = message.role
    return out


def drops_tools(render_prompt: Callable[[Sequence[Message], Sequence[ToolSpec]], str]) -> bool:
    """Whether a template renders the same prompt with a tool as without: its model would
    never see the tools it is given."""
    opening = [Message("user", "Hi.")]
    return render_prompt(opening, [PROBE_TOOL]) == render_prompt(opening, [])
