"""Tool names a model could mistake for another: the proxy refuses them.

A model picks a tool by its name, and so does a policy rule. A server that offers
`аdd` (Cyrillic а) next to, or instead of, the `add` a rule permits, or `add` with a
zero-width space, or `ＡＤＤ` in fullwidth letters, invites the model to call a tool
nobody approved under a name that reads like one somebody did. Two checks:

1. A name must be a plain ASCII identifier as MCP recommends (SEP-986: letters,
   digits, `_`, `-`, `.`, 1 to 128 characters). This alone refuses every homoglyph,
   invisible and bidirectional-control trick.
2. Its skeleton must not collide with another tool's or a policy name's. The skeleton
   follows Unicode TR39's idea (https://www.unicode.org/reports/tr39/#Confusable_Detection)
   with a small table instead of the full confusables data: NFKC (folds fullwidth and
   other compatibility forms), zero-width and bidi controls removed, case folded, and
   the Cyrillic and Greek letters that look like Latin ones mapped to them. Among
   ASCII names this catches `add` vs `ADD`; the table makes the warning say what a
   refused non-ASCII name imitates.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from toolpolicy.gate.ledger import MAX_TOOL_NAME_CHARS

TOOL_NAME = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_TOOL_NAME_CHARS}}}")
"""A plain tool name, MCP's (2025-11-25 specification, Tools: 1 to 128 characters of ASCII
letters, digits, `_`, `-` and `.`); the gate's cap on a name's length is the same bound."""

# Format characters that render as nothing or reorder text: zero-width space, joiners,
# word joiner, BOM, soft hyphen, and the bidirectional embeddings, overrides and isolates.
INVISIBLE = frozenset("\u00ad\u180e\u200b\u200c\u200d\u2060\ufeff\u200e\u200f\u061c") | frozenset(
    chr(code) for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))
)

# Cyrillic and Greek letters that, case folded, look like a Latin letter (capitals fold
# first, so Cyrillic "\u041d" is found as "\u043d" and maps to the "h" it looks like).
LOOKALIKES = str.maketrans(
    {
        # Cyrillic
        "\u0430": "a", "\u0432": "b", "\u0441": "c", "\u0501": "d", "\u0435": "e", "\u0451": "e", "\u04bb": "h",
        "\u043d": "h", "\u0456": "i", "\u0457": "i", "\u0458": "j", "\u043a": "k", "\u04cf": "l", "\u043c": "m",
        "\u043e": "o", "\u0440": "p", "\u051b": "q", "\u0455": "s", "\u0442": "t", "\u0475": "v", "\u051d": "w",
        "\u0445": "x", "\u0443": "y",
        # Greek
        "\u03b1": "a", "\u03b2": "b", "\u03f2": "c", "\u03b5": "e", "\u03b7": "h", "\u03b9": "i", "\u03ba": "k",
        "\u03bd": "v", "\u03bf": "o", "\u03c1": "p", "\u03c4": "t", "\u03c5": "u", "\u03c7": "x", "\u03b3": "y",
        "\u03b6": "z", "\u03c9": "w",
    }
)


def skeleton(name: str) -> str:
    """The form two names share when a reader could not tell them apart."""
    folded = unicodedata.normalize("NFKC", name)
    visible = "".join(ch for ch in folded if ch not in INVISIBLE)
    return unicodedata.normalize("NFKC", visible.casefold()).translate(LOOKALIKES)


@dataclass(frozen=True)
class RefusedName:
    """A tool the proxy neither shows nor runs, and why."""

    name: str
    reason: str


def refused_names(tools: Iterable[str], trusted: Iterable[str], policy_names: Iterable[str]) -> dict[str, RefusedName]:
    """The tools among `tools` whose name is not a plain identifier, or whose skeleton
    equals that of another tool or of a name in the policy.

    A name in `trusted` (approved earlier) is not refused for a collision: the tool
    that arrived later is the suspect. Two untrusted tools that collide are both refused.
    """
    names = list(dict.fromkeys(tools))
    approved = set(trusted)
    others = {*names, *policy_names}
    by_skeleton: dict[str, list[str]] = {}
    for other in others:
        by_skeleton.setdefault(skeleton(other), []).append(other)
    refused: dict[str, RefusedName] = {}
    for name in names:
        if not TOOL_NAME.fullmatch(name):
            refused[name] = RefusedName(name, _not_identifier(name, by_skeleton))
            continue
        if name in approved:
            continue
        twins = _plain_twins(name, by_skeleton)
        if twins:
            refused[name] = RefusedName(name, f"its name is confusable with {', '.join(map(repr, twins))}")
    return refused


def _plain_twins(name: str, by_skeleton: Mapping[str, list[str]]) -> list[str]:
    """The plain-identifier names that share `name`'s skeleton, `name` excepted."""
    return sorted(o for o in by_skeleton.get(skeleton(name), ()) if o != name and TOOL_NAME.fullmatch(o))


def _not_identifier(name: str, by_skeleton: Mapping[str, list[str]]) -> str:
    odd = sorted({f"U+{ord(ch):04X}" for ch in name if not TOOL_NAME.fullmatch(ch)})
    shown = f"characters {', '.join(odd[:5])}" if odd else f"{len(name)} characters"
    twins = _plain_twins(name, by_skeleton)
    looks = f"; it reads like {', '.join(map(repr, twins))}" if twins else ""
    return f"its name is not a plain ASCII identifier ({shown}){looks}"
