"""Whole values in free text, for policy conditions: who and what a request names, what a message leaks.

A rule such as "pay only accounts the request names" must not read "names" as "is a
substring of": a shortened address (`bob@ex` inside `bob@example.com`), a domain missing
its last letter, an IBAN prefix or a one-letter value all occur inside longer text. These
functions take text apart into values of one kind, each in one canonical spelling, so a
condition compares whole values:

    emails(text)         e-mail addresses, lower case
    urls(text)           web addresses (with a scheme, or starting www.), as host/path: no
                         http(s) scheme (another scheme is kept), no default port, no
                         trailing slash, host lower case
    hosts(text)          host names: of those addresses, of e-mail addresses and bare
                         domains (example.com), IDNA-encoded, no trailing dot
    ibans(text)          IBANs, upper case, without spaces
    numbers(text)        digit runs, digits of every script as ASCII, group separators removed
    quoted(text)         text between quotes ('', "", typographic), case kept
    mentions(text, v)    whether v, as a whole value of its kind, is one `text` names
    reveals(text, s)     whether the secret s appears in `text` in any spelling: other case,
                         spaced out or punctuated, look-alike letters, or percent-, HTML-,
                         base64- or hex-encoded

Every function first normalises Unicode (NFKC, format characters such as zero-width spaces
removed) and, but for `quoted`, case. `text` may be a string, or a list or map (nested
too, such as `args` itself) whose strings are read one after another. They are registered as CEL functions (`policy.VALUE_FUNCTIONS`) and
callable either way: `mentions(state.request, args.recipient)` or
`state.request.mentions(args.recipient)`. Nothing here raises on a string: a value of
another type is a TypeError, which fails the condition closed.
"""

from __future__ import annotations

import base64
import binascii
import html
import re
import unicodedata
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

Text = str | list[Any] | tuple[Any, ...] | dict[str, Any]

# A dot that ends a sentence written without a space ("see www.site.com.They sent ...") is not
# part of an address: the dot before a capitalised word that ends at a space or punctuation.
_DOT = r"\.(?!(?-i:[A-Z][a-z]+)(?:[\s,;:!?)]|$))"
_EMAIL = re.compile(rf"[a-z0-9._%+\-]+@[a-z0-9\-]+(?:{_DOT}[a-z0-9\-]+)*{_DOT}[a-z]{{2,63}}", re.IGNORECASE)
_URL = re.compile(rf"(?:[a-z][a-z0-9+.\-]*://|www\.)(?:[^\s<>\"'`()\[\]{{}}.]|{_DOT})+", re.IGNORECASE)
_LABEL = r"[a-z0-9](?:[a-z0-9\-]{0,61}[a-z0-9])?"
_HOST = re.compile(
    rf"(?<![a-z0-9\-.@]){_LABEL}(?:{_DOT}{_LABEL})*{_DOT}[a-z][a-z0-9\-]{{1,62}}(?![a-z0-9\-])", re.IGNORECASE
)
_IBAN = re.compile(r"(?<![A-Z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Z0-9])")
_NUMBER = re.compile(r"[0-9]+(?:[ ,_\-][0-9]+)*(?:\.[0-9]+)?")
_QUOTED = re.compile(r"\"([^\"]+)\"|'([^']+)'|\u201c([^\u201d]+)\u201d|\u2018([^\u2019]+)\u2019|`([^`]+)`")
_BASE64 = re.compile(r"[A-Za-z0-9+/_\-]{8,}={0,2}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){4,}")
_TRAILING = ".,;:!?"
_DEFAULT_PORTS = (":80", ":443")

# Letters of other scripts drawn like Latin ones, for `reveals` (a secret spelt with them is
# still the secret). Not exhaustive: the common Cyrillic and Greek look-alikes.
CONFUSABLES = str.maketrans({
    "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c", "т": "t", "у": "y",
    "х": "x", "і": "i", "ј": "j", "ѕ": "s", "ԁ": "d", "ԛ": "q", "ԝ": "w", "ӏ": "l", "ɡ": "g",
    "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
})


def _joined(text: Any) -> str:
    """A string as it is; the strings (and numbers, booleans) of a list or map, nested or not, one per line."""
    if isinstance(text, str):
        return text
    if isinstance(text, (list, tuple, dict)):
        items = text.values() if isinstance(text, dict) else text
        return "\n".join(_joined(item) for item in items if item is not None)
    if isinstance(text, (bool, int, float)):
        return str(text)
    raise TypeError(f"expected text, or a list or map of it, not {type(text).__name__}")


def unicode_normalized(text: str) -> str:
    """NFKC, without format characters (zero-width spaces and joiners, direction marks)."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text) if unicodedata.category(ch) != "Cf")


def normalized(text: Text) -> str:
    """Unicode-normalised, case-folded, whitespace runs as one space.

    >>> normalized("  Bob\\u200b  SMITH\\n")
    'bob smith'
    """
    return _spaced(text).casefold()


def _spaced(text: Text) -> str:
    """Unicode-normalised, whitespace runs as one space, case kept (for the address patterns)."""
    return " ".join(unicode_normalized(_joined(text)).split())


def _ascii_digits(text: str) -> str:
    return "".join(str(unicodedata.digit(ch)) if ch.isdigit() and not ch.isascii() else ch for ch in text)


def emails(text: Text) -> list[str]:
    """E-mail addresses, lower case.

    >>> emails("Write to Bob.Smith@Example.COM, or bob@ex.")
    ['bob.smith@example.com']
    """
    return [found.strip(".").casefold() for found in _EMAIL.findall(_spaced(text))]


def _url_form(raw: str) -> str:
    address = raw.rstrip(_TRAILING).casefold()
    scheme, _, address = address.rpartition("://")
    kept = "" if scheme in ("", "http", "https") else f"{scheme}://"  # another scheme is another address
    host, slash, rest = address.partition("/")
    host = host.rsplit("@", 1)[-1]  # user info is not the host
    for port in _DEFAULT_PORTS:
        host = host.removesuffix(port)
    return (kept + _host_form(host) + slash + rest).rstrip("/")


def urls(text: Text) -> list[str]:
    """Web addresses, as host/path (see the module docstring).

    >>> urls("See https://WWW.Example.com:443/a/ and www.shop.com/x?q=1.Then www.b.org.")
    ['www.example.com/a', 'www.shop.com/x?q=1', 'www.b.org']
    """
    return [_url_form(found) for found in _URL.findall(_spaced(text))]


def _host_form(host: str) -> str:
    host = host.rstrip(".")
    try:
        return host.encode("idna").decode("ascii")
    except UnicodeError:
        return host


def hosts(text: Text) -> list[str]:
    """Host names of web addresses, of e-mail addresses and bare domains.

    >>> hosts("Visit www.evil.com/path, mail eve@evil.org or go to bad-site.net.")
    ['www.evil.com', 'evil.org', 'bad-site.net']
    """
    flat = _spaced(text)
    found = [_url_form(url).split("/", 1)[0] for url in _URL.findall(flat)]
    found += [address.rsplit("@", 1)[1] for address in emails(flat)]
    bare = _URL.sub(" ", _EMAIL.sub(" ", flat))
    found += [_host_form(host.casefold()) for host in _HOST.findall(bare)]
    return list(dict.fromkeys(found))


def ibans(text: Text) -> list[str]:
    """IBANs, upper case, without spaces.

    >>> ibans("Pay GB29 NWBK 6016 1331 9268 19 and DE89370400440532013000 now")
    ['GB29NWBK60161331926819', 'DE89370400440532013000']
    """
    return [found.replace(" ", "") for found in _IBAN.findall(normalized(text).upper())]


def numbers(text: Text) -> list[str]:
    """Digit runs, as ASCII digits without group separators.

    >>> numbers("Card 4237-4252 7456_2574, ３２ items, 1.5 kg")
    ['4237425274562574', '32', '1.5']
    """
    return [re.sub(r"[ ,_\-]", "", found) for found in _NUMBER.findall(_ascii_digits(normalized(text)))]


def quoted(text: Text) -> list[str]:
    """Quoted spans, Unicode-normalised, case kept.

    >>> quoted("set my password to '1j1L-2k3j' please")
    ['1j1L-2k3j']
    """
    return [next(group for group in match if group).strip() for match in _QUOTED.findall(unicode_normalized(_joined(text)))]


def value_kind(value: str) -> str:
    """What a value is, by its spelling: email, url, iban, number, host or phrase.

    >>> [value_kind(v) for v in ["a@b.com", "www.b.com", "GB29NWBK60161331926819", "12 500", "b.com", "Le Marais"]]
    ['email', 'url', 'iban', 'number', 'host', 'phrase']
    """
    flat = normalized(value)
    if _EMAIL.fullmatch(flat):
        return "email"
    if _URL.fullmatch(flat):
        return "url"
    if _IBAN.fullmatch(flat.upper()):
        return "iban"
    if _NUMBER.fullmatch(_ascii_digits(flat)):
        return "number"
    if _HOST.fullmatch(flat.rstrip(".")):
        return "host"
    return "phrase"


_EXTRACT: dict[str, Callable[[Text], list[str]]] = {
    "email": emails, "url": urls, "iban": ibans, "number": numbers, "host": hosts,
}


def mentions(text: Text, value: Any) -> bool:
    """Whether `text` names `value` as a whole value of its kind (`value_kind`): an address,
    web address, IBAN, number or host among those `text` holds, or else a phrase standing
    alone in it (not inside a longer word). Case and spacing do not matter in `text`; a
    part of a value, or a value with more to it, is not named, nor is an empty value, one
    with spaces around it or one not in Unicode's normal form (zero-width or full-width
    characters): the tool would get other characters than the ones the rule compared. A phrase that is a whole-word part of
    a longer one the text gives ("Le Marais" in "Le Marais Boutique") is named: without a
    list of the names that exist, the text cannot say where a name ends.

    >>> mentions("Send 50 to bob@example.com", "bob@example.co"), mentions("Send 50 to bob@example.com", "BOB@example.com")
    (False, True)
    >>> mentions("Book Le Marais Boutique", "le marais"), mentions("Book Le Marais Boutique", "Marai")
    (True, False)
    """
    if not isinstance(value, str):
        raise TypeError(f"mentions: the value must be a string, not {type(value).__name__}")
    if unicode_normalized(value) != value or value.strip() != value:  # the tool would read other characters than the rule
        return False
    kind = value_kind(value)
    if kind == "phrase":
        phrase = normalized(value)
        if not phrase:
            return False
        return re.search(rf"(?<![\w]){re.escape(phrase)}(?![\w])", normalized(text)) is not None
    (own,) = _EXTRACT[kind](value) or [None]
    return own is not None and own in _EXTRACT[kind](text)


def skeleton(text: str) -> str:
    """Letters and digits only, case-folded, look-alikes and digits of every script as ASCII.

    >>> skeleton("1 J 1 l-2К3ј")
    '1j1l2k3j'
    """
    flat = _ascii_digits(normalized(text)).translate(CONFUSABLES)
    return "".join(ch for ch in flat if ch.isalnum())


def _decoded_views(text: str) -> list[str]:
    """`text` as written, percent- and HTML-decoded, and each base64 or hex run decoded."""
    views = [text, unquote(unquote(text)), html.unescape(text)]
    for run in _BASE64.findall(text):
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                views.append(decode(run + "=" * (-len(run) % 4)).decode("utf-8", "ignore"))
            except (binascii.Error, ValueError):
                pass
    for run in _HEX.findall(text):
        views.append(bytes.fromhex(run).decode("utf-8", "ignore"))
    return views


def reveals(text: Text, secret: Any) -> bool:
    """Whether `secret` appears in `text` in any spelling (see the module docstring): its
    `skeleton` inside the skeleton of the text or of a decoded view of it. A secret whose
    skeleton is empty never appears; a very short one appears often (fail closed).

    >>> reveals("my pin: 4 2 3 7 - 4252", "4237-4252"), reveals("cGFzc3dvcmQ6IDFqMWwtMmszag==", "1j1l-2k3j")
    (True, True)
    """
    if not isinstance(secret, str):
        raise TypeError(f"reveals: the secret must be a string, not {type(secret).__name__}")
    key = skeleton(secret)
    if not key:
        return False
    return any(key in skeleton(view) for view in _decoded_views(_joined(text)))


VALUE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "emails": emails, "urls": urls, "hosts": hosts, "ibans": ibans, "numbers": numbers, "quoted": quoted,
    "normalized": normalized, "mentions": mentions, "reveals": reveals,
}
"""The functions a policy condition may call besides CEL's own, by name."""
