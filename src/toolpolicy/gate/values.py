"""Whole values in free text, for policy conditions: who and what a request names, what a message leaks.

A rule such as "pay only accounts the request names" must not read "names" as "is a
substring of": a shortened address (`bob@ex` inside `bob@example.com`), a domain missing
its last letter, an IBAN prefix or a one-letter value all occur inside longer text. These
functions take text apart into values of one kind, each in one canonical spelling, so a
condition compares whole values:

    emails(text)         e-mail addresses: local part lower case, domain as a host
    urls(text)           web addresses (with a scheme, starting www., or a bare host with a
                         path), as WHATWG URL parsing reads them, written host/path: no
                         http(s) scheme (another scheme is kept), user info kept, no default
                         port, no trailing slash, path, query and fragment as parsed
    hosts(text)          hosts: of those addresses, of e-mail addresses and bare ones
                         (example.com, 10.0.0.1), as WHATWG's host parser reads them (UTS 46:
                         case, `ß`, full-width and ideographic dots; IPv4 in every radix, IPv6),
                         in ASCII (punycode), no trailing dot
    sites(text)          the sites of those hosts: registrable domains by the Public Suffix
                         List (www.a.co.uk and a.co.uk are one site; a.com.co is not a.com)
    ibans(text)          IBANs, upper case, without spaces
    numbers(text)        digit runs, digits of every script as ASCII, group separators removed
    quoted(text)         text between quotes ('', "", typographic), case kept
    mentions(text, v)    whether v, as a whole value of its kind, is one `text` names
    reveals(text, s)     whether the secret s appears in `text` in any spelling: other case,
                         spaced out or punctuated, look-alike letters, or percent-, HTML-,
                         base64- or hex-encoded

Every function first normalises Unicode (NFKC, format characters such as zero-width spaces
removed) and, but for `quoted`, case. An address is read whole, by the parsers the world
uses (ada for WHATWG URLs and hosts; the Public Suffix List the `publicsuffixlist` package
bundles: nothing is fetched), so a policy compares where a browser or a mail server would
go: `www.a.com.Co` is the host www.a.com.co, `https://evil.net?#@a.com` goes to evil.net,
`http://2130706433` is 127.0.0.1. Each is linear in the length of its input
(bench/value_functions.py). `text` may be a string, or a list or map (nested too, such as
`args` itself) whose strings are read one after another. They are registered as CEL
functions (`policy.VALUE_FUNCTIONS`) and callable either way: `mentions(state.request, args.recipient)` or
`state.request.mentions(args.recipient)`. Nothing here raises on a string: a value of
another type is a TypeError, which fails the condition closed.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import ada_url
from publicsuffixlist import PublicSuffixList

from toolpolicy.gate.canonical import joined, reveals

Text = str | list[Any] | tuple[Any, ...] | dict[str, Any]

# Every pattern below is linear in its input: each can start only where a run of its
# characters starts (the lookbehinds), and its runs are possessive (`++`), so a failed
# attempt never rescans what it read. Long runs of `a.a.a.`, `a@a@a@`, `www.www.` or digits
# with separators are one pass each (bench/value_functions.py times them).

_DOTS = str.maketrans({"\u3002": "."})
"""The ideographic full stop, which UTS 46 maps to "." (NFKC maps the full-width and
half-width ones to "." and to it)."""

_URL_START = re.compile(r"(?<![\w.\-])(?P<www>[Ww][Ww][Ww]\.)|(?<![A-Za-z0-9+.\-])(?P<scheme>[A-Za-z0-9+.\-]++):(?P<slashes>//)?")
"""Where a web address may start: `www.` at the start of a word, or a scheme and a colon
(a special scheme, such as http, needs nothing more: WHATWG reads `https:evil.com` and
`https:\\\\evil.com` as https://evil.com; another scheme needs //)."""

_URL_REST = re.compile(r"[^\s<>\"`]*+")
"""A web address as text carries it: up to white space or a character that ends it in HTML
and Markdown (WHATWG itself strips tabs and newlines, which a message shows as a break)."""

_EMAIL = re.compile(r"(?<![\w.+\-%])([\w.+\-%]++)@(?=([\w\-]*+\.[\w.\-]*+))")
"""An e-mail address: a local part, @ and a domain with a dot, letters of every script (the
domain is looked ahead at, so `a@b@evil.com` also yields b@evil.com)."""

_NAME = re.compile(r"(?<![\w.\-])[\w\-]*+\.[\w.\-]*+")
"""A run of the characters a host name is written with (letters and digits of every script,
`_`, `-` and dots) that holds a dot."""

_TRAILING = ".,;:!?'\"*_~"
_CLOSING = {")": "(", "]": "[", "}": "{"}
_SPECIAL_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp", "file"})
"""WHATWG's special schemes: their hosts are domains or IP addresses."""
_WEB_SCHEMES = frozenset({"http", "https"})
_URL_STRIPPED = str.maketrans({"\t": None, "\n": None, "\r": None})


@lru_cache(maxsize=1)
def _format_characters() -> dict[int, None]:
    """Every format character (category Cf) of this Python's Unicode database, deleted by
    `str.translate`: one C pass over a text (built once, about 0.2 s)."""
    return {code: None for code in range(sys.maxunicode + 1) if unicodedata.category(chr(code)) == "Cf"}


def unicode_normalized(text: str) -> str:
    """NFKC, without format characters (zero-width spaces and joiners, direction marks)."""
    if text.isascii():  # NFKC leaves ASCII as it is, and ASCII has no format characters
        return text
    return unicodedata.normalize("NFKC", text).translate(_format_characters())


def normalized(text: Text) -> str:
    """Unicode-normalised, case-folded, whitespace runs as one space.

    >>> normalized("  Bob\\u200b  SMITH\\n")
    'bob smith'
    """
    return _spaced(text).casefold()


def _spaced(text: Text) -> str:
    """Unicode-normalised, whitespace runs as one space, case kept."""
    return " ".join(unicode_normalized(joined(text)).split())


def _ascii_digits(text: str) -> str:
    return "".join(str(unicodedata.digit(ch)) if ch.isdigit() and not ch.isascii() else ch for ch in text)


# ---- hosts, web and e-mail addresses, as the world's parsers read them -------------------


@lru_cache(maxsize=4096)
def host_identity(name: str) -> str | None:
    """The host `name` is, as WHATWG's host parser (ada) reads it: IDNA/UTS 46 mapping (case,
    `ß`, full-width letters and dots), percent-decoding, IPv4 in every radix and IPv6 in
    brackets, ASCII (punycode) out; the root's trailing dot dropped. None for what no URL
    can have as its host (`a b.com`, an IPv4 part over 255).

    >>> [host_identity(h) for h in ["WWW.Example.COM.", "b\\u00fccher.de", "0x7f.1", "ex%2ecom", "a b.com"]]
    ['www.example.com', 'xn--bcher-kva.de', '127.0.0.1', 'ex.com', None]
    """
    if not name or any(ch in name for ch in "/\\?#@:[]") and not (name.startswith("[") and name.endswith("]")):
        return None
    try:
        url = ada_url.URL("http://" + name)
    except ValueError:
        return None
    return url.hostname.rstrip(".") or None


def _bare_host(run: str) -> str | None:
    """The host a bare name written in text is (`example.com`, `münchen.de`, `127.0.0.1`),
    or None for a word that is no host name: no dot, a last label of one character or not
    starting with a letter (`e.g.`, `1.5`, `v2.0`); an IPv4 address only in its dotted form
    of four parts (with a scheme, every form of it is a host)."""
    name = run.strip(".")
    head, dot, last = name.rpartition(".")
    if not dot or not head:
        return None
    if not last[:1].isalpha():
        if name.count(".") != 3:  # only a dotted IPv4 address ends so
            return None
    elif last.isascii() and len(last) < 2:
        return None
    host = host_identity(name)
    if host is None:
        return None
    if host.replace(".", "").isdigit():
        return host if name.count(".") == 3 else None
    last = host.rsplit(".", 1)[-1]
    return host if len(last) >= 2 and last[0].isalpha() else None


def _more_after(flat: str, end: int) -> bool:
    """Whether the text goes on after position `end` with a space and a word."""
    return end + 1 < len(flat) and flat[end].isspace() and not flat[end + 1].isspace()


def _readings(address: str, more: bool) -> list[str]:
    """`address` as a text gives it, and, when it ends in a dot and a capitalised word and
    the sentence goes on (`www.a.com.They sent`), also without them: a sentence written
    without a space after its full stop. Both are read (either unknown denies a message; a
    request naming one names both), so `www.a.com.Co` is never only www.a.com.

    >>> _readings("www.a.com.They", True), _readings("www.a.com.They", False), _readings("www.a.com.co", True)
    (['www.a.com.They', 'www.a.com'], ['www.a.com.They'], ['www.a.com.co'])
    """
    if not more:
        return [address]
    head, dot, word = address.rpartition(".")
    sentence = dot and head and word[:1].isascii() and word[:1].isupper() and len(word) > 1 and word[1:].isascii()
    return [address, head] if sentence and word[1:].isalpha() and word[1:].islower() else [address]


def _trimmed(span: str) -> str:
    """A web address found in text, without the punctuation that ends the sentence around it
    (a full stop, a closing quote, a bracket it did not open)."""
    end = len(span)
    closing = {close: span.count(close) - span.count(open_) for close, open_ in _CLOSING.items()}
    while end:
        ch = span[end - 1]
        if ch in _TRAILING:
            end -= 1
        elif closing.get(ch, 0) > 0:
            closing[ch] -= 1
            end -= 1
        else:
            break
    return span[:end]


@lru_cache(maxsize=4096)
def _web_address(address: str) -> tuple[str, str]:
    """(the web address in its canonical form, its host) of `address` (with its scheme), as
    WHATWG URL parsing (ada) reads it: user info, backslashes, tabs and newlines, ports and
    percent-encoding as a browser takes them. An address no URL parser accepts stays as
    written, lower case (it equals no address one could visit)."""
    try:
        url = ada_url.URL(address)
    except ValueError:
        raw = address.casefold()
        authority = raw.partition("//")[2] if "//" in raw else raw.partition(":")[2]
        for end in "/\\?#":
            authority = authority.partition(end)[0]
        return raw.rstrip("/"), authority.rpartition("@")[2]
    href, hostname = url.href, url.hostname  # each read of the parsed URL is a call into ada
    scheme, _, rest = href.partition(":")
    if scheme not in _SPECIAL_SCHEMES:  # an opaque host: read as a host name where it can be one
        return href.rstrip("/"), host_identity(hostname) or hostname.casefold()
    host = hostname.rstrip(".")
    rest = rest.removeprefix("//")
    cut = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    before, after = rest[:cut].rstrip("/"), rest[cut:]  # the authority and path; query and fragment
    if host != hostname:  # the root's dot after the host name (ex.com./a is ex.com/a)
        at = before.rfind("@", 0, before.find("/") if "/" in before else len(before)) + 1
        before = before[:at] + host + before[at + len(hostname) :]
    form = before + after
    return (form if scheme in _WEB_SCHEMES else f"{scheme}://{form}"), host


@dataclass(frozen=True)
class _Found:
    """The addresses of one text, in the order it gives them."""

    emails: tuple[str, ...]
    urls: tuple[str, ...]
    hosts: tuple[str, ...]


def _untaken(flat: str, taken: bytearray) -> list[str]:
    """`flat` in pieces, each character where an address was found as a space."""
    pieces, at = [], 0
    while at < len(flat):
        end = taken.find(b"\x00" if taken[at] else b"\x01", at)
        end = len(flat) if end < 0 else end
        pieces.append(" " * (end - at) if taken[at] else flat[at:end])
        at = end
    return pieces


def _scan(text: Text) -> _Found:
    return _scanned(joined(text))


@lru_cache(maxsize=64)
def _scanned(raw: str) -> _Found:
    """Every web address, e-mail address and bare host name of `raw`, each read as WHATWG
    (ada) and UTS 46 read it. Web addresses first (to white space: their user info, query and
    fragment are theirs), then e-mail addresses outside them, then bare host names outside
    both; a bare host followed by a path, query, fragment or port is a web address too.
    Cached: a condition over every value of a message reads the same trusted text again."""
    flat = unicode_normalized(raw).translate(_DOTS)
    emails: list[str] = []
    urls: list[tuple[int, str]] = []
    hosts: list[tuple[int, str]] = []
    taken = bytearray(len(flat))  # 1 where an address already found sits
    starts = []  # (where an address starts, where its scheme or www. ends, what goes before it, where it is taken from)
    for match in _URL_START.finditer(flat):
        if match["www"]:
            starts.append((match.start(), match.end(), "http://", match.start()))
            continue
        run = match["scheme"]
        letter = next((i for i, ch in enumerate(run) if ch.isascii() and ch.isalpha()), None)
        if letter is not None and (run[letter:].casefold() in _SPECIAL_SCHEMES or match["slashes"]):
            special = run[letter:].casefold() in _SPECIAL_SCHEMES
            # the run of another scheme (`evil.comhttps://`) is read for a host name as well
            starts.append((match.start() + letter, match.end(), "", match.start() + letter if special else match.end("scheme")))
    outer_end = 0
    for i, (start, after, prefix, taken_from) in enumerate(starts):
        if start >= outer_end:  # an address of its own, to white space
            address = _trimmed(flat[start : _URL_REST.match(flat, after).end()])
            outer_end = start + len(address)
        elif prefix and flat[start - 1] in "/@:":
            continue  # `www.` as the authority or a path segment of the address around it
        else:  # one inside another's query or a Markdown link's target: read on its own too, to the next
            stop = starts[i + 1][0] if i + 1 < len(starts) and starts[i + 1][0] < outer_end else outer_end
            address = _trimmed(flat[start:stop])
        if start + len(address) <= after:
            continue  # `www.` or a scheme with nothing after it
        for reading in _readings(address, _more_after(flat, start + len(address))):
            form, host = _web_address(prefix + reading)
            urls.append((start, form))
            hosts.append((start, host))
        taken[taken_from : start + len(address)] = b"\x01" * (start + len(address) - taken_from)

    for match in _EMAIL.finditer(flat):
        if taken[match.start()]:
            continue
        local, domain = match[1].lstrip("."), match[2].rstrip(".")
        more = _more_after(flat, match.end() + len(match[2].rstrip(".")))
        readings = [host for host in map(_bare_host, _readings(domain, more)) if host is not None]
        if not local or not readings:
            continue
        for host in readings:
            emails.append(f"{local.lower()}@{host}")
            hosts.append((match.start(), host))
        end = match.end() + len(match[2])
        taken[match.start() : end] = b"\x01" * (end - match.start())

    bare = flat if not any(taken) else "".join(_untaken(flat, taken))
    skip = 0
    for match in _NAME.finditer(bare):
        start, end = match.span()
        run = match[0].rstrip(".")
        readings = [host for host in map(_bare_host, _readings(run, _more_after(flat, start + len(run))))] if start >= skip else []
        readings = [host for host in readings if host is not None]
        if not readings:
            continue
        hosts += [(start, host) for host in readings]
        after = flat[end : end + 2]
        if after[:1] in ("/", "?", "#") or (after[:1] == ":" and after[1:2].isdigit()):
            address = _trimmed(flat[start : _URL_REST.match(flat, end).end()])
            form, host = _web_address("http://" + address)  # `a.com:80@evil.com/x` goes to evil.com
            urls.append((start, form))
            hosts.append((start, host))
            skip = start + len(address)
    return _Found(
        tuple(emails),
        tuple(form for _, form in sorted(urls, key=lambda found: found[0])),
        tuple(dict.fromkeys(host for _, host in sorted(hosts, key=lambda found: found[0]))),
    )


def emails(text: Text) -> list[str]:
    """E-mail addresses: the local part lower case, the domain as `host_identity` reads it.

    >>> emails("Write to Bob.Smith@Example.COM, or bob@ex.")
    ['bob.smith@example.com']
    """
    return list(_scan(text).emails)


def urls(text: Text) -> list[str]:
    """Web addresses, as WHATWG URL parsing reads them, written host/path (see the module docstring).

    >>> urls("See https://WWW.Example.com:443/a/ and www.shop.com/x?q=1, then http://2130706433/.")
    ['www.example.com/a', 'www.shop.com/x?q=1', '127.0.0.1']
    >>> urls("https://attacker.example?d=1#@known.org, https://user@known.org@evil.net/")
    ['attacker.example?d=1#@known.org', 'user%40known.org@evil.net']
    """
    return list(_scan(text).urls)


def hosts(text: Text) -> list[str]:
    """Host names and IP addresses: of web addresses, of e-mail addresses and bare ones.

    >>> hosts("Visit www.evil.com/path, mail eve@evil.org or go to bad-site.net or 10.0.0.1.")
    ['www.evil.com', 'evil.org', 'bad-site.net', '10.0.0.1']
    >>> hosts("www.Informations.com.Co, EVIL\\u3002com, https://x@[::1]:8080")
    ['www.informations.com.co', 'evil.com', '[::1]']
    """
    return list(_scan(text).hosts)


@lru_cache(maxsize=1)
def _public_suffixes() -> PublicSuffixList:
    return PublicSuffixList()  # the list the package bundles; nothing is fetched


def site(host: str) -> str:
    """The site of a host (`host_identity` form): its registrable domain by the Public Suffix
    List (the suffix under which anyone may register a name, and one label), or the host
    itself when it is an IP address or a public suffix.

    >>> [site(h) for h in ["www.bluesparrowtech.com", "bluesparrowtech.com.co", "alice.github.io", "127.0.0.1"]]
    ['bluesparrowtech.com', 'bluesparrowtech.com.co', 'alice.github.io', '127.0.0.1']
    """
    if host.startswith("[") or host.replace(".", "").isdigit():
        return host
    return _public_suffixes().privatesuffix(host) or host


def sites(text: Text) -> list[str]:
    """The sites (`site`) of the hosts `text` names: "the same site" as browsers mean it.

    >>> sites("mail a@news.example.co.uk, see www.example.co.uk and example.com.co")
    ['example.co.uk', 'example.com.co']
    """
    return list(dict.fromkeys(site(host) for host in hosts(text)))


# ---- account numbers, numbers, quoted text ---------------------------------------------

_IBAN = re.compile(r"(?<![A-Z0-9])[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?(?![A-Z0-9])")
_NUMBER = re.compile(r"(?<![0-9])[0-9]++(?:[ ,_\-][0-9]++)*+(?:\.[0-9]++)?+")
_QUOTED = re.compile(
    r"\"([^\"]++)\"|'([^']++)'|\u201c([^\u201c\u201d]++)\u201d|\u2018([^\u2018\u2019]++)\u2019|`([^`]++)`"
)
"""Quoted spans; a typographic quote cannot hold its own opening mark, so a run of openers
without a close is read once, not once per opener."""


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
    return [next(group for group in match if group).strip() for match in _QUOTED.findall(unicode_normalized(joined(text)))]


# ---- whole values ---------------------------------------------------------------------


def _identity(value: str) -> tuple[str, str | None]:
    """(the kind of `value`, its canonical form) read as one whole value: the kind by its
    spelling (`value_kind`), the form as the world's parser reads the whole of it (None for
    an IBAN or a number, which `mentions` reads as before). Never a value found inside it:
    `bob@x.com.Co` is an address at x.com.co, not bob@x.com."""
    flat = unicode_normalized(value).translate(_DOTS)
    email = _EMAIL.match(flat)
    if email and email.end() + len(email[2]) == len(flat) and not flat.startswith("."):
        host = _bare_host(email[2]) if not email[2].startswith(".") else None
        if host is not None:
            return "email", f"{email[1].lower()}@{host}"
    compact = flat.translate(_URL_STRIPPED)  # WHATWG removes tabs and newlines from a URL
    if not any(ch.isspace() for ch in compact):
        start, name = _URL_START.match(compact), _NAME.match(compact)
        if start and start["www"]:
            return "url", _web_address("http://" + compact)[0]
        if start and start["scheme"][0].isascii() and start["scheme"][0].isalpha():
            if start["scheme"].casefold() in _SPECIAL_SCHEMES or start["slashes"]:
                return "url", _web_address(compact)[0]
        after = compact[name.end() : name.end() + 2] if name else ""
        if name and (after[:1] in ("/", "?", "#") and after or (after[:1] == ":" and after[1:2].isdigit())):
            if _bare_host(name[0]) is not None and not compact.startswith("."):
                return "url", _web_address("http://" + compact)[0]
    lowered = normalized(value)
    if _IBAN.fullmatch(lowered.upper()):
        return "iban", None
    if _NUMBER.fullmatch(_ascii_digits(lowered)):
        return "number", None
    if _NAME.fullmatch(flat) and not flat.startswith("."):
        host = _bare_host(flat)
        if host is not None:
            return "host", host
    return "phrase", None


def value_kind(value: str) -> str:
    """What a value is, by its spelling: email, url, iban, number, host or phrase.

    >>> [value_kind(v) for v in ["a@b.com", "www.b.com", "GB29NWBK60161331926819", "12 500", "b.com", "Le Marais"]]
    ['email', 'url', 'iban', 'number', 'host', 'phrase']
    """
    return _identity(value)[0]


def _is_word(text: str, at: int) -> bool:
    return 0 <= at < len(text) and (text[at].isalnum() or text[at] == "_")


def _stands_alone(phrase: str, text: str) -> bool:
    """Whether `phrase` occurs in `text` with no letter, digit or `_` right before or after
    it. Linear in both: a few direct searches, then one Knuth-Morris-Pratt pass (a phrase
    such as `aaa…ab` against `aaa…a` would make a search from every position quadratic)."""
    at = text.find(phrase)
    for _ in range(8):
        if at < 0:
            return False
        if not _is_word(text, at - 1) and not _is_word(text, at + len(phrase)):
            return True
        at = text.find(phrase, at + 1)
    fallback = [0] * len(phrase)
    k = 0
    for i in range(1, len(phrase)):
        while k and phrase[i] != phrase[k]:
            k = fallback[k - 1]
        if phrase[i] == phrase[k]:
            k += 1
        fallback[i] = k
    k = 0
    for i, ch in enumerate(text):
        while k and ch != phrase[k]:
            k = fallback[k - 1]
        if ch == phrase[k]:
            k += 1
        if k == len(phrase):
            if not _is_word(text, i - k) and not _is_word(text, i + 1):
                return True
            k = fallback[k - 1]
    return False


_EXTRACT: dict[str, Callable[[Text], list[str]]] = {
    "email": emails, "url": urls, "iban": ibans, "number": numbers, "host": hosts,
}


def mentions(text: Text, value: Any) -> bool:
    """Whether `text` names `value` as a whole value of its kind (`value_kind`): an address,
    web address, IBAN, number or host among those `text` holds, or else a phrase standing
    alone in it (not inside a longer word). The value is read whole, as the world's parser
    reads it (a suffix in other case, `ß`, user info or another authority is part of it);
    case and spacing do not matter in `text`. A part of a value, or a value with more to
    it, is not named, nor is an empty value, one with spaces around it or one not in
    Unicode's normal form (zero-width or full-width characters): the tool would get other
    characters than the ones the rule compared. A phrase that is a whole-word part of
    a longer one the text gives ("Le Marais" in "Le Marais Boutique") is named: without a
    list of the names that exist, the text cannot say where a name ends.

    >>> mentions("Send 50 to bob@example.com", "bob@example.co"), mentions("Send 50 to bob@example.com", "BOB@example.com")
    (False, True)
    >>> mentions("Send 50 to bob@example.com", "bob@example.com.Co"), mentions("see www.a.com", "https://evil.net?#@www.a.com")
    (False, False)
    >>> mentions("Book Le Marais Boutique", "le marais"), mentions("Book Le Marais Boutique", "Marai")
    (True, False)
    """
    if not isinstance(value, str):
        raise TypeError(f"mentions: the value must be a string, not {type(value).__name__}")
    if unicode_normalized(value) != value or value.strip() != value:  # the tool would read other characters than the rule
        return False
    kind, own = _identity(value)
    if kind == "phrase":
        phrase = normalized(value)
        return bool(phrase) and _stands_alone(phrase, normalized(text))
    if kind in ("iban", "number"):
        (own,) = _EXTRACT[kind](value) or [None]
    return own is not None and own in _EXTRACT[kind](text)


VALUE_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "emails": emails, "urls": urls, "hosts": hosts, "sites": sites, "ibans": ibans, "numbers": numbers, "quoted": quoted,
    "normalized": normalized, "mentions": mentions, "reveals": reveals,
}
"""The functions a policy condition may call besides CEL's own, by name."""
