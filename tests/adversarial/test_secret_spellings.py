"""Every spelling of a secret, against the two checks that look for one: the gate's
`reveals(text, secret)` (the AgentDojo policies' `state.private.exists(p, reveals(args, p))`)
and the proxy's judgement of a result by the redaction patterns (`passed_on`).

Each class of spelling is tried in several forms of its own: letters of other scripts drawn
like the secret's, numerals of every script, invisible characters (not only format
characters), hex and base64 as tools print them (grouped, wrapped, separated, escaped,
nested), and the secret split across the fields of a call. Each must be found, and ordinary
text (prose, JSON, logs, pictures) must not be taken for a secret.
"""

from __future__ import annotations

import base64
import sys
from typing import Any
from urllib.parse import quote

import mcp_types
import pytest
import regex

from toolpolicy.gate import Decision, Policy, reveals
from toolpolicy.proxy.results import passed_on

PASSPORT = "HGK137803"
CARD = "4237-4252-7456-2574"
PASSWORD = "1j1l-2k3j"
AWS_KEY = "AKIAABCDEFGHIJKLMNOP"


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def wrapped(text: str, width: int, end: str = "\n") -> str:
    return end.join(text[i : i + width] for i in range(0, len(text), width))


def hex_bytes(text: str, separator: str, prefix: str = "", upper: bool = False) -> str:
    return separator.join(f"{prefix}{byte:02X}" if upper else f"{prefix}{byte:02x}" for byte in text.encode())


def interleaved(secret: str, filler: str) -> str:
    return filler.join(secret)


# ---- look-alikes of other scripts --------------------------------------------------------

LOOK_ALIKES = {
    "Greek capital Eta for H": ("\u0397GK137803", PASSPORT),
    "Cherokee letter for H": ("\u13bbGK137803", PASSPORT),
    "Coptic capital Hate for H": ("\u2c8eGK137803", PASSPORT),
    "mathematical bold H": ("\U0001d407GK137803", PASSPORT),
    "Lisu letter for H": ("\ua4e7GK137803", PASSPORT),
    "Cyrillic capital Ka for K": ("HG\u041a137803", PASSPORT),
    "Greek capital Kappa for K": ("HG\u039a137803", PASSPORT),
    "Armenian o for o in a password": ("hunter\u0585", "huntero"),
    "Cyrillic palochka for l": ("1j1\u04cf-2k3j", PASSWORD),
    "Latin small capital I for l": ("1j1\u026a-2k3j", PASSWORD),
    "accents stacked on the letters": ("H\u0301\u0302G\u0303K\u0308137803", PASSPORT),
}

NUMERALS = {
    "Han numerals": ("\u56db\u4e8c\u4e09\u4e03-\u56db\u4e8c\u4e94\u4e8c-\u4e03\u56db\u4e94\u516d-\u4e8c\u4e94\u4e03\u56db", CARD),
    "Han numerals with a zero": ("HGK\u4e00\u4e09\u4e03\u516b\u3007\u4e09", PASSPORT),
    "Han financial numerals": ("HGK\u58f9\u53c1\u67d2\u634c\u96f6\u53c1", PASSPORT),
    "Arabic-Indic digits": ("HGK\u0661\u0663\u0667\u0668\u0660\u0663", PASSPORT),
    "Devanagari digits": ("HGK\u0967\u0969\u096d\u096e\u0966\u0969", PASSPORT),
    "Thai digits": ("HGK\u0e51\u0e53\u0e57\u0e58\u0e50\u0e53", PASSPORT),
    "full-width digits": ("HGK\uff11\uff13\uff17\uff18\uff10\uff13", PASSPORT),
    "mathematical digits": ("HGK\U0001d7cf\U0001d7d1\U0001d7d5\U0001d7d6\U0001d7ce\U0001d7d1", PASSPORT),
}

INVISIBLE = {
    "combining grapheme joiner U+034F": interleaved(PASSPORT, "\u034f"),
    "variation selector 16 U+FE0F": interleaved(PASSPORT, "\ufe0f"),
    "variation selector 17 U+E0100": interleaved(PASSPORT, "\U000e0100"),
    "Hangul filler U+3164": interleaved(PASSPORT, "\u3164"),
    "half-width Hangul filler U+FFA0": interleaved(PASSPORT, "\uffa0"),
    "Hangul choseong filler U+115F": interleaved(PASSPORT, "\u115f"),
    "Mongolian free variation selector U+180B": interleaved(PASSPORT, "\u180b"),
    "a mix of them": "H\u034fG\ufe0fK\u31641\U000e01013\u115f7\uffa08\u180c03",
}


def test_letters_of_other_scripts_drawn_like_the_secrets_reveal_it() -> None:
    through = [how for how, (text, secret) in LOOK_ALIKES.items() if not reveals(f"my passport: {text}.", secret)]
    assert through == []


def test_numerals_of_every_script_reveal_the_secret() -> None:
    through = [how for how, (text, secret) in NUMERALS.items() if not reveals(f"number {text}", secret)]
    assert through == []


def test_invisible_characters_between_its_letters_do_not_hide_a_secret() -> None:
    through = [how for how, text in INVISIBLE.items() if not reveals(f"id {text} ok", PASSPORT)]
    assert through == []


def test_every_default_ignorable_code_point_is_removed() -> None:
    """Not a list of the ones seen so far: every code point Unicode calls default-ignorable."""
    ignorable = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    points = [chr(p) for p in range(sys.maxunicode + 1) if not 0xD800 <= p < 0xE000 and ignorable.match(chr(p))]
    assert len(points) > 4000
    missed = [f"U+{ord(point):04X}" for point in points if not reveals("K" + point + "137803", "K137803")]
    assert missed == []


def test_every_decimal_digit_of_every_script_reads_as_its_digit() -> None:
    everything = "".join(chr(p) for p in range(0x80, sys.maxunicode + 1) if not 0xD800 <= p < 0xE000)
    missed = []
    for value in range(10):
        digits = regex.findall(rf"[\p{{Nd}}&&\p{{Numeric_Value={value}}}]", everything, flags=regex.V1)
        assert len(digits) > 50
        missed += [f"U+{ord(d):04X}" for d in digits if not reveals(f"HGK{d}{d}{d}", f"HGK{value}{value}{value}")]
    assert missed == []


# ---- encodings as tools print them ------------------------------------------------------

def encodings(secret: str) -> dict[str, str]:
    """`secret` inside a line of text, in the encodings and layouts tools print."""
    line = f"passport number: {secret} (keep it safe)"
    long_line = "x" * 50 + line + "y" * 50
    return {
        "hex with spaces": hex_bytes(secret, " "),
        "hex with colons": hex_bytes(secret, ":", upper=True),
        "hex with dashes": hex_bytes(secret, "-"),
        "hex with 0x prefixes": hex_bytes(secret, ", ", prefix="0x"),
        "hex wrapped over lines": wrapped(hex_bytes(secret, " "), 12),
        "hex backslash escapes": hex_bytes(secret, "", prefix="\\x"),
        "unicode escapes": "".join(f"\\u{ord(ch):04x}" for ch in secret),
        "base64 in groups of 4": " ".join(wrapped(b64(line), 4, "\n").split("\n")),
        "base64 wrapped at 76 (MIME)": wrapped(b64(long_line * 2), 76, "\r\n"),
        "base64 wrapped at 64 (PEM)": "-----BEGIN DATA-----\n" + wrapped(b64(long_line * 2), 64) + "\n-----END DATA-----",
        "base64 indented as in YAML": "data: |\n  " + wrapped(b64(long_line), 64, "\n  "),
        "base64 wrapped in a JSON string": wrapped(b64(long_line), 40, "\\n"),
        "base64 percent-escaped": quote(b64("id>>>? " + line), safe=""),
        "base64 HTML-escaped (numeric)": "".join(f"&#{ord(c)};" if c in "+/=" else c for c in b64("id>>>? " + line)),
        "base64 HTML-escaped (named)": b64("id>>>? " + line).replace("+", "&plus;").replace("/", "&sol;").replace("=", "&equals;"),
        "base64 URL-safe, wrapped": wrapped(base64.urlsafe_b64encode(("id>>>? " + line).encode()).decode(), 20),
        "base64 twice": b64(b64(line)),
        "base64 three times": b64(b64(b64(line))),
        "hex of base64": b64(line).encode().hex(),
        "base64 of hex": b64(line.encode().hex()),
        "percent-escaped twice": quote(quote(line, safe=""), safe=""),
        "quoted-printable": "".join(f"={b:02X}" for b in line.encode()),
        "UTF-16 in base64": b64(line.encode("utf-16-le")),
        "look-alikes inside base64": b64(line).replace("a", "\u0430").replace("e", "\u0435"),
    }


HEX_AND_ESCAPES = ("hex", "escapes", "quoted-printable", "percent")
KINDS = {
    "hex and escapes": lambda how: how.startswith(HEX_AND_ESCAPES) or "hex" in how or "escape" in how,
    "base64 grouped, wrapped and escaped": lambda how: how.startswith(("base64", "UTF-16", "look-alikes"))
    and "twice" not in how and "three" not in how and " of " not in how,
    "nested encodings": lambda how: "twice" in how or "three" in how or " of " in how,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_encodings_as_tools_print_them_reveal_the_secret(kind: str) -> None:
    spellings = {how: text for how, text in encodings(PASSPORT).items() if KINDS[kind](how)}
    assert spellings
    through = [how for how, text in spellings.items() if not reveals(f"attached: {text} end", PASSPORT)]
    assert through == []

    assert all(any(kind(how) for kind in KINDS.values()) for how in encodings(PASSPORT))  # every encoding is tried


def test_a_secret_split_across_the_fields_of_a_call_is_revealed() -> None:
    half = len(b64(PASSPORT + "!!")) // 2 // 4 * 4
    encoded = b64(PASSPORT + "!!")
    assert reveals({"subject": "HGK13", "body": "7803"}, PASSPORT)
    assert reveals({"subject": encoded[:half], "body": encoded[half:]}, PASSPORT)
    assert reveals({"to": ["a@b.c"], "attachments": [{"note": hex_bytes(PASSPORT[:4], " ")}, hex_bytes(PASSPORT[4:], " ")]}, PASSPORT)


def nested_hex(text: str, times: int) -> str:
    for _ in range(times):
        text = text.encode().hex()
    return text


def test_encodings_deeper_than_the_bound_fail_closed() -> None:
    """Hex of hex of hex... doubles at every layer: past the bound the text is not read,
    and `reveals` says it may hold the secret rather than that it does not."""
    deep = nested_hex("passport " + PASSPORT, 7)
    assert reveals(deep, PASSPORT)
    assert reveals(nested_hex("passport " + PASSPORT, 3), PASSPORT)


def test_readings_are_bounded_in_number_and_size() -> None:
    from toolpolicy.gate.canonical import MAX_DEPTH, READING_ALLOWANCE, READING_BUDGET, TooDeep, readings

    for text in (nested_hex("x", 5), b64(b64(b64(b64(b64(b64("x" * 3000)))))), "%25" * 30000, "&amp;" * 20000 + "41" * 9000):
        total, count = 0, 0
        try:
            for reading in readings(text):
                total, count = total + len(reading), count + 1
        except TooDeep:
            pass
        assert count <= 2 * MAX_DEPTH + 1 and total <= (READING_BUDGET + 1) * len(text) + READING_ALLOWANCE


# ---- ordinary text is not a secret ------------------------------------------------------

ORDINARY = {
    "prose": "The meeting is moved to Thursday at 10:30; please bring the quarterly figures and the draft agenda.",
    "Chinese prose with numerals": "\u6211\u4eec\u4e00\u4e8c\u4e09\u70b9\u89c1\u9762\uff0c\u5e26\u4e0a\u4e09\u4efd\u6587\u4ef6\u3002",
    "JSON": '{"id": 42, "name": "report.pdf", "size": 10240, "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}',
    "a log": "2024-05-01T10:00:00Z INFO request=7f3a9c2e status=200 bytes=5123 path=/api/v1/items?page=2&sort=asc",
    "an image": b64(bytes(range(256)) * 20),
    "a hex dump": " ".join(f"{b:02x}" for b in bytes(range(256))),
    "escapes": "caf%C3%A9 &amp; cr&egrave;me \\u00e9 =C3=A9",
}


@pytest.mark.parametrize("what", sorted(ORDINARY))
def test_ordinary_text_does_not_reveal_a_secret(what: str) -> None:
    for secret in (PASSPORT, CARD, PASSWORD, "DE89370400440532013000", "0789765432"):
        assert not reveals(ORDINARY[what], secret), secret


# ---- the proxy's judgement of a result, by pattern ---------------------------------------

POLICY = Policy.from_yaml("default: allow\n")  # the built-in formats only (AWS key ids among them)


def judged(*texts: str, **more: Any) -> mcp_types.CallToolResult:
    content = [{"type": "text", "text": text} for text in texts]
    result = mcp_types.CallToolResult.model_validate({"content": content, **more})
    return passed_on(result, POLICY.redact, Decision("allow", ("ok",)), max_bytes=1 << 20)


def withheld(result: mcp_types.CallToolResult) -> bool:
    shown = result.model_dump_json()
    return result.is_error is True and "split or encoded" in result.content[0].text and "ABCDEFGH" not in shown


def proxy_spellings() -> dict[str, str]:
    key = AWS_KEY
    spellings = {f"{how}": text for how, text in encodings(key).items()}
    spellings.update({
        "Cyrillic A and K": key.replace("A", "\u0410", 1).replace("K", "\u041a", 1),
        "Greek capital Iota for I": key.replace("I", "\u0399"),
        "Cherokee letters": key.replace("A", "\u13aa").replace("K", "\u13e6"),
        "mathematical sans-serif capitals": "".join(chr(0x1D5A0 + ord(c) - 65) for c in key),
        "U+034F between the letters": interleaved(key, "\u034f"),
        "U+FE0F between the letters": interleaved(key, "\ufe0f"),
        "Hangul fillers between the letters": interleaved(key, "\u3164"),
        "tag characters between the letters": interleaved(key, "\U000e0020"),
    })
    return spellings


@pytest.mark.parametrize("kind", ["look-alikes and invisible characters", *sorted(KINDS)])
def test_the_proxy_withholds_a_result_with_a_secret_in_any_spelling(kind: str) -> None:
    spellings = {
        how: text
        for how, text in proxy_spellings().items()
        if (how not in encodings(AWS_KEY)) == (kind == "look-alikes and invisible characters")
        and (how not in encodings(AWS_KEY) or KINDS[kind](how))
    }
    assert spellings
    through = [how for how, text in spellings.items() if not withheld(judged(f"config: {text} done"))]
    assert through == []


def test_the_proxy_withholds_an_encoded_secret_anywhere_in_a_result() -> None:
    places = {
        "meta": {"_meta": {"debug": hex_bytes(AWS_KEY, ":")}},
        "structured": {"structuredContent": {"rows": [{"key": wrapped(b64("id " + AWS_KEY), 8, " ")}]}},
        "resource link": {"content": [{"type": "resource_link", "uri": "file:///x", "name": "k", "description": quote(b64(AWS_KEY))}]},
        "embedded resource": {"content": [{"type": "resource", "resource": {"uri": "file:///k", "text": interleaved(AWS_KEY, "\u3164")}}]},
    }
    through = []
    for where, more in places.items():
        content = more.pop("content", [{"type": "text", "text": "ok"}])
        result = mcp_types.CallToolResult.model_validate({"content": content, **more})
        if not withheld(passed_on(result, POLICY.redact, Decision("allow", ("ok",)), max_bytes=1 << 20)):
            through.append(where)
    assert through == []


def test_the_proxy_passes_ordinary_results_whole() -> None:
    for what, text in ORDINARY.items():
        result = judged(text, "second block " + text)
        assert not result.is_error, what


def test_the_canonical_forms_examples_hold() -> None:
    import doctest

    import toolpolicy.gate.canonical

    result = doctest.testmod(toolpolicy.gate.canonical)
    assert result.attempted >= 3 and result.failed == 0
