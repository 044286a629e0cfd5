"""The canonical form of text for finding secrets in it, whatever their spelling.

A secret leaves in the spelling that defeats the check: a passport number with a Greek
capital Eta for its H, a card number in Han numerals, an AWS key with U+034F or U+FE0F
between its letters, base64 wrapped at 76 columns, percent-escaped, or base64 twice. So
every check that looks for a secret, the gate's `reveals(text, secret)` and the proxy's
redaction patterns alike, reads the text through the same two steps:

1. `plain(text)`: what a reader sees. NFKC; every Default_Ignorable_Code_Point removed
   (zero-width and format characters, U+034F, variation selectors, U+3164 and the other
   Hangul fillers, tags); numerals of every script (Arabic-Indic, Devanagari, full-width,
   Han 〇一二三四五六七八九 ...) as ASCII digits; and each other character drawn like ASCII
   (Cyrillic а, Greek Η, Cherokee Ꭺ, mathematical 𝐀, a letter with accents stacked on it)
   as that ASCII character, in its own case. ASCII text is left as it is, so a redaction
   pattern reads it as written.
2. `readings(text)`: the plain text, then the same with one more layer of encoding
   opened, layer after layer: percent-, HTML-, backslash- and quoted-printable escapes
   (nested ones too), then hex (contiguous, spaced, colon-, dash- or 0x-separated, wrapped)
   and base64 (either alphabet, in groups or wrapped as MIME and PEM wrap it), each run
   decoded where it stands, so a secret half written and half encoded is read whole too.
   A run that decodes to binary stands for its printable runs of 4 or more characters (what
   `strings` shows); a run of plain words (lower case, perhaps capitalised) is prose and is
   not decoded.

`skeleton(text)` then folds what remains for comparing a known secret: case, the ASCII
characters drawn alike (0 O o, 1 I i l L |, m rn), every character that is neither letter
nor digit (so a secret spaced out or punctuated is still itself), and the confusable
skeleton of Unicode's UTS #39 for the other scripts. The confusables data and the
normalisation are ICU's (PyPI `pyicu-wheels`, ICU 77.1, Unicode 16.0); the numerals and
Default_Ignorable_Code_Point are the `regex` module's.

Every step is linear in the text, and bounded: a reading is at most 1.25 times the one
before it (hex decodes to half, base64 to three quarters; a contiguous hex run is read both
ways), at most MAX_DEPTH layers are opened (and escapes nested at most MAX_DEPTH deep in
each), and all readings together may hold at most READING_BUDGET times the text (and
64 KiB). A text that needs more raises TooDeep, and every check fails closed on it.
Not opened: compression (gzip, zlib, a PNG's zTXt), encryption, other encodings (base32,
base85, uuencode, ROT13), text reversed or interleaved with other text, hex dumps with
offsets, base64 whose groups are not multiples of 4 characters.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
from collections.abc import Iterator
from typing import Any

import icu
import regex

Text = str | list[Any] | tuple[Any, ...] | dict[str, Any]

MAX_DEPTH = 4
"""Layers of encoding opened on top of one another (base64 of base64 of percent-escapes...)."""
READING_BUDGET = 6
"""All readings of a text together hold at most this many times its characters (plus 64 KiB)."""
READING_ALLOWANCE = 64 * 1024

_SPOOF = icu.SpoofChecker()
_NFKC = icu.Normalizer2.getNFKCInstance()
_IGNORABLE = regex.compile(r"\p{Default_Ignorable_Code_Point}+")
_MARKS = regex.compile(r"\p{M}+")
_NOT_ALNUM = regex.compile(r"[^\p{L}\p{N}]+")


class TooDeep(ValueError):
    """A text encoded more deeply than MAX_DEPTH layers, or whose readings would exceed
    READING_BUDGET: it is not read further, and a check that looks for a secret in it fails
    closed."""


def _ascii_skeleton(char: str) -> str:
    return _SPOOF.getSkeleton(0, char)


def _ascii_fold() -> dict[int, str]:
    """Each ASCII character as one member of its class, the classes joining case and the
    ASCII characters UTS #39 calls confusable (0 O o; 1 I i l L |; m is rn)."""
    parent = {chr(c): chr(c) for c in range(128)}

    def root(c: str) -> str:
        while parent[c] != c:
            c = parent[c]
        return c

    def join(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the smallest code point stands for its class: digits first

    for c in map(chr, range(128)):
        join(c, c.lower())
        shape = _ascii_skeleton(c)
        if len(shape) == 1 and shape.isascii():
            join(c, shape)
    fold = {ord(c): root(c) for c in parent if root(c) != c}
    fold[ord("m")] = fold[ord("M")] = root("r") + root("n")
    return fold


_FOLD = _ascii_fold()


class _PlainTable(dict[int, str]):
    """str.translate's table for `plain`: ASCII maps to itself (found at C speed), each other
    character is worked out once, when first met."""

    def __missing__(self, point: int) -> str:
        shown = self[point] = _plain_char(chr(point))
        return shown


def _plain_char(char: str) -> str:
    """One character (already NFKC, not ignorable) as a reader sees it: a numeral as its
    ASCII digit, a character drawn like ASCII as that ASCII, in its own case."""
    if icu.Char.charType(char) in (icu.UCharCategory.NON_SPACING_MARK, icu.UCharCategory.ENCLOSING_MARK):
        return ""  # accents stacked on a letter: the letter is what a reader reads
    digit = _numeral(char)
    if digit is not None:
        return digit
    shape = _MARKS.sub("", _ascii_skeleton(char))  # the skeleton is NFD: accents come apart from their letters
    if not shape or not shape.isascii():
        return char
    if len(shape) == 1:
        if shape in "lI1|" and char.isupper():
            return "I"
        if shape in "O0" and char.islower():
            return "o"
        if shape == "O" and char.isdigit():
            return "0"
    if shape == "rn" and char.isalpha():
        return "m"
    return shape


_NUMERALS = tuple(
    regex.compile(rf"[\p{{Numeric_Value={value}}}&&[\p{{Nd}}\p{{No}}\p{{Lo}}]]", regex.V1) for value in range(10)
)
"""The characters that stand for one digit: the decimal digits of every script, Han 〇一二三...
(and their financial forms), circled and parenthesised digits; never 10, ½ or a Roman numeral."""


def _numeral(char: str) -> str | None:
    """The ASCII digit `char` stands for, or None."""
    for value, numerals in enumerate(_NUMERALS):
        if numerals.match(char):
            return str(value)
    return None


_TABLE = _PlainTable({point: chr(point) for point in range(128)})


class _SkeletonTable(dict[int, str]):
    """str.translate's table for `skeleton`: a character without an ASCII look-alike as its
    UTS #39 skeleton, case-folded, and ASCII as _FOLD folds it."""

    def __missing__(self, point: int) -> str:
        shape = self[point] = _SPOOF.getSkeleton(0, chr(point)).casefold().translate(_FOLD)
        return shape


_SKELETON = _SkeletonTable({point: chr(point).translate(_FOLD) for point in range(128)})
_ASCII_FOLD = {point: shape for point, shape in _FOLD.items() if len(shape) == 1}  # m is replaced before


def plain(text: str) -> str:
    """`text` as a reader sees it (see the module docstring); ASCII text comes back as it is.

    >>> plain("\\u0397GK1\\u0663780\\u034f3 \\u4e00\\u4e8c AK\\u0406A")
    'HGK137803 12 AKIA'
    """
    if text.isascii():
        return text
    return _IGNORABLE.sub("", _NFKC.normalize(text)).translate(_TABLE)


def skeleton(text: Text) -> str:
    """Letters and digits only, case and look-alikes of every script folded: what `reveals`
    compares. Two spellings a reader takes for the same secret have the same skeleton.

    >>> skeleton("1 J 1 l-2К3ј") == skeleton("1j1l-2k3j"), skeleton("H\\u0399") == skeleton("hi")
    (True, True)
    """
    return _folded(plain(joined(text)))


def _folded(shown: str) -> str:
    """`skeleton` of a text already in its `plain` form."""
    folded = shown.casefold()
    if folded.isascii():  # one character for one: str.translate's fast path
        return _NOT_ALNUM.sub("", folded.replace("m", "rn").translate(_ASCII_FOLD))
    return _NOT_ALNUM.sub("", folded.translate(_SKELETON))


def joined(text: Any) -> str:
    """A string as it is; the strings (and numbers, booleans) of a list or map, nested or not, one per line."""
    if isinstance(text, str):
        return text
    if isinstance(text, (list, tuple, dict)):
        items = text.values() if isinstance(text, dict) else text
        return "\n".join(joined(item) for item in items if item is not None)
    if isinstance(text, (bool, int, float)):
        return str(text)
    raise TypeError(f"expected text, or a list or map of it, not {type(text).__name__}")


# ---- encodings --------------------------------------------------------------------------

_PERCENT = re.compile(r"(?:%[0-9A-Fa-f]{2})+")
_QUOTED_PRINTABLE = re.compile(r"=[0-9A-F]{2}(?:=[0-9A-F]{2})*")
_BACKSLASH = re.compile(r"\\(?:(x[0-9A-Fa-f]{2}(?:\\x[0-9A-Fa-f]{2})*)|u\{?([0-9A-Fa-f]{4,6})\}?|U([0-9A-Fa-f]{8})|([nrt/\\\"']))")
_BACKSLASH_CHARS = {"n": "\n", "r": "\r", "t": "\t", "/": "/", "\\": "\\", '"': '"', "'": "'"}
_B64 = r"[A-Za-z0-9+/_\-]"
_RUN = re.compile(
    # hex: pairs, contiguous or each set apart by a space, colon, comma, dot, dash, line end or 0x
    r"(?<![0-9A-Za-z+/])(?P<hex>(?:0[xX])?[0-9A-Fa-f]{2}(?:[ \t]{0,2}(?:[:,;.\-][ \t]{0,2}|\r?\n[ \t]{0,8})?(?:0[xX])?[0-9A-Fa-f]{2}){3,})"
    r"(?![0-9A-Za-z+/=])"
    # base64: one run of 8 or more, or groups whose lengths are multiples of 4 (as encoders group and wrap)
    # (a run ends at its padding, or where the alphabet does)
    rf"|(?<![A-Za-z0-9+/_=\-])(?P<base64>(?:(?:(?:{_B64}{{4}})+[ \t\r\n]{{1,8}})+{_B64}+|{_B64}{{8,}})(?:={{1,2}}|(?![A-Za-z0-9+/_=\-])))"
)
_WORDS = re.compile(r"[A-Z]?[a-z]+(?:\s+[A-Z]?[a-z]+)*")
"""A run of plain words (lower case, perhaps capitalised) is prose: base64 of anything that
holds a secret mixes case and digits."""
_HEX_SEPARATORS = re.compile(r"0[xX]|[^0-9A-Fa-f]")


def _bytes_text(raw: bytes) -> str:
    """Decoded bytes as text: UTF-8 (what is not, U+FFFD), NUL bytes dropped so that UTF-16 text reads too."""
    return raw.replace(b"\0", b"").decode("utf-8", "replace")


_ESCAPE_MARKS = re.compile(r"\\[xuUnrt/\\\"']|%[0-9A-Fa-f]{2}|&#?\w|=[0-9A-F]{2}")


_UNREADABLE = re.compile(r"[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_PRINTABLE_RUN = re.compile(rb"[\x20-\x7e]{4,}")


def _run_text(raw: bytes) -> str:
    """What a hex or base64 run decodes to, as text: the text itself when it reads as text,
    else (binary, or a word that only looked like base64) its printable runs of 4 or more
    characters, as `strings` shows them: a secret inside binary is one of those."""
    text = _bytes_text(raw)
    if len(_UNREADABLE.findall(text)) * 10 <= len(text):
        return text
    return " ".join(run.decode("ascii") for run in _PRINTABLE_RUN.findall(raw.replace(b"\0", b"")))


def _unescaped(text: str) -> str:
    """`text` with its backslash, percent, HTML and quoted-printable escapes decoded, each once."""
    if "\\" in text:
        text = _BACKSLASH.sub(_backslash, text)
    if "%" in text:
        text = _PERCENT.sub(lambda m: _bytes_text(bytes.fromhex(m.group().replace("%", ""))), text)
    if "&" in text:
        text = html.unescape(text)
    if "=" in text:
        text = _QUOTED_PRINTABLE.sub(_quoted_printable, text)
    return text


def _quoted_printable(match: re.Match[str]) -> str:
    """=XX escapes decoded, unless right after an = (base64's padding, not an escape)."""
    if match.start() and match.string[match.start() - 1] == "=":
        return match.group()
    return _bytes_text(bytes.fromhex(match.group().replace("=", "")))


def _backslash(match: re.Match[str]) -> str:
    escaped_bytes, point, long_point, char = match.groups()
    if escaped_bytes is not None:
        return _bytes_text(bytes.fromhex(escaped_bytes.replace("\\x", "").replace("x", "")))
    if char is not None:
        return _BACKSLASH_CHARS[char]
    number = int(point or long_point, 16)
    return chr(number) if number <= 0x10FFFF and not 0xD800 <= number < 0xE000 else "\ufffd"


def _run(match: re.Match[str]) -> str:
    """A hex or base64 run decoded; a contiguous hex run is read as base64 too (its decodings
    side by side); a run that is neither is left as it is."""
    run = match.group()
    if match.group("hex") is None:
        return run if _WORDS.fullmatch(run) else _base64(run)
    digits = _HEX_SEPARATORS.sub("", run)
    decoded = _run_text(bytes.fromhex(digits[: len(digits) // 2 * 2]))
    return f"{decoded} {_base64(run)}" if digits == run else decoded


def _base64(run: str) -> str:
    """A base64 run (either alphabet, whitespace inside dropped) decoded; one that is not base64 is left."""
    joined_run = "".join(run.split()).rstrip("=")
    joined_run = joined_run[: len(joined_run) - (len(joined_run) % 4 == 1)]  # a lone last character holds no byte
    try:
        raw = base64.b64decode(joined_run.replace("-", "+").replace("_", "/") + "=" * (-len(joined_run) % 4), validate=True)
    except (binascii.Error, ValueError):
        return run
    return _run_text(raw)


def readings(text: str) -> Iterator[str]:
    """`plain(text)`, then each further step of decoding (see the module docstring): in each
    layer the escapes decoded until none is left, then the hex and base64 runs; until nothing
    changes. TooDeep when more than MAX_DEPTH layers (or escapes nested deeper than that)
    would be needed, or the readings would hold more than READING_BUDGET times the text."""
    reading = plain(text)
    yield reading
    budget = READING_BUDGET * len(reading) + READING_ALLOWANCE
    decoded: dict[str, str] = {}  # run -> its decoding, for the runs a later layer meets again
    for _ in range(MAX_DEPTH + 1):
        before = reading
        for nested in range(MAX_DEPTH + 1):  # escapes inside escapes, then the runs
            if nested < MAX_DEPTH:
                if not _ESCAPE_MARKS.search(reading):
                    continue
                stepped = _unescaped(reading)
            else:
                stepped = _RUN.sub(lambda match: _decoded_run(match, decoded), reading)
            deeper = reading if stepped == reading else plain(stepped)
            if deeper == reading:
                continue
            budget -= len(deeper)
            if budget < 0:
                raise TooDeep(f"the text's encodings hold more than {READING_BUDGET} times its own length")
            yield deeper
            reading = deeper
        if reading == before:
            return
    raise TooDeep(f"the text is encoded more than {MAX_DEPTH} layers deep")


def _decoded_run(match: re.Match[str], decoded: dict[str, str]) -> str:
    run = match.group()
    found = decoded.get(run)
    if found is None:
        found = decoded[run] = _run(match)
    return found


def reveals(text: Text, secret: Any) -> bool:
    """Whether `secret` appears in `text` in any spelling: its `skeleton` inside the skeleton
    of one of the text's `readings` (other case, spaced out or punctuated, look-alike letters
    of any script, digits of any script, invisible characters, escaped or encoded). A text
    too deeply encoded to read (TooDeep) reveals it: the check fails closed. A secret whose
    skeleton is empty never appears; a very short one appears often (fail closed).

    >>> reveals("my pin: 4 2 3 7 - 4252", "4237-4252"), reveals("cGFzc3dvcmQ6IDFqMWwtMmszag==", "1j1l-2k3j")
    (True, True)
    """
    if not isinstance(secret, str):
        raise TypeError(f"reveals: the secret must be a string, not {type(secret).__name__}")
    key = skeleton(secret)
    if not key:
        return False
    try:
        return any(key in _folded(reading) for reading in readings(joined(text)))
    except TooDeep:
        return True
