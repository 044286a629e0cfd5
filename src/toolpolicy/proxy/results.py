"""What the proxy passes back from a tools/call: the upstream result, size-capped and with
every string it carries redacted, or an error result saying why not.

Secrets can hide anywhere a result has text: text blocks, embedded resources, resource
links (uri, name, title, description), `_meta` of the result or of a block (keys too),
the structured content. So redaction walks the whole result as JSON instead of a list
of known fields, and a field a later MCP revision adds is covered the day it appears.
The size is checked first, because redaction runs one regex pass per pattern over
every string.

A client does not read each string alone, and neither does the model behind it: it
joins a result's text blocks, decodes an image, reads JSON. So the redacted result is
judged again as the client will assemble it (`assembled`): its text blocks joined (with
nothing and with line ends between them), each base64 payload decoded (image, audio,
blob), the structured content's values joined and as JSON, and each of these and every
string also with base64 runs and %-escapes decoded and with Unicode folded (NFKC, format
characters such as zero-width spaces removed). A secret that appears in any of them was
split or encoded to pass redaction: the whole result is withheld, and the error says
where the secret was found, never the secret. Compressed payloads (gzip, a PNG's zTXt
chunk) are not opened.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import sys
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

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
    hidden = hidden_secret(clean, redact)
    if hidden is not None:
        return error_result(
            f"The tool's result was not passed on: a secret the policy redacts appears in {hidden}, split or encoded "
            "so that no single string of the result shows it.",
            decision,
        )
    meta = {**clean.get("_meta", {}), META_KEY: decision_meta(decision)}
    if clean == data:  # nothing to redact (the usual case): no need to rebuild the result
        return result.model_copy(update={"meta": meta})
    try:
        return types.CallToolResult.model_validate({**clean, "_meta": meta})
    except ValidationError:  # a pattern matched part of the result's structure, such as a block type
        return error_result("The tool's result was not passed on: it is malformed once secrets are redacted.", decision)


BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
"""A run that may be base64 (standard or URL-safe alphabet) hiding a secret inside a text."""


def hidden_secret(data: dict[str, Any], redact: Callable[[str], str]) -> str | None:
    """Where a secret shows in what a client assembles from the redacted result `data`
    (`assembled`), or None. `redact` finds a secret where it changes the text."""
    for where, text in assembled(data):
        if redact(text) != text:
            return where
    return None


def assembled(data: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, text) for each text a client may put together from the result `data` (as JSON)
    that is not one of its strings as it stands (those were redacted one by one)."""
    blocks = data.get("content") or []
    texts = [text for text in map(_block_text, blocks) if text is not None]
    if len(texts) > 1:
        yield from _readings("the result's text blocks joined", "".join(texts))
        yield from _readings("the result's text blocks joined by line ends", "\n".join(texts))
    payloads = {}
    for number, block in enumerate(blocks, 1):
        payload = _block_payload(block)
        if payload is not None:
            payloads[payload] = f"content block {number}'s data decoded from base64"
    for payload, where in payloads.items():
        yield where, _base64_text(payload) or ""
    structured = data.get("structuredContent")
    if structured is not None:
        yield from _readings("the structured content's values joined", "".join(_strings(structured, keys=False)))
        yield from _readings("the structured content as JSON", json.dumps(structured, ensure_ascii=False))
    for number, text in enumerate(_strings(data), 1):
        if text not in payloads:
            yield from _readings(f"string {number} of the result", text, itself=False)


def _readings(where: str, text: str, itself: bool = True) -> Iterator[tuple[str, str]]:
    """`text` (unless not `itself`), with its base64 runs and %-escapes decoded, and folded."""
    if itself:
        yield where, text
    for run in BASE64_RUN.findall(text):
        decoded = _base64_text(run)
        if decoded:
            yield f"{where} (a base64 run decoded)", decoded
    if "%" in text:
        yield f"{where} (%-escapes decoded)", unquote(text)
    if not text.isascii():  # NFKC leaves ASCII as it is, and no format character is ASCII
        yield f"{where} (Unicode folded)", _format_characters().sub("", unicodedata.normalize("NFKC", text))


@functools.cache
def _format_characters() -> re.Pattern[str]:
    """Unicode's format characters (category Cf: zero-width spaces and joiners, direction
    marks, the byte order mark...), invisible in a text a person or a model reads."""
    found = [chr(point) for point in range(0x80, sys.maxunicode + 1) if unicodedata.category(chr(point)) == "Cf"]
    return re.compile("[" + "".join(map(re.escape, found)) + "]")


def _block_text(block: Any) -> str | None:
    """The text a content block shows: a text block's, or an embedded text resource's."""
    if not isinstance(block, dict):
        return None
    if block.get("type") == "text":
        return block.get("text")
    resource = block.get("resource")
    return resource.get("text") if block.get("type") == "resource" and isinstance(resource, dict) else None


def _block_payload(block: Any) -> str | None:
    """The base64 payload of a content block: an image's or audio's data, an embedded blob."""
    if not isinstance(block, dict):
        return None
    if isinstance(block.get("data"), str):
        return block["data"]
    resource = block.get("resource")
    return resource.get("blob") if isinstance(resource, dict) and isinstance(resource.get("blob"), str) else None


def _base64_text(text: str) -> str | None:
    """The bytes `text` encodes in base64 (either alphabet), one character per byte; None if it is not base64."""
    try:
        raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.decode("latin-1")


def _strings(value: Any, keys: bool = True) -> Iterator[str]:
    """Every string of a JSON value, depth first, each key (unless `keys` is False) before its value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, keys)
    elif isinstance(value, dict):
        for key, item in value.items():
            if keys:
                yield key
            yield from _strings(item, keys)


def error_result(text: str, decision: Decision | None = None) -> types.CallToolResult:
    meta = {META_KEY: decision_meta(decision)} if decision is not None else None
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, meta=meta)


def decision_meta(decision: Decision) -> dict[str, Any]:
    """The decision as the client sees it; `decision_id` finds its audit record."""
    return {"effect": decision.effect, "rule_ids": list(decision.rule_ids), "decision_id": decision.decision_id}
