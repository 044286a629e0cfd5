"""Canonical JSON and SHA-256 digests: the one definition that the policy hash, the
argument digests and the audit hash chain share.

Canonical here means: keys sorted, no insignificant whitespace, ASCII only (non-ASCII
and lone surrogates become \\u escapes), so the same value always gives the same bytes
whatever produced it, and a verifier in another language can recompute a hash from
the JSON text alone.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

ZERO_HASH = "0" * 64


def canonical_json(value: Any) -> str:
    """`value` as canonical JSON text; TypeError/ValueError if it is not plain JSON."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def args_digest(arguments: Any) -> str:
    """SHA-256 of a call's canonical arguments, so the audit log proves which arguments
    were decided on without storing them (they may hold secrets).

    Never raises: arguments that are not plain JSON (only possible when a ToolCall is
    built in code, not decoded from model text) are digested through `repr`, and as a
    last resort by type name, because the audit record must still be written.
    """
    try:
        text = canonical_json(arguments)
    except (TypeError, ValueError, RecursionError):
        try:
            text = "repr:" + json.dumps(repr(arguments), ensure_ascii=True)
        except Exception:  # a hostile __repr__
            text = "unrepresentable:" + type(arguments).__name__
    return sha256_hex(text)
