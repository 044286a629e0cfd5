"""What one proxy session has carried, read as one stream each way, so that a secret split
across calls, fields or results is seen whole.

The client's model assembles what it reads: a key whose first half ends one result and whose
second half starts the next is the key, and so is one whose halves go out in two arguments of a
call or in two calls. String-by-string redaction sees neither half as a secret. So the session
keeps, for each channel, the end of what passed (in its `plain` form: invisible characters
removed, look-alikes as ASCII, so padding with them cannot push a first half out), and reads
each new piece after it: the end and the piece joined, with every encoding opened
(`canonical.readings`), go through the policy's redaction. A match there means the piece
completes a secret: it is withheld (a result, an error) or refused (a call).

The channels: `sent`, the values of the arguments of every call the gate let through, in
order (two fields of one call are two pieces of it), and `sent_strings`, their keys too;
`text`, the text the client reads of
each result and error (text blocks and embedded text resources, joined); `strings`, every
string of each result (meta, links, structured content), joined. Only what passed is kept:
a withheld result or refused call never joins the stream.

Memory is bounded: each channel keeps its last TAIL_CHARS characters, more than any secret
format the policy redacts (a PEM block matches on its BEGIN line). A secret split into
pieces spread over more than that (with other text between them) is not seen whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from toolpolicy.gate.canonical import TooDeep, plain, readings

TAIL_CHARS = 4096
"""Characters each channel keeps of what passed before."""

CHANNELS = ("sent", "sent_strings", "text", "strings")
JOINS = ("", "\n")


@dataclass
class SessionStream:
    """The end of each channel of one proxy session (see the module docstring), twice: its
    pieces joined with nothing (a secret cut anywhere) and with line ends (a base64 run cut
    between two of its groups, a pattern that needs its word to end)."""

    tails: dict[tuple[str, str], str] = field(
        default_factory=lambda: {(channel, join): "" for channel in CHANNELS for join in JOINS}
    )

    def completes_secret(self, channel: str, pieces: Iterable[str], redact: Callable[[str], str]) -> str | None:
        """Why `pieces`, read after what `channel` carried before, show a secret `redact`
        replaces (a phrase for the client), or None."""
        shown = [plain(piece) for piece in pieces]
        if not any(shown):
            return None
        for join in JOINS:
            joined = self.tails[channel, join] + join + join.join(shown) + "\n"  # a line end: a word may need to end
            try:
                for depth, reading in enumerate(readings(joined)):
                    if redact(reading) != reading:
                        return "read after what the session carried before" + (" and decoded" if depth else "")
            except TooDeep:
                return "read after what the session carried before, encoded more deeply than the proxy reads"
        return None

    def carry(self, channel: str, pieces: Iterable[str]) -> None:
        """Add `pieces` to `channel`, keeping its last TAIL_CHARS characters."""
        shown = [plain(piece) for piece in pieces]
        for join in JOINS:
            self.tails[channel, join] = (self.tails[channel, join] + join + join.join(shown))[-TAIL_CHARS:]
