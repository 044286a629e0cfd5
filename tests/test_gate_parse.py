"""The parsed views conditions read: paths (gate/paths.py) and command lines (gate/commands.py).

The claim that matters: a command line the gate accepts is split by a real shell into
exactly the argv the gate checked. A property test feeds random command lines built from
the characters that matter to shells to `split_words` and, whenever it accepts one, to
every POSIX shell on the machine, and compares the argv.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpolicy.gate.commands import command_view, split_words
from toolpolicy.gate.paths import WorkFolder, path_view

SHELLS = [shell for shell in ("sh", "bash", "dash", "zsh") if shutil.which(shell)]


@pytest.fixture()
def folder(tmp_path: Path) -> WorkFolder:
    (tmp_path / ".git").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "out").symlink_to("/etc")
    (tmp_path / "secret-link").symlink_to(".env")
    return WorkFolder("/workspace", str(tmp_path))


@pytest.mark.parametrize(
    ("text", "plain", "inside", "relative"),
    [
        ("notes.txt", True, True, "notes.txt"),
        ("/workspace/src/main.py", True, True, "src/main.py"),
        ("./src/", True, True, "src"),
        (".", True, True, "."),
        ("/workspace", True, True, "."),
        ("src/../notes.txt", False, True, "notes.txt"),  # stays inside, but not the one spelling
        ("../etc/passwd", False, False, ""),
        ("/etc/passwd", True, False, ""),
        ("/workspacex/a", True, False, ""),
        ("~/a", False, False, ""),
        ("%2e%2e/etc", False, False, ""),
        ("a\\..\\..\\etc", False, False, ""),
        ("\uff0e\uff0e/etc", False, False, ""),
        ("a//b", False, True, "a/b"),
        ("a /b", False, True, "a /b"),
        ("a\u200bb", False, True, "a\u200bb"),
        ("out/passwd", True, False, ""),  # a symlink out of the folder
    ],
)
def test_path_views(folder: WorkFolder, text: str, plain: bool, inside: bool, relative: str) -> None:
    view = path_view(text, folder)
    assert (view["plain"], view["inside"], view["relative"]) == (plain, inside, relative), view
    assert bool(view["problem"]) == (not plain or not inside)


def test_names_cover_spellings_and_symlink_targets(folder: WorkFolder) -> None:
    assert ".env" in path_view("secret-link", folder)["names"]  # resolved
    for text in (".ENV", ".env ", ".env.", "%2Eenv", "sub/.env"):
        assert ".env" in path_view(text, folder)["names"], text
    assert path_view("src/main.py", folder)["resolved"] == "src/main.py"


@pytest.mark.parametrize(
    ("text", "argv", "paths"),
    [
        ("ls -la src", ["ls", "-la", "src"], ["src"]),
        ("grep -rn 'def ' src", ["grep", "-rn", "def ", "src"], ["src"]),
        ("grep -e x -e y a b", ["grep", "-e", "x", "-e", "y", "a", "b"], ["a", "b"]),
        ("head -n5 a.txt", ["head", "-n5", "a.txt"], ["a.txt"]),
        ("tail -20 log.txt", ["tail", "-20", "log.txt"], ["log.txt"]),
        ("find . -name '*.py' -newer ref.txt", ["find", ".", "-name", "*.py", "-newer", "ref.txt"], [".", "ref.txt"]),
        ("git log --oneline -5", ["git", "log", "--oneline", "-5"], []),
        ("git show HEAD:src/a.py", ["git", "show", "HEAD:src/a.py"], ["src/a.py"]),
        ("echo 'a  b'\"c\"", ["echo", "a  bc"], []),
        ("cat -- -n", ["cat", "--", "-n"], ["-n"]),
        ("date +%Y-%m-%d", ["date", "+%Y-%m-%d"], []),
        ("grep --color x a", ["grep", "--color", "x", "a"], ["a"]),  # --color takes no value unless attached
        ("git log --pretty=oneline src", ["git", "log", "--pretty=oneline", "src"], ["src"]),
    ],
)
def test_accepted_command_lines(folder: WorkFolder, text: str, argv: list[str], paths: list[str]) -> None:
    view = command_view(text, folder)
    assert view["ok"], view["problem"]
    assert view["argv"] == argv and [p["relative"] for p in view["paths"]] == paths
    assert view["argv"] == shlex.split(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("cat *.py", "'*' outside quotes"),
        ("git -c core.pager=id log", "git needs one of status, log, show, diff, branch right after it"),
        ("find . -fls out", "find '-fls' is not a predicate"),
        ("sort -o out in", "the flag '-o'"),
        ("uniq in out", "more than 1 operand"),
        ("grep", "no pattern"),
        ("head -n x f", "-n needs a whole number"),
        ("./run.sh", "is not a program the gate knows"),
        ("date 0101000025", "an operand that is not a +FORMAT"),
        ("echo \"$HOME\"", "'$' inside \"...\" quotes"),
        ("", "an empty command"),
    ],
)
def test_refused_command_lines(folder: WorkFolder, text: str, problem: str) -> None:
    view = command_view(text, folder)
    assert not view["ok"] and problem in view["problem"], view["problem"]


def test_git_needs_the_folders_own_repository(folder: WorkFolder, tmp_path: Path) -> None:
    assert command_view("git status", folder)["own_repository"]
    (tmp_path / "planted").mkdir()
    elsewhere = WorkFolder("/workspace", str(tmp_path / "planted"))
    (tmp_path / "planted" / ".git").write_text("gitdir: ../x\n")
    assert not command_view("git status", elsewhere)["own_repository"]
    assert not command_view("git status", WorkFolder("/no/such/folder"))["own_repository"]


# Characters shells treat specially, the characters the subset allows, and some others.
SHELL_ALPHABET = "ab-=./ '\"$`\\!*?[]{}~#;&|<>()%+,:@\t\n\u00e9"


def _shell_argv(shell: str, text: str) -> list[str]:
    """The argv `shell` gives a command line, printed NUL-separated by printf after its count."""
    script = f"p() {{ printf '%s\\0' \"$#\" \"$@\"; }}; p {text}"
    done = subprocess.run([shell, "-c", script], capture_output=True, timeout=10, check=True)
    count, *words = done.stdout.decode().split("\0")[:-1]
    assert len(words) == int(count)
    return words


@pytest.mark.skipif(not SHELLS, reason="no POSIX shell on this machine")
@settings(max_examples=150, deadline=None)
@given(st.text(SHELL_ALPHABET, min_size=1, max_size=14))
def test_every_shell_splits_an_accepted_line_into_the_checked_argv(text: str) -> None:
    try:
        words = split_words("echo " + text)
    except Exception:  # refused: nothing to compare
        return
    for shell in SHELLS:
        assert _shell_argv(shell, text) == words[1:], (shell, text)


def test_the_shell_comparison_can_fail() -> None:
    """The property above would notice a split that differs from the shell's."""
    if not SHELLS:
        pytest.skip("no POSIX shell on this machine")
    assert _shell_argv(SHELLS[0], "a'b c'd") == ["ab cd"] and _shell_argv(SHELLS[0], "a  b") == ["a", "b"]
    assert _shell_argv(SHELLS[0], "{x,y}") != ["{x,y}"] or SHELLS[0] != "bash"
