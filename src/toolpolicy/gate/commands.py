"""Command lines as the gate checks them: an argv, not shell text.

A regular expression over shell text is not a policy: the shell expands braces, globs,
`$(...)`, backticks, variables and `~`, chains with `;`, `&&` and `|`, redirects with
`>`, and read-only-looking programs write (`git diff --output=F`, `find -fls F`,
`sort -o F`, `uniq IN OUT`, `tree -o F`) or run others (`find -exec`, `git -c
core.pager=...`, `sort --compress-program`). So `command_view` accepts only a small
subset of the shell language in which no expansion can happen, and within it only
programs whose command lines it knows, with their known read-only flags:

- Words are separated by spaces. Outside quotes a word may hold only letters, digits
  and `_ . / - + = : , @ %`; a word may not start with `=` (zsh's `=cmd`). Inside
  '...' anything printable but `'`; inside "..." anything printable but `" $ ` \\ !`.
  In this subset a POSIX shell produces exactly the words that `split_words` returns
  (tests/test_gate_parse.py compares them with sh, bash and dash on random lines), so
  the argv the gate checks is the argv that runs, through a shell or (better) passed
  straight to exec without one.
- The first word is a program in GRAMMARS (git: a subcommand in GIT_SUBCOMMANDS, with
  no global options before it). Each flag must be one the grammar lists, spelt out in
  full (getopt would expand an abbreviation to whatever it abbreviates); a flag that
  takes a value gets it from `--flag=value`, the next word, or the rest of a short flag,
  except a flag whose value is optional (`grep --color`, `git log --pretty`), which
  takes one only when it is attached, exactly as getopt reads it.
- Every operand or flag value that names a file becomes a path view (gate/paths.py),
  so traversal, symlinks and secret names are checked as for the file tools.
- git reads its repository's configuration, which can run programs (core.pager,
  core.fsmonitor, diff.external, core.sshCommand). `own_repository` is true only when
  the work folder's `.git` is a real directory (not a file pointing elsewhere, not a
  symlink); the policy keeps its contents out of the agent's reach.

- A program that reads the files inside a folder it is given (FOLDER_READERS: `grep -r`,
  `diff DIR1 DIR2`, `diff -N`) has those files found on disk when the decision is made, and
  their names, secret families and whether a followed symlink leads out are part of the
  view, so `diff -N . empty` is refused where `cat .env` is. Programs the grammar does not
  know (cp, tar, rsync, python ...) and flags it does not know (find -exec, -fprint, grep -R,
  git diff --no-index) are refused; shell globs never reach a program (`*` is not in the
  subset, and inside quotes it is a literal name).

What the view cannot see: what is already committed to the repository (`git log -p`,
`git show`, `git diff` print what git tracks, whatever its name on disk is now), a hard link
to a secret under another name, and files that change between the decision and the run.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolpolicy.gate.paths import WorkFolder, invisible, name_key, path_view, secret_families

_PLAIN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./-+=:,@%")
_NOT_IN_DOUBLE_QUOTES = frozenset('"$`\\!')
_INTEGER = re.compile(r"[+-]?[0-9]{1,9}")
_PROGRAM = re.compile(r"[a-z0-9][a-z0-9._+-]*")

# Value kinds: "path" becomes a path view; "int" must be an integer; "text" is any word.
Kind = str


@dataclass(frozen=True)
class Grammar:
    """One program's (or git subcommand's) command line.

    switches: flags without a value, long ("--all") or short ("-l"; short ones combine: "-la").
    options: flags with a value -> the value's kind ("path", "int", "text").
    attached: flags whose value is optional -> its kind. The program takes such a value
        only when it is attached ("--color=never", "-U5"); written alone the flag takes
        none, and the next word is the program's next argument, not the flag's value.
    operands: what the words that are not flags are: "paths"; "pattern, paths" (grep: the
        first is the pattern unless -e gave one); "text"; "format" (date: +FORMAT only);
        "revisions, paths" (git: a word
        with ':' is a revision:path, checked as the path after ':'; other words are checked
        as paths too, which a revision name passes).
    max_operands: how many operands at most (None: any number).
    numeric_count: "-5" is short for a count (head, tail, git log).
    """

    switches: frozenset[str] = frozenset()
    options: Mapping[str, Kind] = field(default_factory=dict)
    attached: Mapping[str, Kind] = field(default_factory=dict)
    operands: str = "paths"
    max_operands: int | None = None
    numeric_count: bool = False


def _grammar(
    switches: str = "", options: Mapping[str, Kind] | None = None, attached: Mapping[str, Kind] | None = None, **rest: Any
) -> Grammar:
    return Grammar(frozenset(switches.split()), dict(options or {}), dict(attached or {}), **rest)


_COUNTS = {"-n": "int", "--lines": "int", "-c": "int", "--bytes": "int"}
_GIT_LOG = (
    "--oneline --stat --shortstat --numstat --name-only --name-status --graph --decorate --no-decorate "
    "--no-color --reverse --first-parent --no-merges --merges --all -p --patch --abbrev-commit"
)
_GIT_LOG_OPTIONS = {
    "-n": "int", "--max-count": "int", "--skip": "int", "--since": "text", "--after": "text", "--until": "text",
    "--before": "text", "--author": "text", "--grep": "text", "--date": "text",
}
_GIT_LOG_ATTACHED = {"--format": "text", "--pretty": "text"}

GRAMMARS: dict[str, Grammar] = {
    "ls": _grammar("-l -a -A -h -R -t -r -S -1 -d -F -p -i -s -n -C -x -X -U --all --almost-all "
                   "--human-readable --recursive --reverse --directory --classify"),
    "cat": _grammar("-n -b -A -E -s -T -v -e -t --number --number-nonblank --squeeze-blank --show-all"),
    "head": _grammar("-q -v --quiet --verbose", _COUNTS, numeric_count=True),
    "tail": _grammar("-q -v --quiet --verbose", _COUNTS, numeric_count=True),
    "wc": _grammar("-l -w -c -m -L --lines --words --bytes --chars --max-line-length"),
    "grep": _grammar(
        "-r -n -i -l -L -c -v -w -x -E -F -G -P -H -h -o -s -q -I -z --recursive --line-number --ignore-case "
        "--files-with-matches --files-without-match --count --invert-match --word-regexp --line-regexp "
        "--extended-regexp --fixed-strings --with-filename --no-filename --only-matching --no-messages --quiet",
        {"-e": "text", "--regexp": "text", "-A": "int", "-B": "int", "-C": "int", "-m": "int", "--max-count": "int",
         "--include": "text", "--exclude": "text", "--exclude-dir": "text",
         "--after-context": "int", "--before-context": "int", "--context": "int"},
        {"--color": "text", "--colour": "text"},
        operands="pattern, paths",
    ),
    "echo": _grammar("-n", operands="text"),
    "pwd": _grammar(max_operands=0),
    "sort": _grammar("-r -n -u -f -b -h -V -M -g -s -c --reverse --numeric-sort --unique --ignore-case "
                     "--human-numeric-sort --version-sort --stable", {"-k": "text", "--key": "text", "-t": "text",
                                                                       "--field-separator": "text"}),
    "uniq": _grammar("-c -d -u -i --count --repeated --unique --ignore-case", {"-f": "int", "-s": "int"},
                     max_operands=1),  # a second operand is the file uniq writes
    "diff": _grammar("-u -q -N -w -b -i -B -a --brief --unified --ignore-all-space --ignore-case --text",
                     {"-U": "int"}, max_operands=2),
    "file": _grammar("-b -i -z --brief --mime --mime-type --mime-encoding"),
    "du": _grammar("-s -h -a -c -k -m -b --summarize --human-readable --all --total", {"-d": "int",
                                                                                       "--max-depth": "int"}),
    "stat": _grammar("-t --terse", {"-c": "text", "--format": "text", "--printf": "text"}),
    "tree": _grammar("-a -d -f -i -F -s -h -D --noreport --dirsfirst", {"-L": "int"}),
    "date": _grammar("-u -R --utc --rfc-email", operands="format", max_operands=1),  # only +FORMAT: others set the clock
    # Installing runs the package's own code; the policy decides (the shipped one asks a person).
    "pip": _grammar("--upgrade -U --user --no-deps -q --quiet", operands="text"),
    "pip3": _grammar("--upgrade -U --user --no-deps -q --quiet", operands="text"),
    "npm": _grammar("--save-dev -D --no-save", operands="text"),
}
INSTALLERS = {"pip": "install", "pip3": "install", "npm": "install"}
"""Programs that are understood only with this subcommand in front of their operands."""

GIT_SUBCOMMANDS: dict[str, Grammar] = {
    "status": _grammar("-s -b --short --branch --long --porcelain --ignored", attached={"--untracked-files": "text"}),
    "log": _grammar(_GIT_LOG, _GIT_LOG_OPTIONS, _GIT_LOG_ATTACHED, operands="revisions, paths", numeric_count=True),
    "show": _grammar(_GIT_LOG, _GIT_LOG_OPTIONS, _GIT_LOG_ATTACHED, operands="revisions, paths"),
    "diff": _grammar("--stat --shortstat --numstat --name-only --name-status --cached --staged --no-color -w -b "
                     "--ignore-all-space --patience --histogram --word-diff --no-ext-diff --no-textconv",
                     attached={"-U": "int", "--unified": "int"}, operands="revisions, paths"),
    "branch": _grammar("-a -r -v -vv --list --all --remotes --show-current", max_operands=0),
}

FIND_PREDICATES: dict[str, Kind | None] = {
    "-name": "text", "-iname": "text", "-path": "text", "-ipath": "text", "-type": "text", "-maxdepth": "int",
    "-mindepth": "int", "-size": "text", "-mtime": "text", "-mmin": "text", "-newer": "path", "-empty": None,
    "-print": None, "-print0": None, "-not": None, "-a": None, "-o": None, "-and": None, "-or": None,
}
"""find's expression words the grammar allows, and the kind of their value (None: none).
Left out on purpose: -exec, -execdir, -ok, -okdir, -delete, -fprint*, -fls, -printf to a
file, and -L/-H/-follow (which leave the folder through symlinks)."""


class _Refused(Exception):
    """A command line outside the grammar; the message says why, for the view's `problem`."""


def command_view(text: str, folder: WorkFolder) -> dict[str, Any]:
    """The view of a command line described in the module docstring, as plain JSON for CEL:
    {ok, problem, argv, program, subcommand, paths, names, secrets, inside, reads, own_repository}.

    `names` and `secrets` cover every file the command reads: the files it names and, for a
    program that reads the files inside a folder it is given (FOLDER_READERS), every file
    there, found on disk; `reads` lists those folders (relative to the work folder)."""
    view: dict[str, Any] = {"ok": False, "problem": "", "argv": [], "program": "", "subcommand": "",
                            "paths": [], "names": [], "secrets": [], "inside": True, "reads": [],
                            "own_repository": False}
    try:
        argv = split_words(text)
        view["argv"] = argv
        program, subcommand, words = _program(argv)
        view["program"], view["subcommand"] = program, subcommand
        flags: set[str] = set()
        files = _find_files(words) if program == "find" else _files(_grammar_of(program, subcommand), words, flags)
        reading = _folder_reading(program, flags)
        if reading is not None and not files and reading == "tree":
            files = ["."]  # grep -r with no file reads the folder it runs in
        paths = [path_view(name, folder) for name in files]
        names = {name for path in paths for name in path["names"]}
        inside = all(path["plain"] and path["inside"] for path in paths)
        reads: list[str] = []
        if reading is not None and inside:
            found, reads, inside = _files_in_folders(paths, folder, follow=reading == "entries", below=reading == "tree")
            names |= found
    except _Refused as refusal:
        view["problem"] = str(refusal)
        return view
    view.update(
        ok=True,
        paths=paths,
        names=sorted(names),
        secrets=secret_families(names),
        inside=inside,
        reads=reads,
        own_repository=program == "git" and _is_real_directory(folder, ".git"),
    )
    return view


FOLDER_READERS: dict[str, tuple[frozenset[str] | None, str]] = {
    "grep": (frozenset({"-r", "--recursive"}), "tree"),
    "diff": (None, "entries"),
}
"""Programs that read the files inside a folder operand: with one of the flags (None: always),
"tree" (every file below it, symlinks met inside not followed, as `grep -r` reads) or
"entries" (the files directly in it, symlinks followed, as `diff DIR1 DIR2` compares them and
`-N` prints those only one side has). The other known programs read only the files they name
(`cat DIR`, `head DIR`, `wc DIR` fail on a folder) or only list names (ls, find, tree, du, stat).
MAX_FILES_READ bounds the walk: a command reaching more files is refused."""
MAX_FILES_READ = 10_000


def _folder_reading(program: str, flags: set[str]) -> str | None:
    """How `program` with `flags` reads its folder operands ("tree", "entries"), or None."""
    rule = FOLDER_READERS.get(program)
    if rule is None:
        return None
    needs, how = rule
    return how if needs is None or needs & flags else None


def _files_in_folders(paths: list[dict[str, Any]], folder: WorkFolder, follow: bool,
                      below: bool) -> tuple[set[str], list[str], bool]:
    """The names of every file the program reads inside the folders among `paths` (each
    component of its path, as path views name them), those folders, and whether every file
    it reaches stays inside the work folder (a followed symlink may lead out). `below`: the
    folders below too; `follow`: symlinks among the files are read through (their targets'
    names count), else skipped. _Refused when the work folder is not on this disk (what a
    folder holds cannot be seen) or the folders hold more than MAX_FILES_READ entries."""
    if not folder.real:
        raise _Refused("the work folder is not on this machine, so the files inside a folder this command reads "
                       "cannot be checked")
    names: set[str] = set()
    reads: list[str] = []
    inside, seen = True, 0
    for path in paths:
        relative = path["resolved"] or path["relative"]
        top = os.path.join(folder.real, relative) if relative != "." else folder.real
        if not os.path.isdir(top):
            continue
        reads.append(relative)
        pending = [(top, "" if relative == "." else relative)]
        while pending:
            current, within = pending.pop()
            try:
                with os.scandir(current) as listing:
                    entries = list(listing)
            except OSError:
                continue
            seen += len(entries)
            if seen > MAX_FILES_READ:
                raise _Refused(f"the command reads more than {MAX_FILES_READ:,} files inside {relative!r}; "
                               "name narrower folders or files")
            for entry in entries:
                place = f"{within}/{entry.name}" if within else entry.name
                if entry.is_symlink():
                    if follow:
                        target = path_view(place, folder)
                        names.update(target["names"])
                        inside = inside and target["inside"]
                    continue  # grep -r does not follow a symlink it meets inside the folder
                if entry.is_dir(follow_symlinks=False):
                    if below:
                        names.add(name_key(entry.name))
                        pending.append((entry.path, place))
                    continue
                names.add(name_key(entry.name))
        names.update(name_key(part) for part in relative.split("/") if part != ".")
    return names - {""}, reads, inside


def split_words(text: str) -> list[str]:
    """The words of `text` in the quoting-only subset (module docstring); _Refused otherwise."""
    words: list[str] = []
    word: list[str] = []
    started = False  # a word has begun (quotes can make an empty one)
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == " ":
            if started:
                words.append("".join(word))
                word, started = [], False
            i += 1
            continue
        if ch in "'\"":
            end = text.find(ch, i + 1)
            if end < 0:
                raise _Refused(f"an unclosed {ch} quote")
            quoted = text[i + 1 : end]
            bad = next((c for c in quoted if invisible(c) or (ch == '"' and c in _NOT_IN_DOUBLE_QUOTES)), None)
            if bad is not None:
                raise _Refused(f"{bad!r} inside {ch}...{ch} quotes")
            word.append(quoted)
            started = True
            i = end + 1
            continue
        if ch not in _PLAIN_CHARS:
            raise _Refused(f"{ch!r} outside quotes (shell syntax, an expansion or an odd character)")
        if ch == "=" and not started:
            raise _Refused("a word starting with '=' outside quotes")
        word.append(ch)
        started = True
        i += 1
    if started:
        words.append("".join(word))
    if not words:
        raise _Refused("an empty command")
    return words


def _program(argv: list[str]) -> tuple[str, str, list[str]]:
    """(program, subcommand or "", the words after them); _Refused for an unknown program."""
    program, rest = argv[0], argv[1:]
    if not _PROGRAM.fullmatch(program) or (program not in GRAMMARS and program not in ("git", "find")):
        raise _Refused(f"{program[:40]!r} is not a program the gate knows")
    if program == "git" or program in INSTALLERS:
        expected = GIT_SUBCOMMANDS if program == "git" else {INSTALLERS[program]: None}
        if not rest or rest[0] not in expected:
            raise _Refused(f"{program} needs one of {', '.join(expected)} right after it (no options before it)")
        return program, rest[0], rest[1:]
    return program, "", rest


def _grammar_of(program: str, subcommand: str) -> Grammar:
    return GIT_SUBCOMMANDS[subcommand] if program == "git" else GRAMMARS[program]


def _files(grammar: Grammar, words: list[str], flags: set[str] | None = None) -> list[str]:
    """The file names among `words` (flag values and operands), checking every flag; the flags
    seen are added to `flags`."""
    files: list[str] = []
    operands: list[str] = []
    pattern_given = False
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            operands.extend(words[i:])
            break
        if word == "-":
            raise _Refused("'-' (standard input) as an operand")
        if not word.startswith("-"):
            operands.append(word)
            continue
        if grammar.numeric_count and _INTEGER.fullmatch(word):
            continue
        for flag, kind, value, used_next in _flags(grammar, word, words[i] if i < len(words) else None):
            i += used_next
            if flags is not None:
                flags.add(flag)
            if kind is not None:
                _check_value(flag, kind, value, files)
                pattern_given |= flag in ("-e", "--regexp")
    if grammar.max_operands is not None and len(operands) > grammar.max_operands:
        raise _Refused(f"more than {grammar.max_operands} operand(s)")
    if grammar.operands == "pattern, paths" and not pattern_given:
        if not operands:
            raise _Refused("no pattern")
        operands = operands[1:]
    if grammar.operands == "format" and any(not operand.startswith("+") for operand in operands):
        raise _Refused("an operand that is not a +FORMAT")
    if grammar.operands in ("text", "format"):
        return files
    for operand in operands:
        files.append(operand.split(":", 1)[1] if grammar.operands == "revisions, paths" and ":" in operand else operand)
    return [name for name in files if name]


def _flags(grammar: Grammar, word: str, following: str | None) -> list[tuple[str, Kind | None, str, int]]:
    """The flags in one word: (flag, kind of its value or None, value, 1 if it took the next word)."""
    if word.startswith("--"):
        name, has_value, value = word.partition("=")
        if name in grammar.switches and not has_value:
            return [(name, None, "", 0)]
        if name in grammar.attached:
            return [(name, grammar.attached[name], value, 0) if has_value else (name, None, "", 0)]
        if name in grammar.options:
            if has_value:
                return [(name, grammar.options[name], value, 0)]
            if following is None:
                raise _Refused(f"{name} needs a value")
            return [(name, grammar.options[name], following, 1)]
        raise _Refused(f"the flag {name[:40]!r} is not one the gate knows for this command")
    found: list[tuple[str, Kind | None, str, int]] = []
    for position, letter in enumerate(word[1:], start=1):
        flag = "-" + letter
        if flag in grammar.switches:
            found.append((flag, None, "", 0))
            continue
        if flag in grammar.attached:
            attached = word[position + 1 :]
            return [*found, (flag, grammar.attached[flag], attached, 0) if attached else (flag, None, "", 0)]
        if flag in grammar.options:
            attached = word[position + 1 :]
            if attached:
                return [*found, (flag, grammar.options[flag], attached, 0)]
            if following is None:
                raise _Refused(f"{flag} needs a value")
            return [*found, (flag, grammar.options[flag], following, 1)]
        raise _Refused(f"the flag {flag!r} (in {word[:40]!r}) is not one the gate knows for this command")
    return found


def _check_value(flag: str, kind: Kind, value: str, files: list[str]) -> None:
    if kind == "int" and not _INTEGER.fullmatch(value):
        raise _Refused(f"{flag} needs a whole number, not {value[:40]!r}")
    if kind == "path":
        files.append(value)


def _find_files(words: list[str]) -> list[str]:
    """find's starting points (the words before the expression) and the paths in its expression."""
    files: list[str] = []
    i = 0
    while i < len(words) and not words[i].startswith("-"):
        files.append(words[i])
        i += 1
    while i < len(words):
        word = words[i]
        if word not in FIND_PREDICATES:
            raise _Refused(f"find {word[:40]!r} is not a predicate the gate knows")
        kind = FIND_PREDICATES[word]
        i += 1
        if kind is None:
            continue
        if i >= len(words):
            raise _Refused(f"find {word} needs a value")
        _check_value(word, kind, words[i], files)
        i += 1
    return files


def _is_real_directory(folder: WorkFolder, name: str) -> bool:
    """Whether `name` in the folder on disk is a directory itself, not a symlink or a file."""
    if not folder.real:
        return False
    try:
        return stat.S_ISDIR(os.lstat(os.path.join(folder.real, name)).st_mode)
    except OSError:
        return False
