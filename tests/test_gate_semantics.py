"""The gate's decision semantics, checked two ways.

1. A deliberately naive reference evaluator, written here as a plain loop over every
   rule with conditions as Python functions, must agree with `Gate.evaluate` (effect
   and rule ids) on 10,000 generated (policy, call, ledger) cases. The conditions come
   from a fixed set of CEL templates, each paired with a Python function meaning the
   same thing, including where CEL errors (a missing key) and how `&&`/`||` absorb
   errors (`false && error` is false, in either order).
2. Hypothesis properties, the ones Cedar proves for its own semantics: a forbid beats a
   permit, no permit means no allow under default deny, rule order and duplicates do not
   matter, adding a permit never turns allow into deny, adding a forbid never turns deny
   into allow, and a rule whose condition errors never allows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolpolicy.gate import Gate, Ledger, Policy
from toolpolicy.types import ToolCall, ToolSpec

ERR = object()  # a condition with no boolean value: an error or a non-bool result
TOOLS = ("alpha", "beta", "gamma")
SPECS = [
    ToolSpec(
        name,
        "test tool",
        {
            "type": "object",
            "properties": {"n": {"type": "integer"}, "s": {"type": "string"}, "flag": {"type": "boolean"}},
            "additionalProperties": False,
        },
    )
    for name in TOOLS
]


@dataclass(frozen=True)
class Condition:
    """A CEL source and a Python function of the same context meaning the same thing.
    The function may raise (CEL error) or return a non-bool (also no boolean value)."""

    source: str
    fn: Callable[[dict[str, Any]], Any]


def value(condition: Condition, ctx: dict[str, Any]) -> Any:
    try:
        result = condition.fn(ctx)
    except Exception:
        return ERR
    return result if isinstance(result, bool) else ERR


def _atoms() -> tuple[list[Condition], list[Condition]]:
    """(conditions that are boolean or error, conditions that are not boolean)."""
    boolean = [Condition("true", lambda c: True), Condition("false", lambda c: False)]
    for k in (-1, 0, 2, 4):
        boolean.append(Condition(f"args.n > {k}", lambda c, k=k: c["args"]["n"] > k))
        boolean.append(Condition(f"args.n == {k}", lambda c, k=k: c["args"]["n"] == k))
        boolean.append(Condition(f"state.level >= {k}", lambda c, k=k: c["state"]["level"] >= k))
        boolean.append(Condition(f"size(history) >= {k}", lambda c, k=k: len(c["history"]) >= k))
    for p in ("", "a", "b", "ab", "/"):
        boolean.append(Condition(f"args.s.startsWith('{p}')", lambda c, p=p: c["args"]["s"].startswith(p)))
        boolean.append(Condition(f"args.s.contains('{p}')", lambda c, p=p: p in c["args"]["s"]))
    for key in ("n", "s", "flag"):
        boolean.append(Condition(f"has(args.{key})", lambda c, key=key: key in c["args"]))
    # conditions that read `args` as a whole: the gate must not narrow it to the named fields
    for k in (1, 2):
        boolean.append(Condition(f"size(args) >= {k}", lambda c, k=k: len(c["args"]) >= k))
    boolean += [
        Condition("args['s'] == 'ab'", lambda c: c["args"]["s"] == "ab"),
        Condition("'extra' in args", lambda c: "extra" in c["args"]),
        Condition("args.exists(k, k == 'extra')", lambda c: "extra" in c["args"]),
        Condition("args.all(k, k != 'flag') && has(args.n)", lambda c: "flag" not in c["args"] and "n" in c["args"]),
    ]
    for tool in (*TOOLS, "delta"):
        boolean.append(Condition(f"tool == '{tool}'", lambda c, tool=tool: c["tool"] == tool))
        for k in (1, 2):
            boolean.append(
                Condition(
                    f"'{tool}' in counts && counts['{tool}'] >= {k}",
                    lambda c, tool=tool, k=k: tool in c["counts"] and c["counts"][tool] >= k,
                )
            )
    for role in ("admin", "guest"):
        boolean.append(Condition(f"state.role == '{role}'", lambda c, role=role: c["state"]["role"] == role))
    boolean += [
        Condition("args.flag", lambda c: c["args"]["flag"]),
        Condition("state.verified", lambda c: c["state"]["verified"]),
        Condition(
            "has(state.verified) && state.verified", lambda c: "verified" in c["state"] and c["state"]["verified"]
        ),
        Condition(
            "history.exists(h, h.outcome == 'denied')", lambda c: any(h["outcome"] == "denied" for h in c["history"])
        ),
        Condition(
            "history.exists(h, h.name == tool && h.outcome == 'error')",
            lambda c: any(h["name"] == c["tool"] and h["outcome"] == "error" for h in c["history"]),
        ),
        Condition("state.nosuch.size() > 0", lambda c: c["state"]["nosuch"]),  # always an error
        Condition("1 / (size(history) - size(history)) == 1", lambda c: 1 / 0),  # always an error
    ]
    non_boolean = [
        Condition("args.n", lambda c: c["args"]["n"]),
        Condition("state.level", lambda c: c["state"]["level"]),
        Condition("args.s + 'x'", lambda c: c["args"]["s"] + "x"),
        Condition("size(history)", lambda c: len(c["history"])),
    ]
    return boolean, non_boolean


BOOLEAN_ATOMS, NON_BOOLEAN_ATOMS = _atoms()


def negate(a: Condition) -> Condition:
    def fn(c: dict[str, Any]) -> Any:
        v = value(a, c)
        if v is ERR:
            raise ValueError
        return not v

    return Condition(f"!({a.source})", fn)


def conjoin(a: Condition, b: Condition, op: str) -> Condition:
    """CEL's commutative `&&`/`||`: a deciding value on either side wins over an error."""
    decisive = op == "||"  # True decides ||, False decides &&

    def fn(c: dict[str, Any]) -> Any:
        va, vb = value(a, c), value(b, c)
        if va is decisive or vb is decisive:
            return decisive
        if va is ERR or vb is ERR:
            raise ValueError
        return not decisive

    return Condition(f"({a.source}) {op} ({b.source})", fn)


def random_condition(rng: random.Random, depth: int = 0) -> Condition | None:
    roll = rng.random()
    if depth == 0 and roll < 0.15:
        return None
    if depth == 0 and roll < 0.22:
        return rng.choice(NON_BOOLEAN_ATOMS)
    if depth < 2 and roll < 0.45:
        if rng.random() < 0.3:
            return negate(random_condition(rng, depth + 1) or BOOLEAN_ATOMS[0])
        a = random_condition(rng, depth + 1) or BOOLEAN_ATOMS[0]
        b = random_condition(rng, depth + 1) or BOOLEAN_ATOMS[1]
        return conjoin(a, b, rng.choice(("&&", "||")))
    return rng.choice(BOOLEAN_ATOMS)


@dataclass(frozen=True)
class RuleSpec:
    id: str
    effect: str
    tools: tuple[str, ...] | None  # None: "*"
    condition: Condition | None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "effect": self.effect,
            "reason": f"because {self.id}",
            "tools": "*" if self.tools is None else list(self.tools),
        }
        if self.condition is not None:
            out["when"] = self.condition.source
        return out


@dataclass(frozen=True)
class PolicySpec:
    default: str
    rules: tuple[RuleSpec, ...]
    max_calls: tuple[tuple[str, int], ...] = ()
    max_errors: tuple[tuple[str, int], ...] = ()
    max_denials: tuple[tuple[str, int], ...] = ()

    def build(self) -> Policy:
        return Policy.from_dict(
            {
                "default": self.default,
                "rules": [rule.to_dict() for rule in self.rules],
                "limits": {
                    "max_calls": dict(self.max_calls),
                    "max_consecutive_errors": dict(self.max_errors),
                    "max_denials": dict(self.max_denials),
                },
            }
        )

    def with_rules(self, rules: tuple[RuleSpec, ...]) -> PolicySpec:
        return PolicySpec(self.default, rules, self.max_calls, self.max_errors, self.max_denials)


def random_policy(rng: random.Random) -> PolicySpec:
    rules = []
    for number in range(rng.randint(0, 8)):
        tools = None if rng.random() < 0.3 else tuple(rng.sample((*TOOLS, "delta"), rng.randint(1, 2)))
        rules.append(
            RuleSpec(f"r{number}", rng.choice(("permit", "permit", "forbid", "ask")), tools, random_condition(rng))
        )
    limit_names = (*TOOLS, "*")
    max_calls = tuple((name, rng.randint(0, 3)) for name in rng.sample(limit_names, rng.randint(0, 2)))
    max_errors = tuple((name, rng.randint(1, 2)) for name in rng.sample(limit_names, rng.randint(0, 2)))
    max_denials = tuple((name, rng.randint(0, 2)) for name in rng.sample(limit_names, rng.randint(0, 1)))
    return PolicySpec(rng.choice(("allow", "deny")), tuple(rules), max_calls, max_errors, max_denials)


def random_args(rng: random.Random) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if rng.random() < 0.7:
        args["n"] = rng.randint(-2, 5)
    if rng.random() < 0.7:
        args["s"] = rng.choice(("", "a", "ab", "ba", "abc", "x/y", "/b"))
    if rng.random() < 0.4:
        args["flag"] = rng.random() < 0.5
    if rng.random() < 0.05:  # breaks the schema
        args[rng.choice(("n", "s", "flag", "extra"))] = rng.choice(("1", 1.5, None, [1], True))
    return args


def random_case(rng: random.Random) -> tuple[ToolCall, dict[str, Any], list[tuple[ToolCall, str]]]:
    name = rng.choice(TOOLS) if rng.random() < 0.95 else rng.choice(("delta", "", "ALPHA"))
    facts: dict[str, Any] = {}
    if rng.random() < 0.6:
        facts["verified"] = rng.random() < 0.5
    if rng.random() < 0.6:
        facts["level"] = rng.randint(0, 5)
    if rng.random() < 0.5:
        facts["role"] = rng.choice(("admin", "guest", "user"))
    history = [  # at most 4 calls: all of them inside the ledger's HISTORY_WINDOW
        (ToolCall(rng.choice(TOOLS), random_args(rng)), rng.choice(("ok", "ok", "error", "denied")))
        for _ in range(rng.randint(0, 4))
    ]
    return ToolCall(name, random_args(rng)), facts, history


def make_ledger(facts: dict[str, Any], history: list[tuple[ToolCall, str]]) -> Ledger:
    ledger = Ledger(facts=dict(facts))
    for call, outcome in history:
        ledger.record(call, outcome)  # type: ignore[arg-type]
    return ledger


# ---------------------------------------------------------------- the reference


def reference(
    policy: PolicySpec, call: ToolCall, facts: dict[str, Any], history: list[tuple[ToolCall, str]]
) -> tuple[str, tuple[str, ...]]:
    """The gate's semantics written as plainly as possible: no index, no laziness."""
    if call.name not in TOOLS:
        return "deny", ("gate:unknown_tool",)
    args = call.arguments
    types = {
        "n": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "s": lambda v: isinstance(v, str),
        "flag": lambda v: isinstance(v, bool),
    }
    for key, item in args.items():
        if key not in types or not types[key](item):
            return "deny", ("gate:invalid_arguments",)

    ran = [(c, o) for c, o in history if o != "denied"]
    counts: dict[str, int] = {}
    for c, _ in ran:
        counts[c.name] = counts.get(c.name, 0) + 1
    denied: dict[str, int] = {}  # what max_denials limits; max_calls limits counts (calls that ran)
    for c, o in history:
        if o == "denied":
            denied[c.name] = denied.get(c.name, 0) + 1

    def trailing_errors(entries: list[tuple[ToolCall, str]]) -> int:
        n = 0
        for _, outcome in reversed(entries):
            if outcome != "error":
                break
            n += 1
        return n

    ctx = {
        "tool": call.name,
        "args": args,
        "state": facts,
        "counts": counts,
        "history": [{"name": c.name, "args": c.arguments, "outcome": o} for c, o in history],
    }
    results = []
    for rule in policy.rules:
        if rule.tools is not None and call.name not in rule.tools:
            continue
        results.append((rule, True if rule.condition is None else value(rule.condition, ctx)))
    forbids = [r.id for r, v in results if r.effect == "forbid" and v is not False]
    if forbids:  # a forbid rule is named before any limit the call also reaches
        return "deny", tuple(forbids)

    hits = []
    calls_cap, errors_cap, denials_cap = dict(policy.max_calls), dict(policy.max_errors), dict(policy.max_denials)
    if call.name in calls_cap and counts.get(call.name, 0) >= calls_cap[call.name]:
        hits.append(f"limit:max_calls:{call.name}")
    if "*" in calls_cap and len(ran) >= calls_cap["*"]:
        hits.append("limit:max_calls:*")
    if call.name in denials_cap and denied.get(call.name, 0) >= denials_cap[call.name]:
        hits.append(f"limit:max_denials:{call.name}")
    if "*" in denials_cap and len(history) - len(ran) >= denials_cap["*"]:
        hits.append("limit:max_denials:*")
    if call.name in errors_cap and trailing_errors([e for e in ran if e[0].name == call.name]) >= errors_cap[call.name]:
        hits.append(f"limit:max_consecutive_errors:{call.name}")
    if "*" in errors_cap and trailing_errors(ran) >= errors_cap["*"]:
        hits.append("limit:max_consecutive_errors:*")
    if hits:
        return "deny", tuple(hits)

    failed_asks = [r.id for r, v in results if r.effect == "ask" and v is ERR]
    if failed_asks:
        return "deny", tuple(failed_asks)
    asks = [r.id for r, v in results if r.effect == "ask" and v is True]
    if asks:
        return "ask", tuple(asks)
    permits = [r.id for r, v in results if r.effect == "permit" and v is True]
    if permits:
        return "allow", tuple(permits)
    return ("allow", ("default:allow",)) if policy.default == "allow" else ("deny", ("default:deny",))


def gate_answer(policy: PolicySpec | Policy, call: ToolCall, ledger: Ledger) -> tuple[str, tuple[str, ...]]:
    built = policy.build() if isinstance(policy, PolicySpec) else policy
    decision = Gate(built, SPECS, strict_tool_names=False).evaluate(call, ledger)
    return decision.effect, decision.rule_ids


def test_gate_agrees_with_the_naive_reference_on_10000_cases() -> None:
    rng = random.Random(20240611)
    cases = 0
    effects: dict[str, int] = {}
    while cases < 10_000:
        spec = random_policy(rng)
        gate = Gate(spec.build(), SPECS, strict_tool_names=False)
        for _ in range(10):
            call, facts, history = random_case(rng)
            got = gate.evaluate(call, make_ledger(facts, history))
            expected = reference(spec, call, facts, history)
            cases += 1
            effects[expected[0]] = effects.get(expected[0], 0) + 1
            assert (got.effect, got.rule_ids) == expected, (
                f"gate {got.effect} {got.rule_ids} ({got.reason}) != reference {expected}\n"
                f"policy: {spec}\ncall: {call}\nfacts: {facts}\nhistory: {history}"
            )
    # the generator must exercise every outcome, or agreement means little
    assert min(effects.get(e, 0) for e in ("allow", "deny", "ask")) > 500, effects


# ---------------------------------------------------------------- properties

conditions = st.one_of(
    st.none(),
    st.sampled_from(NON_BOOLEAN_ATOMS),
    st.recursive(
        st.sampled_from(BOOLEAN_ATOMS),
        lambda inner: st.one_of(
            inner.map(negate),
            st.tuples(inner, inner, st.sampled_from(("&&", "||"))).map(lambda t: conjoin(*t)),
        ),
        max_leaves=3,
    ),
)
tool_scopes = st.one_of(
    st.none(), st.lists(st.sampled_from((*TOOLS, "delta")), min_size=1, max_size=2, unique=True).map(tuple)
)


@st.composite
def policies(
    draw: st.DrawFn, effects: tuple[str, ...] = ("permit", "forbid", "ask"), default: str | None = None
) -> PolicySpec:
    count = draw(st.integers(0, 6))
    rules = tuple(
        RuleSpec(f"r{i}", draw(st.sampled_from(effects)), draw(tool_scopes), draw(conditions)) for i in range(count)
    )
    return PolicySpec(default or draw(st.sampled_from(("allow", "deny"))), rules)


@st.composite
def cases(draw: st.DrawFn) -> tuple[ToolCall, Ledger]:
    seed = draw(st.integers(0, 2**32 - 1))
    call, facts, history = random_case(random.Random(seed))
    return call, make_ledger(facts, history)


FAST = settings(max_examples=120, deadline=None)


@FAST
@given(policies(), cases(), conditions)
def test_a_forbid_beats_any_permit(policy: PolicySpec, case: tuple[ToolCall, Ledger], when: Condition | None) -> None:
    call, ledger = case
    permits = (RuleSpec("p0", "permit", None, None), RuleSpec("p1", "permit", None, when))
    forbid = RuleSpec("f", "forbid", None, None)
    assert gate_answer(policy.with_rules((*permits, *policy.rules, forbid)), call, ledger)[0] == "deny"


@FAST
@given(policies(effects=("forbid", "ask"), default="deny"), cases())
def test_no_permit_under_default_deny_never_allows(policy: PolicySpec, case: tuple[ToolCall, Ledger]) -> None:
    call, ledger = case
    gate = Gate(policy.build(), SPECS, strict_tool_names=False)
    assert gate.evaluate(call, ledger).effect in ("deny", "ask")
    assert gate.decide(call, ledger).effect == "deny"  # no approver: an ask is a deny


@FAST
@given(policies(), cases(), st.randoms(use_true_random=False))
def test_rule_order_and_duplicates_do_not_change_the_decision(
    policy: PolicySpec, case: tuple[ToolCall, Ledger], rng: random.Random
) -> None:
    call, ledger = case
    before = gate_answer(policy, call, ledger)
    copies = [RuleSpec(f"{r.id}.copy", r.effect, r.tools, r.condition) for r in policy.rules if rng.random() < 0.5]
    shuffled = [*policy.rules, *copies]
    rng.shuffle(shuffled)
    after = gate_answer(policy.with_rules(tuple(shuffled)), call, ledger)
    assert after[0] == before[0]
    assert {rule_id.removesuffix(".copy") for rule_id in after[1]} == set(before[1])


@FAST
@given(policies(), cases(), tool_scopes, conditions)
def test_adding_a_permit_never_turns_allow_into_deny(
    policy: PolicySpec, case: tuple[ToolCall, Ledger], tools: tuple[str, ...] | None, condition: Condition | None
) -> None:
    call, ledger = case
    if gate_answer(policy, call, ledger)[0] == "allow":
        grown = policy.with_rules((*policy.rules, RuleSpec("added", "permit", tools, condition)))
        assert gate_answer(grown, call, ledger)[0] == "allow"


@FAST
@given(policies(), cases(), tool_scopes, conditions)
def test_adding_a_forbid_never_turns_deny_into_allow(
    policy: PolicySpec, case: tuple[ToolCall, Ledger], tools: tuple[str, ...] | None, condition: Condition | None
) -> None:
    call, ledger = case
    before = gate_answer(policy, call, ledger)[0]
    grown = policy.with_rules((*policy.rules, RuleSpec("added", "forbid", tools, condition)))
    after = gate_answer(grown, call, ledger)[0]
    if before == "deny":
        assert after == "deny"
    if before == "ask":
        assert after in ("ask", "deny")


ERRORING = [atom for atom in BOOLEAN_ATOMS if "nosuch" in atom.source or "1 / " in atom.source] + NON_BOOLEAN_ATOMS[:2]


@FAST
@given(policies(effects=("permit",), default="deny"), cases(), st.sampled_from(ERRORING))
def test_a_rule_whose_condition_errors_never_allows(
    policy: PolicySpec, case: tuple[ToolCall, Ledger], broken: Condition
) -> None:
    call, ledger = case
    # an erroring permit is inert: it never adds an allow
    with_broken_permit = policy.with_rules((*policy.rules, RuleSpec("broken", "permit", None, broken)))
    effect, rule_ids = gate_answer(with_broken_permit, call, ledger)
    assert "broken" not in rule_ids
    assert effect == gate_answer(policy, call, ledger)[0]
    # an erroring forbid or ask denies, even under default allow with an unconditional permit
    for effect_name in ("forbid", "ask"):
        rules = (RuleSpec("always", "permit", None, None), RuleSpec("broken", effect_name, None, broken))
        assert gate_answer(PolicySpec("allow", rules), call, ledger)[0] == "deny"
