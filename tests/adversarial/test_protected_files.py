"""A file a rule protects is protected from every command that can read it, not only from
the one that names it: a program that reads the files inside a folder it is given (`grep -r`,
`diff DIR1 DIR2`, `diff -N`) is checked against every file there, found on disk, and the
secret-file families match whole families of names, however spelt.

Each folder here holds no secret by the name a list would know, only family members, links
and nesting, and the shipped workspace policy (examples/policies/workspace.yaml) decides.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import toolpolicy.gate.commands as commands
from test_gate_workspace import workspace_gate
from toolpolicy.gate import Ledger
from toolpolicy.gate.commands import command_view
from toolpolicy.gate.paths import WorkFolder, path_view, secret_families
from toolpolicy.types import ToolCall


def shell(folder: Path | None, command: str) -> tuple[str, tuple[str, ...]]:
    decision = workspace_gate(folder).decide(ToolCall("run_shell", {"command": command}), Ledger())
    return decision.effect, decision.rule_ids


@pytest.fixture()
def project(tmp_path: Path) -> Path:
    """src/ with code, config/ with a dotenv file of an odd suffix deep down, keys/ with an SSH
    key of a newer algorithm, and docs/ with only a symlink to the key among ordinary files."""
    for name in ("src/app", "config/deploy", "keys", "docs", "empty"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "src/app/main.py").write_text("print('hi')\n")
    (tmp_path / "README.md").write_text("hello\n")
    (tmp_path / "config/deploy/.env-Production").write_text("TOKEN=hunter2\n")
    (tmp_path / "keys/id_ed25519_sk").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (tmp_path / "docs/guide.md").write_text("read me\n")
    (tmp_path / "docs/notes.txt").symlink_to("../keys/id_ed25519_sk")
    return tmp_path


@pytest.mark.parametrize(
    "command",
    [
        "grep -r TOKEN config",  # the dotenv file two folders down
        "grep -rn TOKEN",  # no folder named: grep -r reads the one it runs in
        "grep --recursive TOKEN .",
        "grep -ril begin keys",
        "diff -N keys empty",  # prints every file only one side has
        "diff keys empty",
        "diff -q -N empty keys",
        "diff -N docs empty",  # docs holds a symlink to the key: diff follows it
    ],
)
def test_a_command_reading_a_folder_that_holds_a_secret_is_denied(project: Path, command: str) -> None:
    effect, rules = shell(project, command)
    assert effect == "deny" and "no-secret-files" in rules, (command, rules)


@pytest.mark.parametrize("command", ["grep -r print src", "grep -rn TODO src/app", "diff src empty", "grep -r read docs",
                                     "diff -u README.md README.md", "ls -R .", "find . -name '*.md'", "tree ."])
def test_commands_that_read_no_secret_are_allowed(project: Path, command: str) -> None:
    """`grep -r` does not follow a symlink it meets inside a folder (docs/notes.txt), and ls,
    find and tree list names without reading what the files hold."""
    assert shell(project, command) == ("allow", ("shell-checked-commands",)), command


def test_a_folder_read_reaching_outside_the_work_folder_is_denied(project: Path) -> None:
    (project / "docs/hosts").symlink_to("/etc/hosts")
    effect, rules = shell(project, "diff -N docs empty")
    assert effect == "deny" and "no-shell-paths-outside" in rules


def test_a_folder_read_is_refused_when_the_folder_cannot_be_seen(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commands, "MAX_FILES_READ", 1)
    view = command_view("grep -r print src", WorkFolder("/workspace", str(project)))
    assert view["ok"] is False and "more than 1 files" in view["problem"]
    unseen = command_view("grep -r print src", WorkFolder("/nowhere-on-this-disk"))
    assert unseen["ok"] is False and "not on this machine" in unseen["problem"]
    assert shell(None, "grep -r print src")[1] == ("no-unchecked-shell",)


def test_the_view_names_the_folders_read_and_the_families_found(project: Path) -> None:
    view = command_view("diff -N docs empty", WorkFolder("/workspace", str(project)))
    assert view["reads"] == ["docs", "empty"] and view["secrets"] == ["ssh key"]
    assert path_view("config/deploy/.env-Production", WorkFolder("/workspace", str(project)))["secrets"] == ["dotenv"]


@pytest.mark.parametrize(
    ("name", "families"),
    [
        (".env.production.local", ["dotenv"]), (".Env_Local", ["dotenv"]), ("staging.env", ["dotenv"]),
        ("id_ecdsa_sk.pub", ["ssh key"]), ("id_xmss", ["ssh key"]), ("backup_id_rsa.old", ["ssh key"]),
        ("CREDENTIALS.JSON", ["credentials"]), ("gcp-credentials.xml", ["credentials"]),
        ("prod_secrets.enc", ["secrets"]), (".netrc", ["netrc"]), ("_NETRC", ["netrc"]),
        (".pgpass", ["pgpass"]), (".npmrc", ["package manager tokens"]), (".aws", ["cloud credentials"]),
        ("site.pem", ["key file"]), ("kubeconfig", ["kubeconfig"]), (".git-credentials", ["credentials", "git credentials"]),
        ("secret_santa_rules.md", []), ("credentials.py", []), ("keyboard_layouts.txt", []), ("environment.yml", []),
        ("env_setup.md", []), (".venv", []), ("tokenizer.json", []), ("key_points.md", []), ("monkey.txt", []),
    ],
)
def test_secret_families_by_name(name: str, families: list[str]) -> None:
    """Names as path views give them (lower case, as a case-insensitive disk opens them)."""
    assert secret_families({name.lower()}) == families
