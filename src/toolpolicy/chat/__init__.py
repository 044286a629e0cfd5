"""Chat layer: render messages in the ChatML + Hermes format and parse tool calls back out."""

from toolpolicy.chat.parser import ParsedTurn, parse_assistant
from toolpolicy.chat.template import (
    COMPACT_PREAMBLE,
    ENDOFTEXT,
    GENERATION_PROMPT,
    IM_END,
    IM_START,
    QWEN25_DEFAULT_SYSTEM,
    QWEN25_PREAMBLE,
    SPECIAL_TOKENS,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TOOL_RESPONSE_END,
    TOOL_RESPONSE_START,
    HermesTemplate,
)

__all__ = [
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
    "HermesTemplate",
    "ParsedTurn",
    "parse_assistant",
]
