"""The gate: every decoded tool call is checked here before it runs.

The order of checks, and why:

1. Unknown tool, arguments that are not plain JSON, or arguments that break the tool's
   JSON schema (`format: date` included, strictly): deny before any rule runs, so
   conditions only ever see well-formed arguments of a real tool (docs/architecture.md, contract 5).
2. Forbid rules: any that matches (or errors) denies, and the decision names it. They
   come before the limits so that a call a rule forbids is reported as denied by that
   rule, not by a budget it happened to reach as well.
3. Limits (calls that ran, calls denied, retry budget after consecutive errors; all per
   episode, which behind `gate serve` is the client session): deny. A limit is a forbid
   that no permit can override.
4. The other rules, with Cedar's semantics (https://docs.cedarpolicy.com/policies/syntax-policy.html,
   "deny by default, forbid overrides permit"), plus `ask`:
   any matching forbid -> deny; else any matching ask -> ask; else any matching permit
   -> allow; else the policy's default. These are the properties Cedar proves and our
   property tests check: a forbid beats a permit, rule order and duplicates do not
   matter, adding a permit never turns an allow into a deny, adding a forbid never
   turns a deny into an allow.
5. A condition that errors (a missing key, a type mismatch) or returns a non-boolean
   never allows. Where Cedar skips a policy that errors, we fail closed: an erroring
   forbid or ask denies, an erroring permit simply does not match.

The arguments the policy's `parse` table names are parsed once per call (a path
normalised and resolved, a command line split into an argv in a known grammar) and
conditions read the result as `parsed`, so a rule checks the value the tool will use
rather than one spelling of it.

`Gate.evaluate` is the policy alone (it may answer "ask"). `Gate.decide` also settles an
ask with the approver (none configured: deny) and writes the audit record, so every
decision that is acted on is logged exactly once (contract 6).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import cel
import jsonschema

from toolpolicy.gate.audit import AuditLog
from toolpolicy.gate.ledger import MAX_TOOL_NAME_CHARS, Ledger, plain_json_problem
from toolpolicy.gate.paths import WorkFolder
from toolpolicy.gate.policy import ALL_TOOLS, PARSERS, Policy, PolicyError, Rule, ToolRules, clip, tally_argument_problems
from toolpolicy.gate.schema import ArgumentSchema
from toolpolicy.gate.values import VALUE_FUNCTIONS
from toolpolicy.types import ToolCall, ToolSpec

GateEffect = Literal["allow", "deny", "ask"]
Outcome = Literal["allowed", "asked", "denied", "malformed", "unknown_tool", "gate_error"]
"""What kind of decision it is, for whoever acts on it: `allowed`; `asked` (a rule wants an
approver); `denied` by the policy (a forbid rule, a limit, a rule that could not vouch for
the call, the default); the model's `malformed` call (arguments that break the schema) or
call to an `unknown_tool`, which never reach the policy; `gate_error`, a fault of the gate
itself, failed closed: a machine fault, never the model's policy violation."""
BY_EFFECT: dict[str, Outcome] = {"allow": "allowed", "ask": "asked", "deny": "denied"}
MAX_DETAIL_CHARS = 200

# Decision ids: a random per-process prefix and a counter (uuid4 costs 3 us, a tenth of
# the latency budget). Unique within a process and, with 64 random bits, across them.
_ID_PREFIX = secrets.token_hex(8)
_ID_COUNTER = itertools.count(1)


def _next_decision_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):08x}"


@dataclass(frozen=True)
class Decision:
    """What the gate decided about one call.

    rule_ids: the rules that determined the effect: every matching (or erroring) forbid
        for a deny by rule, every matching ask, every matching permit for an allow. The
        gate's own checks use ids with a colon, which rule ids cannot contain:
        "gate:unknown_tool", "gate:invalid_arguments", "limit:max_calls:<tool>",
        "limit:max_denials:<tool>", "limit:max_consecutive_errors:<tool>", "default:allow",
        "default:deny". A forbid rule that matches is named rather than a limit also reached.
    reason, hint: written for the model, which sees them when the call is denied.
    """

    effect: GateEffect
    rule_ids: tuple[str, ...] = ()
    reason: str = ""
    hint: str = ""
    decision_id: str = field(default_factory=_next_decision_id)
    outcome: Outcome | None = None
    """What kind of decision (see `Outcome`); None: the effect's own (allow -> allowed, ask ->
    asked, deny -> denied)."""

    def __post_init__(self) -> None:
        if self.outcome is None:
            object.__setattr__(self, "outcome", BY_EFFECT[self.effect])

    @property
    def allowed(self) -> bool:
        return self.effect == "allow"

    def observation(self) -> str:
        """The tool observation the model reads instead of a result: which rule, why,
        and how to fix it, so that it can recover. Empty for an allowed call."""
        if self.effect == "allow":
            return ""
        rules = ", ".join(self.rule_ids) or "default"
        head = "needs approval" if self.effect == "ask" else "denied"
        text = _sentence(f"Tool call {head} by policy (rule {rules}): {self.reason}")
        return f"{text} Hint: {_sentence(self.hint)}" if self.hint else text


Parser = Callable[[str], dict[str, Any]]
"""One argument's parser, bound to the work folder: text -> the view conditions read."""
_NO_PARSERS: dict[str, Parser] = {}

Approver = Callable[[ToolCall, Decision], bool]
"""Settles an `ask`: gets the call and the ask decision, returns True to allow. Anything
else, or an exception, denies. A slow approver must apply its own timeout."""


class HasSpecs(Protocol):
    """Anything that lists tool specs, such as a ToolSet (the gate does not import tools/)."""

    def specs(self) -> list[ToolSpec]: ...


class Gate:
    """A policy bound to the tools of one environment.

    Args:
        policy: a loaded Policy.
        tools: a ToolSet, or the ToolSpecs of the tools (e.g. an MCP server's).
        approver: settles `ask` decisions; None means every ask is denied (training).
        audit: if given, `decide` appends every decision to it.
        strict_tool_names: refuse a policy that names a tool not in `tools`, because a
            misspelt tool name would silently switch its rule off.
        enforce: False is shadow mode: callers still get every decision but run calls
            the policy denies, counting them as violations (evaluation with the gate
            off). Unknown tools and invalid arguments are refused either way.
        work_folder: where the policy's `work_folder` is on this machine, when it is not
            at the same path (a container's mount, a test's temporary folder); symlinks
            in paths the policy parses are resolved there.

    Whatever `strict_tool_names` says, a condition reading an argument its tools do not
    have (`args.expresion`), or parsing one, is refused here with the rule named: it
    would fail on every call. A schema that lists `properties` is taken to list every
    argument unless it sets `additionalProperties` to true or a schema.
    """

    def __init__(
        self,
        policy: Policy,
        tools: HasSpecs | Iterable[ToolSpec],
        approver: Approver | None = None,
        audit: AuditLog | None = None,
        strict_tool_names: bool = True,
        enforce: bool = True,
        work_folder: str | Path | None = None,
    ) -> None:
        specs = tools.specs() if hasattr(tools, "specs") else list(tools)
        self.policy = policy
        self.approver = approver
        self.audit = audit
        self.enforce = enforce
        limits = policy.limits
        self._limited = bool(limits.max_calls or limits.max_denials or limits.max_consecutive_errors)  # else skip them
        self._validators: dict[str, ArgumentSchema] = {}
        for spec in specs:
            try:
                self._validators[spec.name] = ArgumentSchema(spec.parameters)
            except jsonschema.SchemaError as error:
                raise ValueError(f"tool {spec.name!r} has an invalid JSON schema: {error.message}") from None
        problems = _unknown_arguments(policy, specs)
        if strict_tool_names:
            unknown = sorted(policy.tool_names() - set(self._validators))
            where = {
                name: [f"rule {r.id!r}" for r in policy.rules if r.tools and name in r.tools]
                + [f"session.{t.name}" for t in policy.tallies if t.tools and name in t.tools]
                or (["parse"] if name in policy.parse else ["limits"])
                for name in unknown
            }
            problems += [f"{', '.join(where[n])}: names unknown tool {n!r}" for n in unknown]
        if problems:
            problems.append(f"(the tools are: {', '.join(sorted(self._validators)) or 'none'})")
            raise PolicyError(policy.source, problems)
        folder = WorkFolder(policy.work_folder, str(work_folder or "")) if policy.work_folder else None
        self._parsers: dict[str, dict[str, Parser]] = {
            tool: {argument: _bound(PARSERS[kind], folder) for argument, kind in table.items()}
            for tool, table in policy.parse.items()
            if folder is not None
        }

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(self._validators)

    def redact(self, text: str) -> str:
        """Tool output with the built-in secret formats (DEFAULT_REDACT) and the policy's
        patterns replaced, before the model or a log sees it."""
        return self.policy.redact(text)

    def decide(self, call: ToolCall, ledger: Ledger | None = None) -> Decision:
        """The final decision (allow or deny) for `call`, logged once to the audit log.

        Never raises for any call or ledger content. The one exception is an audit log
        that cannot be written (AuditError): that is an infrastructure failure, which the
        engine marks as such rather than letting an unlogged call run.
        """
        return self.conclude(call, self.evaluate(call, ledger))

    def conclude(self, call: ToolCall, evaluated: Decision) -> Decision:
        """The final decision from `evaluate`'s answer: an ask settled by the approver, the
        decision logged once to the audit log (AuditError if it cannot be)."""
        decision = self._settle(call, evaluated) if evaluated.effect == "ask" else evaluated
        if self.audit is not None:
            self.audit.append(decision, call, self.policy.hash)
        return decision

    def knows(self, name: object) -> bool:
        """Whether `name` is one of this gate's tools."""
        return isinstance(name, str) and name in self._validators

    def evaluate(self, call: ToolCall, ledger: Ledger | None = None) -> Decision:
        """The policy's answer alone (allow, deny or ask), without approver or audit log.

        For `toolpolicy gate check` and for callers that settle asks themselves.
        """
        try:
            return self._evaluate(call, ledger if ledger is not None else Ledger())
        except Exception as error:  # a bug here must still fail closed
            return Decision(
                "deny", ("gate:error",), f"the policy gate failed: {_detail(error, self.policy)}", outcome="gate_error"
            )

    def _evaluate(self, call: ToolCall, ledger: Ledger) -> Decision:
        name, args = call.name, call.arguments
        validator = self._validators.get(name) if isinstance(name, str) else None
        if validator is None:
            available = ", ".join(self._validators) or "none"
            too_long = isinstance(name, str) and len(name) > MAX_TOOL_NAME_CHARS
            return Decision(
                "deny",
                ("gate:unknown_tool",),
                f"a tool name is at most {MAX_TOOL_NAME_CHARS} characters; this one has {len(name):,}."
                if too_long
                else f"there is no tool named {name!r:.60}.",
                f"Available tools: {available}.",
                outcome="unknown_tool",
            )
        problem = plain_json_problem(args)
        if problem is None and not isinstance(args, dict):
            problem = f"arguments must be a JSON object, not {type(args).__name__}"
        if problem is None and (problem := validator.problem(args)) is not None:
            problem = clip(self.policy.redact(problem), MAX_DETAIL_CHARS)
        if problem is not None:
            return Decision(
                "deny",
                ("gate:invalid_arguments",),
                f"invalid arguments for {name}: {problem}.",
                f"Check the arguments against {name}'s parameters.",
                outcome="malformed",
            )

        if self.policy.tallies:  # the session's running totals the conditions read (gate/session.py)
            ledger.bind_tallies(self.policy.tallies)
        rules = self.policy.rules_for(name)
        context = _LazyContext(name, args, ledger, rules, self._parsers.get(name, _NO_PARSERS))
        forbidding, reasons = [], []
        for rule in () if _screened(rules.forbid_screen, context) else rules.forbid:
            outcome = _condition(rule, context)
            if outcome is not False:
                forbidding.append(rule)
                reasons.append(rule.reason if outcome is True else self._error_reason(rule, outcome))
        if forbidding:
            return _decision("deny", forbidding, reasons)

        if self._limited and (exceeded := self._limits_exceeded(name, ledger)):
            return exceeded

        asking, failed, reasons, failed_reasons = [], [], [], []
        for rule in () if _screened(rules.ask_screen, context) else rules.ask:
            outcome = _condition(rule, context)
            if outcome is True:
                asking.append(rule)
                reasons.append(rule.reason)
            elif outcome is not False:
                failed.append(rule)
                failed_reasons.append(self._error_reason(rule, outcome))
        if failed:
            return _decision("deny", failed, failed_reasons)
        if asking:
            return _decision("ask", asking, reasons)

        permitting, errors = [], []
        for rule in () if _screened(rules.permit_screen, context) else rules.permit:
            outcome = _condition(rule, context)
            if outcome is True:
                permitting.append(rule)
            elif outcome is not False:
                errors.append(self._error_reason(rule, outcome))
        if permitting:
            return _decision("allow", permitting, [r.reason for r in permitting])
        if self.policy.default == "allow":
            return Decision("allow", ("default:allow",), "no rule forbids this call and the policy allows by default.")
        because = f" ({'; '.join(errors)})" if errors else ""
        return Decision(
            "deny",
            ("default:deny",),
            f"no rule permits calling {name} here{because}.",
            "Only calls a rule permits may run; try another approach.",
        )

    def _limits_exceeded(self, name: str, ledger: Ledger) -> Decision | None:
        limits = self.policy.limits
        hits: list[tuple[str, str]] = []
        for key, used in ((name, ledger.calls_of(name)), (ALL_TOOLS, ledger.total_calls)):
            cap = limits.max_calls.get(key)
            if cap is not None and used >= cap:
                what = f"{name} may run" if key != ALL_TOOLS else "tools may run"
                hits.append((f"limit:max_calls:{key}", f"{what} at most {cap} times per episode"))
        for key, used in ((name, ledger.denials_of(name)), (ALL_TOOLS, ledger.total_denials)):
            cap = limits.max_denials.get(key)
            if cap is not None and used >= cap:
                what = f"{name} calls were" if key != ALL_TOOLS else "tool calls were"
                hits.append((f"limit:max_denials:{key}", f"{what} denied {cap} times this episode, the most allowed"))
        for key in (name, ALL_TOOLS):
            cap = limits.max_consecutive_errors.get(key)
            if cap is not None and ledger.consecutive_errors.get(key, 0) >= cap:
                what = f"{name}" if key != ALL_TOOLS else "tool calls"
                hits.append(
                    (
                        f"limit:max_consecutive_errors:{key}",
                        f"{what} failed {cap} times in a row, which uses up the retry budget",
                    )
                )
        if not hits:
            return None
        return Decision(
            "deny",
            tuple(rule_id for rule_id, _ in hits),
            "; ".join(text for _, text in hits) + ".",
            "Answer with what you already have.",
        )

    def _error_reason(self, rule: Rule, detail: str) -> str:
        shown = without_quoted_values(detail, rule.when or "")
        return f"rule {rule.id} could not be evaluated ({clip(self.policy.redact(shown), MAX_DETAIL_CHARS)})"

    def _settle(self, call: ToolCall, decision: Decision) -> Decision:
        """An ask settled by the approver; the decision keeps its id and rule ids."""
        if self.approver is None:
            return dataclasses.replace(
                decision, effect="deny", outcome="denied", reason=f"{decision.reason} (needs approval; none is available)"
            )
        try:
            approved = self.approver(call, decision) is True
        except Exception as error:  # a failing approver is a refusal; its message may quote the call, so only its type
            return dataclasses.replace(
                decision, effect="deny", outcome="denied", reason=f"{decision.reason} (approver failed: {type(error).__name__})"
            )
        if approved:
            return dataclasses.replace(decision, effect="allow", outcome="allowed", reason=f"{decision.reason} (approved)")
        return dataclasses.replace(decision, effect="deny", outcome="denied", reason=f"{decision.reason} (approval refused)")


class _LazyContext:
    """The CEL context, built on first use and only from the variables the tool's rules
    read: converting `history` costs about 10 us per entry and parsing a path touches the
    disk, so neither happens unless a condition needs it. Of `args` only the fields the
    rules name are converted (all of them when a rule reads `args` as a whole), so a long
    argument no rule reads, such as a file's content, costs nothing. A context that cannot
    be built is an error for every condition.

    The ledger checks what enters it, so only `parsed` (the parsers' output) is checked here."""

    __slots__ = ("_args", "_built", "_ledger", "_name", "_parsers", "_rules")

    def __init__(self, name: str, args: dict[str, Any], ledger: Ledger, rules: ToolRules, parsers: dict[str, Parser]) -> None:
        self._name, self._args, self._ledger, self._rules, self._parsers = name, args, ledger, rules, parsers
        self._built: Any = None

    def _value(self, key: str) -> Any:
        ledger = self._ledger
        if key == "tool":
            return self._name
        if key == "args":
            fields = self._rules.arguments
            return self._args if fields is None else {k: self._args[k] for k in fields if k in self._args}
        if key == "parsed":
            return {arg: parse(self._args[arg]) for arg, parse in self._parsers.items() if arg in self._args}
        if key == "state":
            return ledger.facts.copy()
        if key == "history":
            return list(ledger.history)
        if key == "counts":
            return ledger.seen_by(ledger.counts, self._name)
        if key == "denials":
            return ledger.seen_by(ledger.denials, self._name)
        return ledger.denied_before(self._name, self._args)  # "denied_before"

    def get(self) -> Any:
        """A cel.Context, or a string saying why there is none."""
        if self._built is not None:
            return self._built
        variables = self._rules.variables
        if "state" in variables and self._ledger.facts_problem is not None:
            self._built = f"state: {self._ledger.facts_problem}"
            return self._built
        session = self._ledger.session_view(self._name, self._args) if "session" in variables else {}
        if isinstance(session, str):  # a tally that is no longer exact: every condition fails, closed
            self._built = f"session: {session}"
            return self._built
        try:
            values = {key: session if key == "session" else self._value(key) for key in variables}
        except Exception as error:  # a parser bug: fail closed, naming it
            self._built = f"the arguments could not be parsed: {type(error).__name__}"
            return self._built
        if "parsed" in values and (problem := plain_json_problem(values["parsed"])) is not None:
            self._built = f"parsed: {problem.replace('arguments', 'values')}"
            return self._built
        try:
            self._built = cel.Context(variables=values)
            for name in self._rules.functions:
                self._built.add_function(name, VALUE_FUNCTIONS[name])
        except Exception as error:
            self._built = f"the context could not be converted to CEL: {type(error).__name__}"
        return self._built


def _bound(parse: Callable[[str, WorkFolder], dict[str, Any]], folder: WorkFolder) -> Parser:
    return lambda text: parse(text, folder)


def _unknown_arguments(policy: Policy, specs: list[ToolSpec]) -> list[str]:
    """Problems with the arguments rules read and `parse` names, against the tools' schemas:
    a name a tool does not have (for a "*" rule: that no tool has), a parsed argument that
    is not a string. Tools the policy names that do not exist are left to strict_tool_names."""
    closed = {spec.name: _declared_arguments(spec.parameters) for spec in specs}
    problems = []
    for rule in policy.rules:
        for name in sorted(rule.arguments):
            tools = [t for t in (rule.tools or closed) if t in closed]
            lacking = [t for t in tools if closed[t] is not None and name not in closed[t]]
            if rule.tools is None and tools and len(lacking) == len(tools):
                problems.append(f"rule {rule.id!r}: when reads args.{name}, which no tool has")
            elif rule.tools is not None and lacking:
                problems.append(f"rule {rule.id!r}: when reads args.{name}, which {', '.join(lacking)} does not have")
    problems += tally_argument_problems(policy, closed)
    schemas = {spec.name: spec.parameters for spec in specs}
    for tool, table in policy.parse.items():
        properties = schemas.get(tool, {}).get("properties", {}) if tool in schemas else None
        for argument in table:
            if properties is None:
                continue
            kind = properties.get(argument, {}).get("type") if isinstance(properties, dict) else None
            if kind != "string":
                problems.append(f"parse.{tool}.{argument}: {tool} has no string argument {argument!r}")
    return problems


def _declared_arguments(schema: dict[str, Any]) -> frozenset[str] | None:
    """The argument names a tool's schema allows, or None when it allows any name."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    extra = schema.get("additionalProperties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or extra is True or isinstance(extra, dict):
        return None
    return frozenset(properties)


def _screened(screen: tuple[Any, ...] | None, context: _LazyContext) -> bool:
    """True when a screen proves that none of its rules' conditions holds or fails."""
    if screen is None:
        return False
    built = context.get()
    if isinstance(built, str):
        return False
    try:
        for program in screen:
            if program.execute(built) is not False:
                return False
    except Exception:  # some condition failed: the rules one by one will say which
        return False
    return True


def _condition(rule: Rule, context: _LazyContext) -> bool | str:
    """True or False, or a string describing why the condition has no boolean value."""
    if rule.program is None:
        return True
    built = context.get()
    if isinstance(built, str):
        return built
    try:
        result = rule.program.execute(built)
    except Exception as error:  # KeyError (missing key), TypeError (no overload), RuntimeError, ...
        return f"{type(error).__name__}: {error}"
    if result is True or result is False:
        return result
    return f"the condition gave a {type(result).__name__}, not a boolean"  # never the value: it may be an argument


def _decision(effect: GateEffect, rules: list[Rule], reasons: list[str]) -> Decision:
    return Decision(
        effect,
        tuple(rule.id for rule in rules),
        " ".join(_sentence(r) for r in dict.fromkeys(reasons) if r),
        " ".join(_sentence(h) for h in dict.fromkeys(rule.hint for rule in rules if rule.hint)),
    )


def _sentence(text: str) -> str:
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def _detail(error: BaseException, policy: Policy) -> str:
    try:
        text = without_quoted_values(f"{type(error).__name__}: {error}", "")
    except Exception:
        text = type(error).__name__
    return clip(policy.redact(text), MAX_DETAIL_CHARS)


_QUOTED = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def without_quoted_values(detail: str, written: str) -> str:
    """An error message as a decision's reason may show it: every quoted piece (CEL and Python
    quote the values they fail on, `KeyError: 'PASSPORT123'` for `args[args.kind]`) replaced by
    '...', unless the policy author wrote it in the condition (`written`), as a key a
    condition reads is. The audit log promises a digest of the arguments, never a value.

    >>> without_quoted_values("KeyError: 'PASSPORT123'", "args[args.kind] == 1")
    "KeyError: '...'"
    >>> without_quoted_values("KeyError: 'verified'", "state.verified")
    "KeyError: 'verified'"
    """
    def shown(match: re.Match[str]) -> str:
        inner = match[0][1:-1]
        if inner and re.search(rf"(?<![\w]){re.escape(inner)}(?![\w])", written):
            return match[0]
        return f"{match[0][0]}...{match[0][0]}"

    return _QUOTED.sub(shown, detail)
