"""Chat layer: render conversations in a model's chat format and parse tool calls back out.

`HermesTemplate` is ChatML with Hermes calls in Python (the embedded model's format and
Qwen2.5's); `JinjaTemplate` is any checkpoint's own Jinja template; both are a
`ChatTemplate`. `CALL_SYNTAXES` are the tool-call parsers by name.
"""

from toolpolicy.chat.jinja import ChatFormatError, JinjaTemplate, detect_syntax
from toolpolicy.chat.parser import CALL_SYNTAXES, CHATML_STOPS, ParsedTurn, cut_at_stop, parse_assistant
from toolpolicy.chat.template import (
    COMPACT_PREAMBLE,
    GENERATION_PROMPT,
    QWEN25_DEFAULT_SYSTEM,
    QWEN25_PREAMBLE,
    ChatTemplate,
    HermesTemplate,
)
from toolpolicy.chat.tokens import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    SPECIAL_TOKENS,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOL_RESPONSE_END,
    TOOL_RESPONSE_START,
)

__all__ = [
    "CALL_SYNTAXES",
    "CHATML_STOPS",
    "COMPACT_PREAMBLE",
    "ENDOFTEXT",
    "GENERATION_PROMPT",
    "IM_END",
    "IM_START",
    "QWEN25_DEFAULT_SYSTEM",
    "QWEN25_PREAMBLE",
    "SPECIAL_TOKENS",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "TOOL_RESPONSE_END",
    "TOOL_RESPONSE_START",
    "ChatFormatError",
    "ChatTemplate",
    "HermesTemplate",
    "JinjaTemplate",
    "ParsedTurn",
    "cut_at_stop",
    "detect_syntax",
    "parse_assistant",
]
