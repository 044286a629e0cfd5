"""ChatML + Hermes tool-call rendering, byte-compatible with Qwen2.5's chat template.

A real Qwen2.5 checkpoint and the project's tiny embedded model read the same text,
so one parser and one rollout engine serve both. The template renders whole
conversations (`render`) and, for the rollout engine, the three fragments a turn loop
needs: the prompt, one generated assistant message, and the observation that follows
it. They concatenate to exactly the whole rendering (see `HermesTemplate`), which is
what lets the engine tokenize only new fragments and keep sampled ids untouched.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from toolpolicy.chat.images import ImageSpan, image_text
from toolpolicy.chat.parser import CHATML_STOPS, ParsedTurn, parse_assistant
from toolpolicy.chat.tokens import IM_END, IM_START, TOOL_CALL_END, TOOL_CALL_START, TOOL_RESPONSE_END, TOOL_RESPONSE_START
from toolpolicy.types import Message, ToolCall, ToolSpec

GENERATION_PROMPT = f"{IM_START}assistant\n"
TOOLS_SLOT = "{tools}"

QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Qwen2.5's wording, word for word. `{tools}` is filled with one compact JSON object per
# tool, one per line; the slot is filled with str.replace, so the other braces are literal.
QWEN25_PREAMBLE = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

# For a tiny model trained from scratch on CPU, where every prompt token costs.
COMPACT_PREAMBLE = (
    '# Tools\n<tools>\n{tools}\n</tools>\nCall a tool with <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'
)


def to_json(value: object) -> str:
    """JSON exactly as transformers' `tojson` Jinja filter writes it (non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def render_call(call: ToolCall) -> str:
    # Qwen2.5 pastes the name in raw; we JSON-escape it, which is the same text for
    # every name without quotes, backslashes or control characters, and keeps the
    # block valid JSON for the names that have them.
    return f'{TOOL_CALL_START}\n{{"name": {to_json(call.name)}, "arguments": {to_json(call.arguments)}}}\n{TOOL_CALL_END}'


def _brief(spec: ToolSpec) -> str:
    """One line per tool: `calculator(expression: string) - Evaluate ...`."""
    properties = spec.parameters.get("properties", {})
    params = ", ".join(f"{name}: {schema.get('type', 'any')}" for name, schema in properties.items())
    return f"{spec.name}({params}) - {spec.description}"


# The same line in Jinja, for tokenizer_config.json.
_BRIEF_JINJA = (
    "{{- tool.function.name + '(' }}"
    "{%- for name, schema in tool.function.parameters.properties.items() %}"
    "{{- (', ' if not loop.first else '') + name + ': ' + (schema.type if schema.type is defined else 'any') }}"
    "{%- endfor %}"
    "{{- ') - ' + tool.function.description }}"
)


def _jinja_literal(text: str) -> str:
    """A Jinja string literal for `text`: Jinja unescapes \\n, \\" and \\uXXXX like JSON."""
    return json.dumps(text, ensure_ascii=False)


class ChatTemplate(Protocol):
    """What the rollout engine needs of a chat format: the prompt, each assistant message
    as the model writes it, the observation after a sampled turn, and the parser of a
    generated turn. `HermesTemplate` (ChatML in Python) and `JinjaTemplate` (a
    checkpoint's own template) are the two kinds."""

    end_of_turn: str
    stops: tuple[str, ...]

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> str: ...
    def render_assistant(self, message: Message) -> str: ...
    def render_observation(self, messages: Sequence[Message], after: Message | None = None) -> str: ...
    def parse(self, text: str, max_call_chars: int) -> ParsedTurn: ...


@dataclass(frozen=True)
class HermesTemplate:
    """ChatML messages with Hermes `<tool_call>` JSON, as Qwen2.5 renders them.

    The default instance is Qwen2.5-Instruct's template byte for byte (with the one
    documented exception of JSON-escaped tool names in `_render_call`). For a tiny
    model, `HermesTemplate.compact()` drops the default system prompt and shortens the
    tools preamble.

    Fragment invariant, for a conversation `prefix, a1, obs1, a2, ..., an` where each
    `a` is one assistant message and each `obs` a non-empty run of tool/user messages:

        render_prompt(prefix, tools) + render_assistant(a1) + render_observation(obs1)
        + ... + render_assistant(an) + "\\n" == render(prefix + [a1, *obs1, ..., an], tools)

    and with a trailing observation the sum ends in the generation prompt and equals
    `render_prompt` of the whole conversation.
    """

    tools_preamble: str = QWEN25_PREAMBLE
    """Text appended to the system message when tools are given; holds one `{tools}` slot."""
    default_system: str = QWEN25_DEFAULT_SYSTEM
    """System text used when the conversation has no system message; "" renders none."""
    brief_tools: bool = False
    """List each tool as one line `name(arg: type, ...) - description` instead of its JSON
    schema: a fraction of the tokens, for a tiny model whose every prompt token costs."""
    image_span: ImageSpan | None = None
    """How the model's text stands for a picture (a vision-language model's); None: the model
    reads no pictures, and a message with one is an error."""

    def __post_init__(self) -> None:
        if self.tools_preamble.count(TOOLS_SLOT) != 1:
            raise ValueError(f"tools_preamble must contain exactly one {TOOLS_SLOT} slot")

    @classmethod
    def compact(cls) -> HermesTemplate:
        """The short variant for the embedded model: no default system text, short preamble."""
        return cls(tools_preamble=COMPACT_PREAMBLE, default_system="", brief_tools=True)

    end_of_turn: ClassVar[str] = IM_END
    """The token that ends every assistant message the template renders."""
    stops: ClassVar[tuple[str, ...]] = CHATML_STOPS
    """The strings that end a generated turn."""

    def parse(self, text: str, max_call_chars: int) -> ParsedTurn:
        """Content, calls and errors of one generated turn (Hermes calls, ChatML stops)."""
        return parse_assistant(text, max_call_chars=max_call_chars)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), add_generation_prompt: bool = False) -> str:
        """The whole conversation as the model reads it."""
        has_system = bool(messages) and messages[0].role == "system"
        turns = messages[1:] if has_system else messages
        system = self._render_system(image_text(self.image_span, messages[0]) + messages[0].content if has_system else None, tools)
        return system + self._render_turns(turns) + (GENERATION_PROMPT if add_generation_prompt else "")

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> str:
        """The conversation so far, ending where the model starts generating."""
        return self.render(messages, tools, add_generation_prompt=True)

    def render_assistant(self, message: Message) -> str:
        """Exactly what the model generates for `message`, ending with the stop string.

        Qwen2.5 writes `<|im_start|>assistant` + "\\n" + content before the calls, each call
        on a new line; with no content, the newline of the generation prompt is the one
        before the first call.
        """
        lines = ([message.content] if message.content else []) + [render_call(c) for c in message.tool_calls]
        return "\n".join(lines) + IM_END

    def render_observation(self, messages: Sequence[Message], after: Message | None = None) -> str:
        """What follows a generated assistant message (`after`, which ChatML's framing does
        not depend on): its newline, the tool/user turns, and the next generation prompt.
        Assistant messages are generated, never observed."""
        if any(m.role == "assistant" for m in messages):
            raise ValueError("an observation holds tool, user or system messages; render assistant text with render_assistant")
        return "\n" + self._render_turns(messages) + GENERATION_PROMPT

    def _render_system(self, system: str | None, tools: Sequence[ToolSpec]) -> str:
        """The system turn: the conversation's own text (or the default), then the tools preamble."""
        if system is None:
            system = self.default_system or None
        if tools:
            listing = "\n".join(_brief(spec) if self.brief_tools else to_json(spec.to_openai()) for spec in tools)
            preamble = self.tools_preamble.replace(TOOLS_SLOT, listing)
            system = preamble if system is None else f"{system}\n\n{preamble}"
        return "" if system is None else f"{IM_START}system\n{system}{IM_END}\n"

    def _render_turns(self, messages: Sequence[Message]) -> str:
        """Every message after the first system one. A run of tool messages is one user turn."""
        out: list[str] = []
        for i, message in enumerate(messages):
            if message.role == "assistant":
                out.append(GENERATION_PROMPT + self.render_assistant(message) + "\n")
            elif message.role == "tool":
                if i == 0 or messages[i - 1].role != "tool":
                    out.append(f"{IM_START}user")
                out.append(f"\n{TOOL_RESPONSE_START}\n{image_text(self.image_span, message)}{message.content}\n{TOOL_RESPONSE_END}")
                if i == len(messages) - 1 or messages[i + 1].role != "tool":
                    out.append(f"{IM_END}\n")
            else:
                out.append(f"{IM_START}{message.role}\n{image_text(self.image_span, message)}{message.content}{IM_END}\n")
        return "".join(out)

    def jinja_template(self) -> str:
        """A Jinja chat template (for tokenizer_config.json) that renders like `render`.

        It takes `messages` as `Message.to_dict()` dicts or OpenAI-style dicts (tool
        calls as {"name", "arguments"} or {"type": "function", "function": {...}},
        arguments as an object or a JSON string) and `tools` as `ToolSpec.to_openai()`.
        """
        head, tail = self.tools_preamble.split(TOOLS_SLOT)
        default = self.default_system
        fills = {
            "@PREAMBLE_HEAD@": _jinja_literal(head),
            "@PREAMBLE_TAIL@": _jinja_literal(tail),
            "@DEFAULT_WITH_TOOLS@": _jinja_literal(default + "\n\n" if default else ""),
            "@DEFAULT_SYSTEM_TURN@": _jinja_literal(f"{IM_START}system\n{default}{IM_END}\n" if default else ""),
            "@TOOL_LISTING@": _BRIEF_JINJA if self.brief_tools else "{{- tool | tojson }}",
        }
        # One pass, so a slot name inside the preamble text is not filled again.
        return re.sub(r"@[A-Z_]+@", lambda match: fills[match.group()], _JINJA_TEMPLATE)


# Qwen2.5's template with its default system text and preamble made into slots (filled
# by `HermesTemplate.jinja_template`), string tool-call arguments accepted, and tool
# names JSON-escaped. Every tag starts with "-" so no template whitespace leaks out.
_JINJA_TEMPLATE = """\
{%- set has_system = messages and messages[0].role == 'system' %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if has_system %}
        {{- messages[0].content + '\\n\\n' }}
    {%- else %}
        {{- @DEFAULT_WITH_TOOLS@ }}
    {%- endif %}
    {{- @PREAMBLE_HEAD@ }}
    {%- for tool in tools %}
        {%- if not loop.first %}
            {{- '\\n' }}
        {%- endif %}
        @TOOL_LISTING@
    {%- endfor %}
    {{- @PREAMBLE_TAIL@ + '<|im_end|>\\n' }}
{%- elif has_system %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- else %}
    {{- @DEFAULT_SYSTEM_TURN@ }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": ' + (tool_call.name | tojson) + ', "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
