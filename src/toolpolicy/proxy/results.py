"""What the proxy passes back from a tools/call: the upstream result, size-capped and with
every string it carries redacted, or an error result saying why not.

Secrets can hide anywhere a result has text: text blocks, embedded resources, resource
links (uri, name, title, description), `_meta` of the result or of a block (keys too),
the structured content. So redaction walks the whole result as JSON instead of a list
of known fields, and a field a later MCP revision adds is covered the day it appears.
The size is checked first, because redaction runs one regex pass per pattern over
every string.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from toolpolicy.gate import Decision

META_KEY = "toolpolicy/decision"
"""Where every result carries the decision: effect, rule ids and the audit record's id."""


def json_bytes(value: Any) -> int:
    """The UTF-8 size of `value` as compact JSON (the size of a call's arguments)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def text_bytes(value: Any) -> int:
    """The UTF-8 size of every string in a JSON value, keys included."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, list):
        return sum(text_bytes(item) for item in value)
    if isinstance(value, dict):
        return sum(text_bytes(key) + text_bytes(item) for key, item in value.items())
    return 0


def redact_value(value: Any, redact: Callable[[str], str]) -> Any:
    """`value` with `redact` applied to every string in it, keys included."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [redact_value(item, redact) for item in value]
    if isinstance(value, dict):
        return {redact(key): redact_value(item, redact) for key, item in value.items()}
    return value


def passed_on(
    result: types.CallToolResult, redact: Callable[[str], str], decision: Decision, max_bytes: int
) -> types.CallToolResult:
    """The result the client gets: the upstream's, redacted and with the decision in
    `_meta`; an error result if its text is over `max_bytes` or redaction broke it."""
    data = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    size = text_bytes(data)
    if size > max_bytes:
        return error_result(
            f"The tool's result was not passed on: it holds {size:,} bytes of text, over the proxy's limit of "
            f"{max_bytes:,} bytes (--max-result-bytes).",
            decision,
        )
    clean = redact_value(data, redact)
    meta = {**clean.get("_meta", {}), META_KEY: decision_meta(decision)}
    if clean == data:  # nothing to redact (the usual case): no need to rebuild the result
        return result.model_copy(update={"meta": meta})
    try:
        return types.CallToolResult.model_validate({**clean, "_meta": meta})
    except ValidationError:  # a pattern matched part of the result's structure, such as a block type
        return error_result("The tool's result was not passed on: it is malformed once secrets are redacted.", decision)


def error_result(text: str, decision: Decision | None = None) -> types.CallToolResult:
    meta = {META_KEY: decision_meta(decision)} if decision is not None else None
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, meta=meta)


def decision_meta(decision: Decision) -> dict[str, Any]:
    """The decision as the client sees it; `decision_id` finds its audit record."""
    return {"effect": decision.effect, "rule_ids": list(decision.rule_ids), "decision_id": decision.decision_id}
