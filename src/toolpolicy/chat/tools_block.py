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
does not change when a tool is added. `tools_template` puts the same rewriting in Jinja in
front of such a template, for the folder `toolpolicy export` writes: a server that renders
with it (vLLM, transformers) shows the model its tools as training did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolpolicy.chat.template import QWEN25_PREAMBLE, TOOLS_SLOT, render_call, to_json
from toolpolicy.chat.tokens import TOOL_CALL_END, TOOL_CALL_START, TOOL_RESPONSE_END, TOOL_RESPONSE_START
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
    becomes one user message of `<tool_response>` blocks. Pictures stay with the message
    that holds their text: a run's results' pictures, in order, are that user message's
    (rendered before its text, as any message's pictures).

    >>> from toolpolicy.types import ToolCall
    >>> call = Message("assistant", "", (ToolCall("add", {"a": 1}),))
    >>> [m.role for m in hermes_turns([Message("user", "1+?"), call, Message("tool", "1")], [])]
    ['user', 'assistant', 'user']
    """
    out: list[Message] = []
    if tools:
        has_system = bool(messages) and messages[0].role == "system"
        system = f"{messages[0].content}\n\n" if has_system else ""
        out.append(Message("system", system + tools_block(tools), images=messages[0].images if has_system else ()))
        messages = messages[1:] if has_system else messages
    previous = ""
    for message in messages:
        if message.role == "assistant" and message.tool_calls:
            text = "\n".join(([message.content] if message.content else []) + [render_call(c) for c in message.tool_calls])
            out.append(Message("assistant", text, reasoning=message.reasoning, images=message.images))
        elif message.role == "tool":
            response = f"{TOOL_RESPONSE_START}\n{message.content}\n{TOOL_RESPONSE_END}"
            if previous == "tool":  # a run of results is one user turn, as Qwen2.5 renders it
                out[-1] = Message("user", f"{out[-1].content}\n{response}", images=out[-1].images + message.images)
            else:
                out.append(Message("user", response, images=message.images))
        else:
            out.append(message)
        previous = message.role
    return out


def drops_tools(render_prompt: Callable[[Sequence[Message], Sequence[ToolSpec]], str]) -> bool:
    """Whether a template renders the same prompt with a tool as without: its model would
    never see the tools it is given."""
    opening = [Message("user", "Hi.")]
    return render_prompt(opening, [PROBE_TOOL]) == render_prompt(opening, [])


def tools_template(source: str) -> str:
    """The chat template `source` (one with no tools section) behind a Jinja prelude that does
    what `hermes_turns` does, so that a server given tools and OpenAI-shaped calls (vLLM's
    `--tool-call-parser hermes`, transformers' `apply_chat_template(tools=...)`) shows them to
    the model as training did: `toolpolicy export` writes it for a model trained with
    `chat_tools: system`. A conversation without tools, calls or tool results renders as
    `source` renders it. Call arguments given as a JSON string are pasted as they are."""
    head, tail = QWEN25_PREAMBLE.split(TOOLS_SLOT)
    call_start, call_end = f"{TOOL_CALL_START}\n", f"\n{TOOL_CALL_END}"
    prelude = f"""{{#- toolpolicy: the tools block and calls in the model's own turns (chat/tools_block.py) -#}}
{{%- set hermes = namespace(out=[], previous="", rest=messages) -%}}
{{%- if tools -%}}
  {{%- set listing = namespace(text="") -%}}
  {{%- for tool in tools -%}}
    {{%- set listing.text = listing.text ~ ("\\n" if not loop.first else "") ~ (tool | tojson) -%}}
  {{%- endfor -%}}
  {{%- set block = {to_json(head)} ~ listing.text ~ {to_json(tail)} -%}}
  {{%- if messages and messages[0].role == "system" -%}}
    {{%- set hermes.out = [{{"role": "system", "content": messages[0].content ~ "\\n\\n" ~ block}}] -%}}
    {{%- set hermes.rest = messages[1:] -%}}
  {{%- else -%}}
    {{%- set hermes.out = [{{"role": "system", "content": block}}] -%}}
  {{%- endif -%}}
{{%- endif -%}}
{{%- for message in hermes.rest -%}}
  {{%- if message.role == "assistant" and message.tool_calls -%}}
    {{%- set text = namespace(value=message.content or "") -%}}
    {{%- for call in message.tool_calls -%}}
      {{%- set function = call.function if call.function is defined else call -%}}
      {{%- set arguments = function.arguments if function.arguments is string else (function.arguments | tojson) -%}}
      {{%- set piece = {to_json(call_start)} ~ '{{"name": ' ~ (function.name | tojson) ~ ', "arguments": ' ~ arguments ~ '}}' ~ {to_json(call_end)} -%}}
      {{%- set text.value = (text.value ~ "\\n" ~ piece) if text.value else piece -%}}
    {{%- endfor -%}}
    {{%- set hermes.out = hermes.out + [{{"role": "assistant", "content": text.value}}] -%}}
  {{%- elif message.role == "tool" -%}}
    {{%- set response = {to_json(TOOL_RESPONSE_START + chr(10))} ~ message.content ~ {to_json(chr(10) + TOOL_RESPONSE_END)} -%}}
    {{%- if hermes.previous == "tool" -%}}
      {{%- set hermes.out = hermes.out[:-1] + [{{"role": "user", "content": hermes.out[-1].content ~ "\\n" ~ response}}] -%}}
    {{%- else -%}}
      {{%- set hermes.out = hermes.out + [{{"role": "user", "content": response}}] -%}}
    {{%- endif -%}}
  {{%- else -%}}
    {{%- set hermes.out = hermes.out + [message] -%}}
  {{%- endif -%}}
  {{%- set hermes.previous = message.role -%}}
{{%- endfor -%}}
{{%- set messages = hermes.out -%}}
{{%- set tools = none -%}}
"""
    return prelude + source


def served_template(tokenizer: Any) -> str | None:
    """`tools_template` of the tokenizer's chat template when that template drops tools (a
    server would never show them to the model); None when it shows them or there is none."""
    source = tokenizer.chat_template
    if not isinstance(source, str) or not source:
        return None

    def render(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> str:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        schemas = [spec.to_openai() for spec in tools] or None
        return tokenizer.apply_chat_template(chat, tools=schemas, tokenize=False, add_generation_prompt=True)

    return tools_template(source) if drops_tools(render) else None
