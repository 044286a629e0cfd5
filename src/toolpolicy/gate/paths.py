"""File paths as the gate checks them: one normalised, symlink-resolved view per path.

A rule that matches path text loses to spellings: `docs/../../etc`, `..\\..`, `%2e%2e/`,
fullwidth dots that NFKC folds to `..`, `.env ` with a trailing space (which Windows and
some file servers strip), a symlink `notes.txt -> /etc/shadow`. So the policy does not
read the text; it reads `path_view`, which says:

    plain      the text is already in its one canonical spelling: no '..', no empty or
               whitespace-padded component, no backslash, no percent escape, no control
               or invisible character, unchanged by NFKC, and not starting with '~'.
               A tool given a plain path opens exactly the path the gate checked.
    inside     the path stays inside the work folder: as written, as normalised (NFKC,
               percent escapes decoded, backslashes as '/'), and after resolving the
               symlinks that exist in the folder on disk.
    relative   the normalised path relative to the work folder ("." for the folder;
               "" when it is not inside).
    resolved   the same after symlinks ("" when the folder is not on this disk).
    names      every component, lower-cased, with trailing dots and spaces removed (what
               Windows would open), as written, as normalised and as resolved: a secret
               behind a symlink or an odd spelling still shows up by name.
    secrets    the secret-file families (SECRET_FAMILIES) any of those names belongs to:
               "dotenv", "ssh key", "credentials", ... ([] when none). A policy forbids
               `size(parsed.path.secrets) > 0` instead of listing names, so `.env-production`,
               `id_ed25519_sk` and `credentials.yml` are caught with `.env`, `id_rsa` and
               `credentials.json`.
    problem    why the path is not plain, or not inside ("" when it is both).

A policy permits a path that is plain and inside and forbids by name on top. The view
is computed from the text and the folder on disk at decision time; a symlink created
after the decision and before the tool opens the file is the tool's to refuse (open
with O_NOFOLLOW, or confine the process), which this view cannot see.
"""

from __future__ import annotations

import os
import posixpath
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")
# Categories no path written for a person needs: controls, format (zero-width, bidi),
# separators other than the space, unassigned and private-use code points.
INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


@dataclass(frozen=True)
class WorkFolder:
    """The folder a policy confines paths to.

    name: the folder as the agent writes it, absolute (e.g. "/workspace"); a relative path
        is taken relative to it.
    disk: where that folder is on this machine, for resolving symlinks (default: `name`).
        A folder that does not exist is checked by spelling alone.
    """

    name: str
    disk: str = ""
    _real: str = field(default="", init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", posixpath.normpath(self.name))
        object.__setattr__(self, "disk", self.disk or self.name)
        real = os.path.realpath(self.disk) if os.path.isdir(self.disk) else ""
        object.__setattr__(self, "_real", real)

    @property
    def real(self) -> str:
        """The folder on disk with its own symlinks resolved, or "" when it does not exist."""
        return self._real


def path_view(text: str, folder: WorkFolder) -> dict[str, Any]:
    """The view of `text` described in the module docstring, as plain JSON for CEL."""
    normal = normalise(text)
    spellings = tuple(dict.fromkeys((text, normal)))  # the text as written, then as normalised
    within = [_relative_parts(written, folder.name) for written in spellings]
    resolved = [_resolve(parts, folder.real) for parts in within if parts is not None] if folder.real else []
    inside = all(parts is not None for parts in within) and all(found is not None for found in resolved)
    names = {name_key(part) for written in spellings for part in written.split("/")}
    names.update(name_key(part) for found in resolved if found is not None for part in found)
    spelling = _spelling_problem(text, normal)
    return {
        "plain": not spelling,
        "inside": inside,
        "relative": ("/".join(within[-1]) or ".") if inside else "",
        "resolved": ("/".join(resolved[-1]) or ".") if inside and resolved else "",
        "names": sorted(names - {""}),
        "secrets": secret_families(names),
        "problem": spelling or ("" if inside else "the path leaves the work folder"),
    }


SECRET_FAMILIES: dict[str, re.Pattern[str]] = {
    family: re.compile(pattern)
    for family, pattern in {
        "dotenv": r"\.envrc|[^/]*\.env(?:[._-][^/]*)?",  # .env, .env.production, .env-prod, .env_local, prod.env
        "ssh key": r"(?:[^/]*[._-])?id_(?:rsa|dsa|ecdsa|ed25519|ed448|xmss)[^/]*|identity(?:\.[^/]*)?|ssh_host_[^/]*"
                   r"|[^/]*\.ppk|authorized_keys[^/]*|known_hosts[^/]*",
        "ssh folder": r"\.ssh",
        "netrc": r"[._]netrc",
        "pgpass": r"\.pgpass|pgpass\.conf",
        "package manager tokens": r"\.npmrc|\.yarnrc(?:\.yml)?|\.pypirc|\.gem|\.cargo|\.composer|\.nuget|\.m2",
        "cloud credentials": r"\.aws|\.azure|gcloud|\.oci|\.docker|\.boto|\.s3cfg|\.vault-token|\.terraform\.d"
                             r"|\.gnupg|\.password-store|token\.(?:json|pickle)|[^/]*\.tfstate(?:\.[^/]*)?",
        "key file": r"[^/]*\.(?:pem|key|p12|pfx|jks|keystore|kdbx|ovpn|p8|ppk)",
        "kubeconfig": r"\.kube|kubeconfig(?:[._-][^/]*)?|[^/]*\.kubeconfig",
        "git credentials": r"\.git-credentials|\.gitcookies",
        "system passwords": r"shadow|gshadow|\.htpasswd",
    }.items()
}
"""Secret-file families, each a pattern a whole name (a path component, lower-cased, trailing dots
and spaces dropped) matches. Names are at most a few hundred characters and no pattern nests a
repetition, so matching is linear in the name. With WORD_FAMILIES, what `secrets` reports."""

WORD_FAMILIES: dict[str, frozenset[str]] = {
    "credentials": frozenset({"credential", "credentials", "creds"}),
    "secrets": frozenset({"secret", "secrets"}),
    "ssh key": frozenset({"rsa", "dsa", "ecdsa", "ed25519", "ed448"}),
    "passwords": frozenset({"password", "passwords"}),
}
"""Families a name belongs to when one of its words (split at '.', '_', '-' and spaces) is one of
these: `aws_credentials`, `credentials.yml`, `secrets_prod.json`, `client_secret_1.json`,
`deploy_rsa.pub`. A document or source file (PROSE_OR_CODE) named so is about secrets, not one:
`secret_santa_rules.md`, `credentials.py` hold text and code (exact-name families still apply)."""
_ANY_FAMILY = re.compile("|".join(f"(?:{pattern.pattern})" for pattern in SECRET_FAMILIES.values()))
PROSE_OR_CODE = frozenset("md markdown rst adoc html htm pdf tex py js ts go rs java c h cpp rb".split())
_WORDS = re.compile(r"[._\- ]+")
_ANY_WORD = re.compile("|".join(sorted({word for members in WORD_FAMILIES.values() for word in members})))
"""A name holding none of the family words as text holds none of them as a word."""


def secret_families(names: set[str] | list[str]) -> list[str]:
    """The families (SECRET_FAMILIES, WORD_FAMILIES) that any of `names` belongs to, sorted.

    >>> secret_families({"config", ".env-production"}), secret_families({"id_ed25519_sk"})
    (['dotenv'], ['ssh key'])
    >>> secret_families({"credentials.yml"}), secret_families({"secret_santa_rules.md"})
    (['credentials'], [])
    """
    found = set()
    for name in names:
        if _ANY_FAMILY.fullmatch(name):
            found.update(family for family, pattern in SECRET_FAMILIES.items() if pattern.fullmatch(name))
        if not _ANY_WORD.search(name):
            continue
        words = [word for word in _WORDS.split(name) if word]
        if words and (len(words) == 1 or words[-1] not in PROSE_OR_CODE):
            found.update(family for family, members in WORD_FAMILIES.items() if members.intersection(words))
    return sorted(found)


def normalise(text: str) -> str:
    """NFKC, percent escapes decoded (until none are left, at most 3 rounds), NFKC again,
    backslashes as '/': the spelling every layer between the agent and the disk could
    turn `text` into."""
    normal = unicodedata.normalize("NFKC", text)
    for _ in range(3):
        if not _PERCENT_ESCAPE.search(normal):
            break
        normal = unicodedata.normalize("NFKC", unquote(normal, errors="replace"))
    return normal.replace("\\", "/")


def _spelling_problem(text: str, normal: str) -> str:
    """Why `text` is not in canonical spelling, or "" when it is."""
    if not text:
        return "the path is empty"
    if any(invisible(ch) for ch in text):
        return "the path holds a control, invisible or non-space whitespace character"
    if normal != text:
        return "the path changes under Unicode NFKC, percent decoding or backslash conversion"
    if text.startswith("~"):
        return "the path starts with '~'"
    body = text[1:] if text.startswith("/") else text
    body = body.removesuffix("/") if body not in ("", "/") else body
    components = body.split("/") if body else []
    if text.startswith("./"):
        components = components[1:]
    for part in components:
        if part == "":
            return "the path has an empty component ('//')"
        if part == "..":
            return "the path climbs with '..'"
        if part == ".":
            if text != ".":
                return "the path has a '.' component inside it"
            continue
        if part != part.strip(" ") or part.endswith("."):
            return "a path component starts or ends with a space or ends with a dot"
    return ""


def invisible(ch: str) -> bool:
    """A character no name or word written for a person needs: a control, format,
    surrogate, private or unassigned code point, or whitespace other than the space."""
    return unicodedata.category(ch) in INVISIBLE or (ch.isspace() and ch != " ")


def _relative_parts(spelling: str, root: str) -> list[str] | None:
    """The components of `spelling` relative to the folder `root` once '.' and '..' are
    applied, or None when it is outside (an absolute path elsewhere, '~', or '..' past it)."""
    if spelling.startswith("~"):
        return None
    if spelling.startswith("/"):
        prefix = root.rstrip("/") + "/"
        if spelling.rstrip("/") == root.rstrip("/"):
            spelling = ""
        elif spelling.startswith(prefix):
            spelling = spelling[len(prefix) :]
        else:
            return None
    parts: list[str] = []
    for part in spelling.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return parts


def _resolve(parts: list[str], real_root: str) -> list[str] | None:
    """The components, relative to the folder, of the file `parts` names once symlinks on
    disk are followed; None when they lead out of the folder or the path cannot be resolved."""
    try:
        target = os.path.realpath(os.path.join(real_root, *parts))
    except (ValueError, OSError):  # an embedded NUL, a symlink loop on some platforms
        return None
    if target == real_root:
        return []
    if not target.startswith(real_root.rstrip(os.sep) + os.sep):
        return None
    return target[len(real_root.rstrip(os.sep)) + 1 :].split(os.sep)


def name_key(part: str) -> str:
    """A component as a case-insensitive file system that drops trailing dots and spaces
    would see it, so `.ENV.` and `.env ` are both `.env`."""
    return part.rstrip(". ").lower()
