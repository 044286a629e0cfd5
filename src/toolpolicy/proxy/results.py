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
blob), the structured content's values joined and as JSON, and all its strings, each of
these read in every spelling `gate/canonical.py` opens (`readings`: invisible characters
removed, look-alikes of any script and numerals as ASCII, escapes, hex and base64 decoded,
layer after layer). A secret that appears in any of them was split or encoded to pass
redaction: the whole result is withheld, and the error says where the secret was found,
never the secret. An upstream's error message is judged the same way (`failed_on`), and
with a SessionStream (stream.py) so is what a result adds to what the session carried
before, so a secret split across results is withheld too. Compressed payloads (gzip, a
PNG's zTXt chunk) are not opened.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterator
from typing import Any

import mcp_types as types
from pydantic import ValidationError

from toolpolicy.gate import Decision
from toolpolicy.gate.canonical import TooDeep, readings
from toolpolicy.proxy.stream import SessionStream

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
    result: types.CallToolResult,
    redact: Callable[[str], str],
    decision: Decision,
    max_bytes: int,
    stream: SessionStream | None = None,
) -> types.CallToolResult:
    """The result the client gets: the upstream's, redacted and with the decision in
    `_meta`; an error result if its text is over `max_bytes`, if it shows a secret once
    assembled (alone, or after what `stream` carried before), or if redaction broke it."""
    data = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    size = text_bytes(data)
    if size > max_bytes:
        return error_result(
            f"The tool's result was not passed on: it holds {size:,} bytes of text, over the proxy's limit of "
            f"{max_bytes:,} bytes (--max-result-bytes).",
            decision,
        )
    clean = redact_value(data, redact)
    hidden = hidden_secret(clean, redact) or _completed_secret(clean, redact, stream)
    if hidden is not None:
        return error_result(
            f"The tool's result was not passed on: a secret the policy redacts appears in {hidden}, split or encoded "
            "so that no single string of the result shows it.",
            decision,
        )
    if stream is not None:
        stream.carry("text", _texts(clean))
        stream.carry("strings", strings_of(clean))
    meta = {**clean.get("_meta", {}), META_KEY: decision_meta(decision)}
    if clean == data:  # nothing to redact (the usual case): no need to rebuild the result
        return result.model_copy(update={"meta": meta})
    try:
        return types.CallToolResult.model_validate({**clean, "_meta": meta})
    except ValidationError:  # a pattern matched part of the result's structure, such as a block type
        return error_result("The tool's result was not passed on: it is malformed once secrets are redacted.", decision)


def hidden_secret(data: dict[str, Any], redact: Callable[[str], str]) -> str | None:
    """Where a secret shows in what a client assembles from the redacted result `data`
    (`assembled`, each read in every spelling `readings` opens), or None. `redact` finds a
    secret where it changes the text."""
    for where, text in assembled(data):
        found = shown_secret(where, text, redact)
        if found is not None:
            return found
    return None


def shown_secret(where: str, text: str, redact: Callable[[str], str]) -> str | None:
    """`where`, told how `text` was read to show a secret `redact` replaces, or None."""
    try:
        for depth, reading in enumerate(readings(text)):
            if redact(reading) != reading:
                return where if depth == 0 and reading == text else f"{where} ({_how(depth)})"
    except TooDeep:
        return f"{where} (encoded more deeply than the proxy reads)"
    return None


def _how(depth: int) -> str:
    return "its look-alike and invisible characters read as plain text" if depth == 0 else f"{depth} layers of encoding opened"


def _completed_secret(data: dict[str, Any], redact: Callable[[str], str], stream: SessionStream | None) -> str | None:
    """Where the result `data` completes a secret begun in what the session carried before, or None."""
    if stream is None:
        return None
    for channel, where, pieces in (("text", "the result's text", _texts(data)), ("strings", "the result's strings", strings_of(data))):
        how = stream.completes_secret(channel, list(pieces), redact)
        if how is not None:
            return f"{where} {how}"
    return None


def failed_on(text: str, redact: Callable[[str], str], decision: Decision | None, stream: SessionStream | None) -> types.CallToolResult:
    """The error result that tells the client of the upstream's failure `text`: redacted, and
    withheld as a result is when it shows a secret split or encoded (alone or after what
    `stream` carried before)."""
    clean = redact(text)
    hidden = shown_secret("the MCP server's error message", clean, redact)
    if hidden is None and stream is not None:
        how = stream.completes_secret("text", [clean], redact)
        hidden = None if how is None else f"the MCP server's error message {how}"
    if hidden is not None:
        return error_result(
            f"The tool failed, and its error message was not passed on: a secret the policy redacts appears in {hidden}, "
            "split or encoded.",
            decision,
        )
    if stream is not None:
        stream.carry("text", [clean])
    return error_result(clean, decision)


def error_text(text: str, redact: Callable[[str], str]) -> str:
    """An upstream's error `text` as the client may read it: redacted, or, when it shows a
    secret split or encoded, a note that it was withheld."""
    clean = redact(text)
    if shown_secret("the MCP server's error message", clean, redact) is None:
        return clean
    return "its error message was withheld: a secret the policy redacts appears in it, split or encoded"


def assembled(data: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, text) for each text a client may put together from the result `data` (as JSON):
    its text blocks joined, its payloads decoded, its structured content, all its strings."""
    texts = list(_texts(data))
    if len(texts) > 1:
        yield "the result's text blocks joined", "".join(texts)
        yield "the result's text blocks joined by line ends", "\n".join(texts)
    payloads = {}
    for number, block in enumerate(data.get("content") or [], 1):
        payload = _block_payload(block)
        if payload is not None:
            payloads[payload] = f"content block {number}'s data decoded from base64"
    for payload, where in payloads.items():
        yield where, _base64_text(payload) or ""
    structured = data.get("structuredContent")
    if structured is not None:
        yield "the structured content's values joined", "".join(strings_of(structured, keys=False))
        yield "the structured content as JSON", json.dumps(structured, ensure_ascii=False)
    yield "the result's strings", "\n".join(text for text in strings_of(data) if text not in payloads)


def _texts(data: dict[str, Any]) -> Iterator[str]:
    """The text a client reads of a result: its text blocks' and embedded text resources'."""
    return (text for text in map(_block_text, data.get("content") or []) if isinstance(text, str))


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
    """The bytes `text` encodes in base64 (either alphabet) as text (UTF-8, NUL bytes dropped,
    what is not UTF-8 as U+FFFD); None if it is not base64."""
    try:
        raw = base64.b64decode(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.replace(b"\0", b"").decode("utf-8", "replace")


def strings_of(value: Any, keys: bool = True) -> Iterator[str]:
    """Every string of a JSON value, depth first, each key (unless `keys` is False) before its value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings_of(item, keys)
    elif isinstance(value, dict):
        for key, item in value.items():
            if keys:
                yield key
            yield from strings_of(item, keys)


def error_result(text: str, decision: Decision | None = None) -> types.CallToolResult:
    meta = {META_KEY: decision_meta(decision)} if decision is not None else None
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True, meta=meta)


def decision_meta(decision: Decision) -> dict[str, Any]:
    """The decision as the client sees it; `decision_id` finds its audit record."""
    return {"effect": decision.effect, "rule_ids": list(decision.rule_ids), "decision_id": decision.decision_id}
