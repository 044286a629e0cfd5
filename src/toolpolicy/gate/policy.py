"""Policy files: YAML rules with CEL conditions, validated in full when loaded.

A policy is checked completely at load, so that a typo cannot quietly disable a rule
in the middle of a training run: unknown keys, a bad effect, a duplicate id, a CEL
condition that does not compile or reads a variable or function that does not exist,
a bad redaction regex, a duplicated YAML key, a `when:` left blank. Every problem found
is reported at once in one `PolicyError` that names the file, the rule id and what is
wrong. What needs the tools' schemas (an argument a condition reads that the tool does
not have, a tool name no tool has) is checked when a Gate binds the policy to its tools.

    default: deny                     # what happens when no rule permits (deny if omitted)
    work_folder: /work                # the folder paths are confined to (needed by parse)
    parse:                            # arguments the gate parses before any rule reads them
      read_file: {path: path}         #   path: normalised, symlinks resolved (gate/paths.py)
      write_file: {path: path}
      run_shell: {command: command}   #   command: an argv in a known grammar (gate/commands.py)
    rules:
      - id: no-traversal              # letters, digits, '_', '.', '-' (no ':', kept for the gate's own ids)
        effect: forbid                # permit | forbid | ask
        tools: [read_file, write_file]   # or "*" for every tool
        when: "!parsed.path.inside"   # CEL; omitted = always; present but blank = a load error
        reason: paths may not leave the work folder      # required for forbid and ask
        hint: use a path under /work                     # optional fix the model is shown
    limits:
      max_calls: {run_shell: 10, "*": 50}        # calls that ran, per episode; "*" = all tools together
      max_denials: {"*": 20}                     # calls the gate denied, per episode: a cap on probing
      max_consecutive_errors: {"*": 3}           # retry budget; "*" = trailing errors of any tools
    redact: ['AKIA[0-9A-Z]{16}']                 # regexes replaced by [REDACTED] in tool output,
                                                 # on top of DEFAULT_REDACT (always applied); run on RE2
    session:                                     # running totals over the session's admitted calls,
      written: {tools: [write_file], sum: double(size(args.content))}   # read as session.written
                                                 # (gate/session.py: sum, when, per, within)

Conditions read `tool`, `args`, `parsed` (the parsed arguments), `state` (facts tools
recorded), `counts` (calls that ran, per tool), `denials` (calls denied, per tool),
`denied_before` (this same call was denied earlier), `history` (the last few calls;
see gate/ledger.py) and `session` (the declared tallies, this call included; a rule
reading a tally `session:` does not declare is a load error). Every one of them costs the
same at any point of an episode.

Patterns run in time linear in the text they scan: a policy's `redact` on RE2, and
`matches` in conditions on the CEL binding's Rust `regex` crate; a pattern either engine
cannot run (lookaround, backreferences, a program over its size limit) is a load error
naming the rule or the `redact` entry and why (`linear_pattern`, `pattern_problems`).

A missing `when` means the rule always applies; `when:` written with nothing after it
(YAML null), `when: ""` or only spaces is an error, because a condition that was meant
and lost must not turn into "always".

Limits count per episode (a ledger's lifetime; behind `gate serve`, the client session).
`max_calls` counts calls that ran, so "may run at most N times" is what it says; denied
calls are capped on their own by `max_denials`, so a model cannot probe the policy without
end either. A forbid rule that matches is reported before any limit (gate/decide.py).
The reference with an example of everything is docs/policy.md.

Conditions are compiled once here. Rules are indexed by tool name (`Policy.rules_for`),
so a decision only looks at the rules naming its tool plus the "*" rules.
"""

from __future__ import annotations

import math
import posixpath
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import cel
import re2
import yaml

from toolpolicy.gate.commands import command_view
from toolpolicy.gate.digest import canonical_json, sha256_hex
from toolpolicy.gate.paths import WorkFolder, path_view
from toolpolicy.gate.session import DEFAULT_MAX_KEYS, MAX_KEYS, MAX_WINDOW_CALLS, MAX_WINDOW_SECONDS, Tally
from toolpolicy.gate.values import VALUE_FUNCTIONS

Effect = Literal["permit", "forbid", "ask"]
EFFECTS: tuple[Effect, ...] = ("permit", "forbid", "ask")
DEFAULTS = ("allow", "deny")
CONTEXT_VARIABLES = frozenset(
    {"tool", "args", "parsed", "state", "history", "counts", "denials", "denied_before", "session"}
)
TALLY_VARIABLES = frozenset({"tool", "args"})
"""What a tally's when, sum and per read: the call alone (gate/session.py)."""
# Type names, as in `type(args.x) == string`, are reported by the CEL binding as variables.
CEL_TYPE_NAMES = frozenset({"bool", "int", "uint", "double", "string", "bytes", "list", "map", "null_type", "type"})
LIMIT_KINDS = ("max_calls", "max_denials", "max_consecutive_errors")
ALL_TOOLS = "*"
REDACTED = "[REDACTED]"

DEFAULT_REDACT: tuple[tuple[str, str], ...] = (
    (
        "private key block",
        r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[\s\S]*?-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)",
    ),
    ("AWS access key id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("GitHub token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    ("OpenAI or Anthropic style key", r"\bsk-[A-Za-z0-9_-]{20,}"),
    ("Slack token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("Google API key", r"\bAIza[0-9A-Za-z_-]{35}"),
    ("Stripe secret key", r"\b[rs]k_live_[0-9A-Za-z]{16,}"),
    ("bearer token", r"\b(?i:bearer)\s+[A-Za-z0-9._~+/-]{16,}=*"),
)
"""Secret formats redacted from every tool output whatever the policy says (a missing
pattern list must not leak a key), as (what, regex). A policy's `redact` adds to them.
A truncated private key (no END line) is redacted to the end of the text."""
_DEFAULT_REDACT = re.compile("|".join(f"(?:{pattern})" for _, pattern in DEFAULT_REDACT))
DEFAULT_REDACT_ANCHORS = ("-----BEGIN ", "AKIA", "ASIA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_",
                          "sk-", "xox", "AIza", "k_live_")  # fmt: skip
"""Text that every match of DEFAULT_REDACT contains (bearer tokens: "bearer" in any case).
A text with none of them has no match, and `str.find` rules that out some 20 times faster
than the regex's scan, whose leading word boundaries defeat its own quick search."""

# No ':' in rule ids, so the gate's own ids ("limit:max_calls:x", "gate:unknown_tool") never collide.
RULE_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

# The Rust CEL parser recurses without a depth guard and overflows the C stack (a segfault,
# not an exception) on chains of ~20,000 operators. 4,000 characters is far below that
# and far above any condition a person writes.
MAX_CONDITION_CHARS = 4000

_TOP_KEYS = frozenset({"default", "rules", "limits", "redact", "description", "work_folder", "parse", "session"})
_TALLY_KEYS = frozenset({"tools", "when", "sum", "per", "within", "max_keys", "description"})
TALLY_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")

PARSERS: dict[str, Callable[[str, WorkFolder], dict[str, Any]]] = {"path": path_view, "command": command_view}
"""What `parse:` can make of a string argument, for conditions to read as `parsed.<argument>`."""
_RULE_KEYS = frozenset({"id", "effect", "tools", "when", "reason", "hint", "description"})

# Functions the Rust-native CEL standard library of `common-expression-language` provides.
# A condition calling anything else would fail at every evaluation, so it is refused at load.
# Macros (has, all, exists, exists_one, map, filter) are not function references.
CEL_FUNCTIONS = frozenset(
    "size contains startsWith endsWith matches int uint double string bytes timestamp duration type dyn "
    "getFullYear getMonth getDate getDayOfMonth getDayOfWeek getDayOfYear getHours getMinutes getSeconds "
    "getMilliseconds".split()
) | frozenset(VALUE_FUNCTIONS)  # and toolpolicy's whole-value functions (gate/values.py)
# `Program.variables()` also lists the names that comprehension macros bind (the `h` in
# `history.exists(h, ...)`); they are recognised from the source and allowed.
_BOUND_NAME = re.compile(r"\b(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")


class PolicyError(ValueError):
    """A policy that cannot be used. `problems` lists each thing wrong, one per entry."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        shown = "\n  ".join(self.problems)
        super().__init__(f"{source}: {shown}" if len(self.problems) == 1 else f"{source}:\n  {shown}")


@dataclass(frozen=True)
class Rule:
    """One rule. `program` is the compiled `when` (None: the rule always matches);
    `variables` are the context variables it reads, so the gate converts only those;
    `arguments` and `parsed` the names it reads as `args.X` (or args['X']) and `parsed.X`,
    which the Gate checks against the tools' schemas and the policy's `parse` table;
    `whole_args` whether it also reads `args` some other way (`size(args)`, `'k' in args`,
    a macro over it), so that the gate must hand it every argument."""

    id: str
    effect: Effect
    tools: tuple[str, ...] | None  # None: every tool ("*")
    when: str | None
    reason: str
    hint: str = ""
    program: Any = field(default=None, compare=False, repr=False)
    variables: frozenset[str] = frozenset()
    arguments: frozenset[str] = frozenset()
    parsed: frozenset[str] = frozenset()
    whole_args: bool = False

    def applies_to(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools


@dataclass(frozen=True)
class CallLimits:
    """Per-episode budgets. Keys are tool names; "*" means all tools together."""

    max_calls: Mapping[str, int] = field(default_factory=dict)
    """Calls that ran (succeeded or failed), per tool or "*" for all together."""
    max_consecutive_errors: Mapping[str, int] = field(default_factory=dict)
    max_denials: Mapping[str, int] = field(default_factory=dict)
    """Calls the gate denied, per tool or "*"; once reached, further calls are denied too."""


@dataclass(frozen=True)
class ToolRules:
    """The rules that can apply to one tool, split by effect, each in policy order,
    and the union of context variables their conditions read.

    A screen is the OR of one effect's conditions, compiled in chunks of
    SCREEN_CHUNK. CEL's `||` is commutative over errors (`error || true` is true,
    `error || false` is an error), so a screen that gives False proves that every
    condition behind it gave False and none failed: the gate then skips those rules
    with one evaluation per chunk instead of one per rule. Any other outcome sends
    the gate through the rules one by one. None: no screen (a rule without a
    condition, or no rules)."""

    forbid: tuple[Rule, ...]
    ask: tuple[Rule, ...]
    permit: tuple[Rule, ...]
    variables: frozenset[str]
    arguments: frozenset[str] | None = None
    """The argument names the conditions read; None when one reads `args` as a whole."""
    forbid_screen: tuple[Any, ...] | None = None
    ask_screen: tuple[Any, ...] | None = None
    permit_screen: tuple[Any, ...] | None = None
    functions: frozenset[str] = frozenset()
    """The whole-value functions (gate/values.py) the conditions call: only these are added
    to a decision's context (each costs about half a microsecond)."""


@dataclass(frozen=True)
class Policy:
    """A validated policy. Build one with `Policy.load`, `Policy.from_yaml` or `Policy.from_dict`.

    `hash` is the SHA-256 of the canonical JSON of the validated content, so the audit
    log can say which policy made each decision; comments and formatting do not change it.
    """

    default: Literal["allow", "deny"]
    rules: tuple[Rule, ...]
    limits: CallLimits
    redact_patterns: tuple[Any, ...]
    """The policy's `redact` patterns compiled by RE2 (`re2._Regexp`: search, finditer, sub, pattern)."""
    source: str
    hash: str
    description: str = ""
    work_folder: str = ""
    """The folder `parse` confines paths to, as the agent writes it ("" when nothing is parsed)."""
    parse: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """tool -> argument -> kind (a key of PARSERS): what the gate parses before the rules run."""
    warnings: tuple[str, ...] = ()
    """What the policy allows that its author likely did not mean (`substring_warnings`);
    each is also issued as a PolicyWarning when the policy is built."""
    tallies: tuple[Tally, ...] = ()
    """The running totals of `session:`, read by conditions as `session.<name>` (gate/session.py)."""
    _index: dict[str, ToolRules] = field(default_factory=dict, init=False, compare=False, repr=False)

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """Read and validate a policy file; PolicyError (naming the file) on any problem."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise PolicyError(str(path), [f"cannot read the policy file: {error}"]) from None
        return cls.from_yaml(text, source=str(path))

    @classmethod
    def from_yaml(cls, text: str, source: str = "<policy>") -> Policy:
        try:
            data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass: no arbitrary objects
        except Exception as error:  # YAMLError, and constructor errors such as a bad date or deep nesting
            detail = " ".join(str(error).split())
            raise PolicyError(source, [f"not valid YAML: {clip(detail, 300)}"]) from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: Any, source: str = "<policy>") -> Policy:
        return _build(data, source)

    def rules_for(self, tool: str) -> ToolRules:
        """The rules naming `tool` or "*", computed once per tool name: decision cost does
        not grow with rules written for other tools."""
        found = self._index.get(tool)
        if found is None:
            matching = [rule for rule in self.rules if rule.applies_to(tool)]
            by_effect = {e: tuple(rule for rule in matching if rule.effect == e) for e in ("forbid", "ask", "permit")}
            found = ToolRules(
                **by_effect,
                variables=frozenset().union(*(rule.variables for rule in matching)),
                arguments=None
                if any(rule.whole_args for rule in matching)
                else frozenset().union(*(rule.arguments for rule in matching)),
                forbid_screen=_screen(by_effect["forbid"]),
                ask_screen=_screen(by_effect["ask"]),
                permit_screen=_screen(by_effect["permit"]),
                functions=frozenset(
                    name for rule in matching if rule.program is not None for name in rule.program.functions() if name in VALUE_FUNCTIONS
                ),
            )
            if len(self._index) < 10_000:  # unknown names never reach here via Gate; bound it anyway
                self._index[tool] = found
        return found

    def tool_names(self) -> set[str]:
        """Every tool named by a rule or a limit (not "*")."""
        named = {name for rule in self.rules for name in rule.tools or ()}
        named |= set(self.limits.max_calls) | set(self.limits.max_consecutive_errors) | set(self.limits.max_denials)
        named |= set(self.parse)
        named |= {name for tally in self.tallies for name in tally.tools or ()}
        named.discard(ALL_TOOLS)
        return named

    def redact(self, text: str) -> str:
        """`text` with every match of DEFAULT_REDACT and of the policy's redaction patterns
        replaced by [REDACTED]."""
        if any(anchor in text for anchor in DEFAULT_REDACT_ANCHORS) or "bearer" in text.lower():
            text = _DEFAULT_REDACT.sub(REDACTED, text)
        for pattern in self.redact_patterns:
            text = pattern.sub(REDACTED, text)
        return text


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: PyYAML would keep the last one silently,
    so a rule written with two `when:` lines would lose one of its conditions."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key; the base class reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _StrictLoader.construct_mapping)


def _build(data: Any, source: str) -> Policy:
    problems: list[str] = []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(source, [f"a policy must be a mapping with 'default' and 'rules', not {_kind(data)}"])
    for key in data:
        if key not in _TOP_KEYS:
            problems.append(f"unknown top-level key {_show(key)} (expected one of {', '.join(sorted(_TOP_KEYS))})")

    default = data.get("default", "deny")
    if default not in DEFAULTS:
        problems.append(f"default must be 'allow' or 'deny', not {_show(default)}")
    description = _optional_text(data.get("description"), "description", problems)

    rules = _rules(data.get("rules"), problems)
    limits = _limits(data.get("limits"), problems)
    patterns = _redact(data.get("redact"), problems)
    work_folder = _work_folder(data.get("work_folder"), problems)
    parse = _parse(data.get("parse"), problems)
    tallies = _tallies(data.get("session"), problems)
    problems.extend(_undeclared_tallies(rules, tallies))
    if parse and not work_folder and "work_folder" not in data:
        problems.append("parse needs a work_folder (the folder paths are confined to, e.g. /workspace)")
    problems.extend(_unparsed_reads(rules, parse))
    if problems:
        raise PolicyError(source, problems)

    limits_content: dict[str, Any] = {
        "max_calls": dict(limits.max_calls),
        "max_consecutive_errors": dict(limits.max_consecutive_errors),
    }
    if limits.max_denials:  # absent from older policies' content, so their hashes stay as they were
        limits_content["max_denials"] = dict(limits.max_denials)
    content = {
        "default": default,
        "description": description,
        "rules": [
            {
                "id": r.id,
                "effect": r.effect,
                "tools": ALL_TOOLS if r.tools is None else list(r.tools),
                "when": r.when,
                "reason": r.reason,
                "hint": r.hint,
            }
            for r in rules
        ],
        "limits": limits_content,
        "redact": [p.pattern for p in patterns],
    }
    if work_folder or parse:  # absent from older policies' content, so their hashes stay as they were
        content.update(work_folder=work_folder, parse={tool: dict(table) for tool, table in parse.items()})
    if tallies:  # likewise
        content["session"] = {tally.name: _tally_content(tally) for tally in tallies}
    found = substring_warnings(rules)
    for warning in found:
        warnings.warn(f"{source}: {warning}", PolicyWarning, stacklevel=4)
    return Policy(
        default,
        tuple(rules),
        limits,
        tuple(patterns),
        source,
        sha256_hex(canonical_json(content)),
        description,
        work_folder,
        parse,
        tuple(found),
        tuple(tallies),
    )


class PolicyWarning(UserWarning):
    """A policy that loads but likely does not say what its author meant."""


_CONTAINS_ARGUMENT = re.compile(r"\.contains\(\s*args\.(\w+)\s*\)")
_ARGUMENT_CONTAINS = re.compile(r"\bargs\.(\w+)\.contains\(\s*(?![\s'\"]|r['\"])")  # of a value, not of a literal


def substring_warnings(rules: list[Rule]) -> list[str]:
    """A warning for each rule that tests free text with `contains` against an argument: a
    substring test, which a part of a value passes (`text.contains(args.x)`: `bob@ex` is in
    `bob@example.com`) or the value spelt otherwise escapes (`args.x.contains(secret)`). A
    literal (`args.path.contains('..')`) is the author's own spelling and not warned about."""
    found = []
    for rule in rules:
        when = rule.when or ""
        for name in dict.fromkeys(_CONTAINS_ARGUMENT.findall(when)):
            found.append(
                f"rule {rule.id!r}: `contains(args.{name})` is a substring test, so a part of a value passes as named "
                f"(an address cut short, a domain missing a letter); use `mentions(text, args.{name})` to match whole values"
            )
        for name in dict.fromkeys(_ARGUMENT_CONTAINS.findall(when)):
            found.append(
                f"rule {rule.id!r}: `args.{name}.contains(...)` misses the same value in other case, spaced out or "
                f"encoded; use `reveals(args.{name}, value)` to find a secret in any spelling"
            )
    return found


def _work_folder(raw: Any, problems: list[str]) -> str:
    if raw is None:
        return ""
    if not isinstance(raw, str) or not raw.startswith("/") or posixpath.normpath(raw) != raw.rstrip("/") or "\x00" in raw:
        problems.append(f"work_folder must be an absolute folder path such as /workspace, not {_show(raw)}")
        return ""
    return raw.rstrip("/") or "/"


def _parse(raw: Any, problems: list[str]) -> dict[str, dict[str, str]]:
    """The `parse` table: {tool: {argument: kind}}, every kind one of PARSERS."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"parse must map tool names to {{argument: kind}}, not {_kind(raw)}")
        return {}
    table: dict[str, dict[str, str]] = {}
    for tool, arguments in raw.items():
        if not isinstance(tool, str) or not tool.strip() or tool == ALL_TOOLS:
            problems.append(f"parse: {_show(tool)} must be a tool name")
            continue
        if not isinstance(arguments, dict) or not arguments:
            problems.append(f"parse.{tool} must map argument names to a kind ({', '.join(PARSERS)}), not {_show(arguments)}")
            continue
        for argument, kind in arguments.items():
            if not isinstance(argument, str) or not argument:
                problems.append(f"parse.{tool}: {_show(argument)} must be an argument name")
            elif kind not in PARSERS:
                problems.append(f"parse.{tool}.{argument}: kind {_show(kind)} must be one of {', '.join(PARSERS)}")
            else:
                table.setdefault(tool, {})[argument] = kind
    return table


def _tallies(raw: Any, problems: list[str]) -> list[Tally]:
    """The `session:` table: {name: {tools, sum, when, per, within, max_keys}} (gate/session.py),
    each expression compiled and checked to read only the call (`tool`, `args`)."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        problems.append(f"session must map tally names to their definitions, not {_kind(raw)}")
        return []
    tallies = []
    for name, item in raw.items():
        if not isinstance(name, str) or not TALLY_NAME.match(name):
            problems.append(f"session: {_show(name)} must be a name of letters, digits and '_' (read as session.<name>)")
            continue
        label = f"session.{name}"
        if not isinstance(item, dict):
            problems.append(f"{label} must be a mapping with tools (and sum, when, per, within), not {_kind(item)}")
            continue
        before = len(problems)
        tally = _tally(name, item, label, problems)
        if tally is not None and len(problems) == before:
            tallies.append(tally)
    return tallies


def _tally(name: str, item: dict[Any, Any], label: str, problems: list[str]) -> Tally | None:
    for key in item:
        if key not in _TALLY_KEYS:
            problems.append(f"{label}: unknown key {_show(key)} (expected one of {', '.join(sorted(_TALLY_KEYS))})")
    _optional_text(item.get("description"), f"{label}: description", problems)
    tools = _rule_tools(item.get("tools"), label, problems)
    programs: list[Any] = []
    functions: set[str] = set()
    sources: dict[str, str | None] = {}
    for part in ("when", "sum", "per"):
        source = item.get(part)
        sources[part] = source
        if part in item and not isinstance(source, str):
            problems.append(f"{label}: {part} must be a CEL expression string, not {_kind(source)} (quote it in YAML)")
            programs.append(None)
            continue
        compiled = _compile_condition(source, label, problems, TALLY_VARIABLES, part) if source is not None else None
        programs.append(compiled[0] if compiled else None)
        if compiled:
            functions |= {f for f in compiled[0].functions() if f in VALUE_FUNCTIONS}
    calls, seconds = _window(item.get("within"), label, problems)
    max_keys = item.get("max_keys", DEFAULT_MAX_KEYS)
    if isinstance(max_keys, bool) or not isinstance(max_keys, int) or not 1 <= max_keys <= MAX_KEYS:
        problems.append(f"{label}: max_keys {_show(max_keys)} must be a whole number from 1 to {MAX_KEYS}")
    elif "max_keys" in item and "per" not in item:
        problems.append(f"{label}: max_keys needs per (without per there is one key)")
    if tools is False or not isinstance(max_keys, int):
        return None
    definition = {"tools": ALL_TOOLS if tools is None else list(tools), **sources, "calls": calls, "seconds": seconds,
                  "max_keys": max_keys}
    return Tally(name, tools, sources["when"], sources["sum"], sources["per"], calls, seconds, max_keys,
                 sha256_hex(canonical_json(definition))[:32], (programs[0], programs[1], programs[2]), frozenset(functions))


def _window(raw: Any, label: str, problems: list[str]) -> tuple[int, float]:
    """`within`: {calls: N} or {seconds: S} -> (calls, seconds); omitted: (0, 0), the whole session."""
    if raw is None:
        return 0, 0.0
    if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in ("calls", "seconds"):
        problems.append(f"{label}: within must be {{calls: N}} or {{seconds: S}} (omit it for the whole session), not {_show(raw)}")
        return 0, 0.0
    (kind, value), = raw.items()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"{label}: within.{kind} {_show(value)} must be a number")
    elif kind == "calls" and (not isinstance(value, int) or not 1 <= value <= MAX_WINDOW_CALLS):
        problems.append(f"{label}: within.calls {_show(value)} must be a whole number from 1 to {MAX_WINDOW_CALLS:,}")
    elif kind == "seconds" and not 1 <= value <= MAX_WINDOW_SECONDS:
        problems.append(f"{label}: within.seconds {_show(value)} must be from 1 to {MAX_WINDOW_SECONDS:,.0f} (ten years)")
    else:
        return (value, 0.0) if kind == "calls" else (0, float(value))
    return 0, 0.0


def _tally_content(tally: Tally) -> dict[str, Any]:
    return {"tools": ALL_TOOLS if tally.tools is None else list(tally.tools), "when": tally.when, "sum": tally.sum,
            "per": tally.per, "calls": tally.calls, "seconds": tally.seconds, "max_keys": tally.max_keys}


def tally_argument_problems(policy: Policy, declared: Mapping[str, frozenset[str] | None]) -> list[str]:
    """A tally reading an argument its tools do not have (`declared`: tool -> argument names,
    None for a tool that takes any), checked when a Gate binds the policy to its tools: the
    tally would be unknown after the first call it counts."""
    problems = []
    for tally in policy.tallies:
        read = set().union(*(references(source, "args") for source in (tally.when, tally.sum, tally.per) if source))
        tools = [t for t in (tally.tools or declared) if t in declared]
        for name in sorted(read):
            lacking = [t for t in tools if declared[t] is not None and name not in declared[t]]  # type: ignore[operator]
            if tally.tools is None and tools and len(lacking) == len(tools):
                problems.append(f"session.{tally.name}: reads args.{name}, which no tool has")
            elif tally.tools is not None and lacking:
                problems.append(f"session.{tally.name}: reads args.{name}, which {', '.join(lacking)} does not have")
    return problems


def _undeclared_tallies(rules: list[Rule], tallies: list[Tally]) -> list[str]:
    """A rule reading `session.X` with no tally X in `session:` would fail on every call; refused here."""
    declared = {tally.name for tally in tallies}
    problems = []
    for rule in rules:
        if "session" not in rule.variables:
            continue
        missing = sorted(references(rule.when or "", "session") - declared)
        if missing:
            known = ", ".join(sorted(declared)) or "none are declared"
            problems.append(f"rule {rule.id!r}: when reads session.{', session.'.join(missing)}, which session: does not "
                            f"declare (tallies: {known})")
    return problems


def _unparsed_reads(rules: list[Rule], parse: Mapping[str, Mapping[str, str]]) -> list[str]:
    """A rule reading `parsed.X` for a tool that has no X in `parse` (for a "*" rule: no tool
    has it) would fail on every call; it is refused here instead."""
    problems = []
    for rule in rules:
        for name in sorted(rule.parsed):
            if rule.tools is None:
                if not any(name in table for table in parse.values()):
                    problems.append(f"rule {rule.id!r}: when reads parsed.{name}, which no tool has in parse")
                continue
            lacking = [tool for tool in rule.tools if name not in parse.get(tool, {})]
            if lacking:
                problems.append(
                    f"rule {rule.id!r}: when reads parsed.{name}, but parse gives no {name!r} for {', '.join(lacking)}"
                )
    return problems


def _rules(raw: Any, problems: list[str]) -> list[Rule]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(f"rules must be a list of rules, not {_kind(raw)}")
        return []
    rules: list[Rule] = []
    seen: set[str] = set()
    for position, item in enumerate(raw):
        label = f"rules[{position}]"
        if not isinstance(item, dict):
            problems.append(f"{label}: a rule must be a mapping with id, effect, tools, not {_kind(item)}")
            continue
        rule_id = item.get("id")
        if isinstance(rule_id, str) and RULE_ID.match(rule_id):
            label = f"rule {rule_id!r}"
            if rule_id in seen:
                problems.append(f"{label}: duplicate id (ids must be unique; they name the rule in every decision)")
            seen.add(rule_id)
        elif rule_id is None:
            problems.append(f"{label}: missing 'id'")
        else:
            problems.append(f"{label}: id {_show(rule_id)} must be 1-64 letters, digits, '_', '.' or '-'")
        before = len(problems)
        rule = _rule(item, label, problems)
        if rule is not None and len(problems) == before:
            rules.append(rule)
    return rules


def _rule(item: dict[Any, Any], label: str, problems: list[str]) -> Rule | None:
    for key in item:
        if key not in _RULE_KEYS:
            problems.append(f"{label}: unknown key {_show(key)} (expected one of {', '.join(sorted(_RULE_KEYS))})")
    effect = item.get("effect")
    if effect not in EFFECTS:
        problems.append(f"{label}: effect {_show(effect)} must be one of permit, forbid, ask")

    tools = _rule_tools(item.get("tools"), label, problems)
    reason = _optional_text(item.get("reason"), f"{label}: reason", problems)
    hint = _optional_text(item.get("hint"), f"{label}: hint", problems)
    _optional_text(item.get("description"), f"{label}: description", problems)
    if effect in ("forbid", "ask") and not reason:
        problems.append(f"{label}: a {effect} rule needs a 'reason' (the model is told it, so it can recover)")

    when = item.get("when")
    program, variables = None, frozenset[str]()
    if "when" in item:
        if when is None:
            problems.append(
                f"{label}: when is blank (YAML null); write the condition, or remove 'when' for a rule that always applies"
            )
            return None
        if not isinstance(when, str):
            problems.append(f"{label}: when must be a CEL expression string, not {_kind(when)} (quote it in YAML)")
            return None
        compiled = _compile_condition(when, label, problems)
        if compiled is None:
            return None
        program, variables = compiled
    if not isinstance(item.get("id"), str) or effect not in EFFECTS or tools is False:
        return None
    return Rule(
        item["id"], effect, tools, when, reason or f"rule {item['id']}", hint, program, variables,
        references(when or "", "args"), references(when or "", "parsed"), reads_whole(when or "", "args"),
    )


def _rule_tools(raw: Any, label: str, problems: list[str]) -> tuple[str, ...] | bool | None:
    """The rule's tool names, None for "*", False when invalid (problem recorded)."""
    if raw == ALL_TOOLS:
        return None
    if raw is None:
        problems.append(f"{label}: missing 'tools' (a list of tool names, or \"*\" for every tool)")
        return False
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw:
        problems.append(f'{label}: tools must be a non-empty list of tool names or "*", not {_show(raw)}')
        return False
    bad = [name for name in raw if not isinstance(name, str) or not name.strip() or name != name.strip()]
    if bad:
        problems.append(f"{label}: tool names must be non-empty strings without surrounding spaces: {_show(bad)}")
        return False
    if ALL_TOOLS in raw:
        problems.append(f'{label}: write tools: "*" on its own rather than "*" inside a list')
        return False
    return tuple(dict.fromkeys(raw))


def _compile_condition(
    source: str, label: str, problems: list[str], allowed: frozenset[str] = CONTEXT_VARIABLES, part: str = "when"
) -> tuple[Any, frozenset[str]] | None:
    """`source` compiled, with the context variables it reads; None (problems recorded) when it
    is blank, too long, does not compile, reads a variable outside `allowed` or calls an unknown
    function. `part` names the field in the messages."""
    if not source.strip():
        if part != "when":
            problems.append(f"{label}: {part} is empty")
            return None
        problems.append(f"{label}: when is empty; write the condition, or remove 'when' for a rule that always applies")
        return None
    if len(source) > MAX_CONDITION_CHARS:
        problems.append(f"{label}: {part} is {len(source)} characters; the limit is {MAX_CONDITION_CHARS}")
        return None
    try:
        program = _compile(source)
    except Exception as error:  # the binding raises ValueError; anything else is still a bad condition
        detail = " ".join(str(error).split())
        problems.append(f"{label}: {part} does not compile as CEL: {clip(detail, 300)}")
        return None
    bound = set(_BOUND_NAME.findall(source))
    unknown_vars = sorted(set(program.variables()) - allowed - CEL_TYPE_NAMES - bound)
    if unknown_vars:
        problems.append(
            f"{label}: {part} reads unknown variable(s) {', '.join(unknown_vars)}"
            f" ({'conditions see' if part == 'when' else 'it can read'} {', '.join(sorted(allowed))})"
        )
    unknown_functions = sorted(name for name in program.functions() if name[0].isalpha() and name not in CEL_FUNCTIONS)
    if unknown_functions:
        problems.append(
            f"{label}: {part} calls unknown function(s) {', '.join(unknown_functions)}"
            f" (available: {', '.join(sorted(CEL_FUNCTIONS))})"
        )
    if unknown_vars or unknown_functions:
        return None
    bad_patterns = pattern_problems(source)
    if bad_patterns:
        problems.extend(f"{label}: {part} {problem}" for problem in bad_patterns)
        return None
    return program, frozenset(program.variables()) & allowed


# CEL string literals. Raw ones (r or R prefix) have no escapes; the others take \x escapes.
_RAW_STRING = r"(?:[rR][bB]?|[bB][rR])(?:'{3}[\s\S]*?'{3}|\"{3}[\s\S]*?\"{3}|'[^'\n]*'|\"[^\"\n]*\")"
_ESCAPED_STRING = r"[bB]?(?:'{3}(?:\\[\s\S]|[^\\])*?'{3}|\"{3}(?:\\[\s\S]|[^\\])*?\"{3}|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")"
_CEL_STRING = re.compile(f"(?<![A-Za-z0-9_])(?:{_RAW_STRING}|{_ESCAPED_STRING})")
_LITERAL = f"(?<![A-Za-z0-9_])(?:{_RAW_STRING}|{_ESCAPED_STRING})"
_MATCHES_LITERAL = re.compile(rf"\.\s*matches\s*\(\s*({_LITERAL})\s*\)|(?<![\w.])matches\s*\(\s*[^,()]+,\s*({_LITERAL})\s*\)")


def pattern_problems(source: str) -> list[str]:
    """Why each literal pattern of `matches` in `source` cannot run, as the CEL engine's own
    `matches` says when it is handed it (empty when all can).

    The CEL binding (`common-expression-language`, a Rust crate) runs `matches` on the Rust
    `regex` crate, which matches in time linear in the text and has no lookaround or
    backreferences; it compiles a pattern when the condition runs, so a pattern it refuses
    would make the condition fail on every call. Patterns that are not literals (taken from
    an argument) are run on the same engine, and fail closed when they do not compile.

    >>> pattern_problems("args.to.matches(r'^[a-z]+@example[.]com$')")
    []
    >>> pattern_problems("args.x.matches('(?=a)b')")[0][:58]
    "pattern '(?=a)b' cannot run on CEL's regex engine: regex p"
    """
    problems = []
    for match in _MATCHES_LITERAL.finditer(source):
        literal = match.group(1) or match.group(2)
        reason = _cel_pattern_problem(literal)
        if reason:
            problems.append(f"pattern {clip(literal, 60)} cannot run on CEL's regex engine: {clip(reason, 200)}")
    return problems


@lru_cache(maxsize=1024)
def _cel_pattern_problem(literal: str) -> str:
    """"" if CEL's `matches` runs the pattern written as the CEL string `literal`, else its error."""
    try:
        cel.compile(f"''.matches({literal})").execute(cel.Context())
    except Exception as error:  # RuntimeError from the binding, naming the regex crate's complaint
        text = " ".join(str(error).split())
        return text.split("not a valid regex: ", 1)[-1]
    return ""


def references(source: str, variable: str) -> frozenset[str]:
    """The field names `source` reads from `variable` as `variable.name` or `variable['name']`,
    outside string literals; method calls and macros (`args.exists(...)`) are not fields.

    >>> sorted(references("has(args.path) && args['mode'] == 'args.x' && args.exists(k, k == 'a')", "args"))
    ['mode', 'path']
    """
    return frozenset(name for name in _uses(source, variable) if name is not None)


def reads_whole(source: str, variable: str) -> bool:
    """Whether `source` uses `variable` other than by reading a named field: as a value of
    its own (`size(args)`, `'k' in args`, `args == {...}`), through a macro or method
    (`args.exists(...)`), with a computed key (`args[k]`) or any syntax not recognised
    here. When in doubt, True: the gate then converts every argument.

    >>> reads_whole("args.path == 'a' && args['mode'] == 'r'", "args"), reads_whole("'x' in args", "args")
    (False, True)
    """
    return None in _uses(source, variable)


_FIELD = re.compile(r"\s*\.\s*([A-Za-z_]\w*)\b(?!\s*\()")
_KEY = re.compile(r"\s*\[\s*(\"[^\"]*\")\s*\]")


def _uses(source: str, variable: str) -> list[str | None]:
    """Each use of the top-level `variable` in `source`: the field it reads, or None for a
    use that is not a plain field read. String literals are blanked first (positions kept),
    so text inside them is not a use."""
    blanked = _CEL_STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', source)
    uses: list[str | None] = []
    for match in re.finditer(rf"(?<![\w.]){variable}\b", blanked):
        field_match = _FIELD.match(blanked, match.end())
        key_match = _KEY.match(blanked, match.end())
        literal = source[key_match.start(1) : key_match.end(1)] if key_match is not None else ""
        if field_match is not None:
            uses.append(field_match.group(1))
        elif literal[:1] in ("'", '"') and "\\" not in literal:  # a plain quoted key, no escapes
            quotes = 3 if literal[:3] in ("'''", '"""') else 1
            uses.append(literal[quotes:-quotes])
        else:
            uses.append(None)
    return uses


SCREEN_CHUNK = 32  # conditions per screen program; keeps each OR tree shallow


def _screen(rules: tuple[Rule, ...]) -> tuple[Any, ...] | None:
    """The OR of the rules' conditions in compiled chunks (see ToolRules), or None."""
    if len(rules) < 2 or any(rule.when is None for rule in rules):
        return None
    chunks = [rules[i : i + SCREEN_CHUNK] for i in range(0, len(rules), SCREEN_CHUNK)]
    try:
        return tuple(_compile(" || ".join(f"({rule.when})" for rule in chunk)) for chunk in chunks)
    except Exception:  # every condition compiled alone; a combination that does not is only slower
        return None


@lru_cache(maxsize=4096)
def _compile(source: str) -> Any:
    """Compiled CEL programs are immutable, so one program is shared by every rule with
    the same condition (policies are reloaded often in tests and `gate check`)."""
    return cel.compile(source)


def _limits(raw: Any, problems: list[str]) -> CallLimits:
    if raw is None:
        return CallLimits()
    if not isinstance(raw, dict):
        problems.append(f"limits must be a mapping with {' and/or '.join(LIMIT_KINDS)}, not {_kind(raw)}")
        return CallLimits()
    found: dict[str, dict[str, int]] = {kind: {} for kind in LIMIT_KINDS}
    for kind, table in raw.items():
        if kind not in LIMIT_KINDS:
            problems.append(f"limits: unknown key {_show(kind)} (expected one of {', '.join(LIMIT_KINDS)})")
            continue
        if not isinstance(table, dict):
            problems.append(f'limits.{kind} must map tool names (or "*") to counts, not {_kind(table)}')
            continue
        for name, value in table.items():
            if not isinstance(name, str) or not name.strip():
                problems.append(f"limits.{kind}: tool name {_show(name)} must be a non-empty string")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
                problems.append(f"limits.{kind}.{name}: {_show(value)} must be a whole number >= 0")
            else:
                found[kind][name] = value
    return CallLimits(found["max_calls"], found["max_consecutive_errors"], found["max_denials"])


def _redact(raw: Any, problems: list[str]) -> list[Any]:
    """The `redact` patterns, compiled by RE2 (`linear_pattern`)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        problems.append(f"redact must be a list of regular expressions, not {_kind(raw)}")
        return []
    patterns = []
    for position, text in enumerate(raw):
        label = f"redact[{position}]"
        if not isinstance(text, str) or not text:
            problems.append(f"{label}: {_show(text)} must be a non-empty regular expression string")
            continue
        try:
            pattern = linear_pattern(text)
        except ValueError as error:
            problems.append(f"{label}: {clip(repr(text), 80)} {error}")
            continue
        if pattern.fullmatch(""):
            problems.append(f"{label}: {text!r} matches the empty string, so it would redact between every character")
            continue
        patterns.append(pattern)
    return patterns


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the reason is raised to the caller, not logged to stderr


@lru_cache(maxsize=1024)
def linear_pattern(text: str) -> Any:
    """`text` compiled by RE2, whose matching time is linear in the text it scans whatever the
    pattern (Python's `re` backtracks: `(a+)+$` takes exponential time on a run of a's). A
    pattern RE2 cannot run is a ValueError saying why: lookaround, backreferences, possessive
    or atomic groups, \\Z, a repetition over 1,000, a program over RE2's memory budget. RE2
    reads \\d, \\s and \\w as ASCII classes, where `re` takes every script's digits and spaces."""
    try:
        return re2.compile(text, _RE2_OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else ""
        reason = reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
        raise ValueError(f"is not a pattern RE2 can run (the engine that matches in linear time): {reason or 'refused'}") from None
    except (TypeError, OverflowError) as error:
        raise ValueError(f"is not a pattern RE2 can compile: {type(error).__name__}") from None


def _optional_text(value: Any, label: str, problems: list[str]) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        problems.append(f"{label} must be text, not {_kind(value)}")
        return ""
    return value


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), f"a {type(value).__name__}"
    )


def clip(text: str, limit: int) -> str:
    """`text` if it fits in `limit` characters, else its words that fit and " ...": a message
    is cut between words, never inside one. Only a word longer than half the limit (a long
    argument, a token) is cut where the limit falls, so the result stays within it."""
    if len(text) <= limit:
        return text
    room = limit - len(" ...")
    words = re.match(r"(.*\S)\s", text[: room + 1], re.DOTALL)  # the longest run of whole words
    head = words.group(1) if words and len(words.group(1)) >= room // 2 else text[:room]
    return head + " ..."


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # RecursionError on absurd nesting, a hostile __repr__
        return f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."
