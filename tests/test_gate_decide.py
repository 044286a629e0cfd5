"""Gate.decide on concrete cases: checks before rules, limits, ask and the approver, the
observation the model sees, the ledger, and fuzzed calls that must never raise."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolpolicy.gate import AuditLog, Decision, Gate, Ledger, Policy, verify
from toolpolicy.gate.ledger import HISTORY_WINDOW, plain_json_problem
from toolpolicy.types import ToolCall, ToolSpec

SPECS = [
    ToolSpec(
        "read_file",
        "read",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    ),
    ToolSpec(
        "search",
        "search",
        {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "filters": {"type": "object"}},
            "required": ["query"],
        },
    ),
]

POLICY = """
default: deny
rules:
  - id: read-work
    effect: permit
    tools: [read_file]
    when: args.path.startsWith('/work/')
  - id: no-dotdot
    effect: forbid
    tools: [read_file]
    when: args.path.contains('..')
    reason: paths may not contain '..'
    hint: use an absolute path under /work
  - id: search-verified
    effect: permit
    tools: [search]
    when: has(state.verified) && state.verified
  - id: search-big
    effect: ask
    tools: [search]
    when: has(args.limit) && args.limit > 100
    reason: big searches need approval
  - id: broken-permit
    effect: permit
    tools: [search]
    when: args.filters.missing == 1
limits:
  max_calls: {read_file: 2, "*": 5}
  max_consecutive_errors: {search: 2}
redact: ['sk-[a-z]{6,}']
"""


def gate(**kwargs: Any) -> Gate:
    return Gate(Policy.from_yaml(POLICY, "test.yaml"), SPECS, **kwargs)


def read(path: str) -> ToolCall:
    return ToolCall("read_file", {"path": path})


def test_permit_forbid_and_default() -> None:
    g = gate()
    assert g.decide(read("/work/a.txt")).rule_ids == ("read-work",)
    denied = g.decide(read("/work/../etc/passwd"))
    assert (denied.effect, denied.rule_ids) == ("deny", ("no-dotdot",))
    assert denied.observation() == (
        "Tool call denied by policy (rule no-dotdot): paths may not contain '..'. Hint: use an absolute path under /work."
    )
    fallback = g.decide(read("/etc/hosts"))
    assert (fallback.effect, fallback.rule_ids) == ("deny", ("default:deny",))
    assert "no rule permits calling read_file" in fallback.observation()


def test_unknown_tools_and_bad_arguments_are_denied_before_any_rule() -> None:
    g = gate()
    unknown = g.decide(ToolCall("rm_rf", {}))
    assert unknown.rule_ids == ("gate:unknown_tool",) and "read_file, search" in unknown.observation()
    for args in ({"path": 3}, {}, {"path": "/work/a", "extra": 1}, ["not", "an", "object"]):
        decision = g.decide(ToolCall("read_file", args))  # type: ignore[arg-type]
        assert decision.rule_ids == ("gate:invalid_arguments",), args
    assert "'path' is a required property" in g.decide(ToolCall("read_file", {})).reason


def test_state_and_an_erroring_permit() -> None:
    g = gate()
    call = ToolCall("search", {"query": "x"})
    denied = g.evaluate(call, Ledger())
    assert denied.effect == "deny" and "broken-permit could not be evaluated" in denied.reason
    assert g.evaluate(call, Ledger(facts={"verified": True})).rule_ids == ("search-verified",)


def test_ask_goes_to_the_approver_and_without_one_is_denied() -> None:
    call = ToolCall("search", {"query": "x", "limit": 500})
    ledger = Ledger(facts={"verified": True})
    assert gate().evaluate(call, ledger).effect == "ask"
    no_approver = gate().decide(call, ledger)
    assert no_approver.effect == "deny" and "none is available" in no_approver.reason
    assert no_approver.observation().startswith("Tool call denied by policy (rule search-big): big searches")

    seen: list[Decision] = []

    def approve(c: ToolCall, d: Decision) -> bool:
        seen.append(d)
        return c.arguments["limit"] < 1000

    approved = gate(approver=approve).decide(call, ledger)
    assert (approved.effect, approved.rule_ids) == ("allow", ("search-big",))
    assert seen[0].effect == "ask" and seen[0].decision_id == approved.decision_id
    assert gate(approver=approve).decide(ToolCall("search", {"query": "x", "limit": 5000}), ledger).effect == "deny"

    def explode(c: ToolCall, d: Decision) -> bool:
        raise RuntimeError("approver down")

    failed = gate(approver=explode).decide(call, ledger)
    assert failed.effect == "deny" and "approver failed" in failed.reason
    assert gate(approver=lambda c, d: "yes").decide(call, ledger).effect == "deny"  # only True approves


def test_limits_and_the_retry_budget() -> None:
    g, ledger = gate(), Ledger()
    for _ in range(2):
        assert g.decide(read("/work/a"), ledger).allowed
        ledger.record(read("/work/a"), "ok")
    over = g.decide(read("/work/a"), ledger)
    assert over.rule_ids == ("limit:max_calls:read_file",) and "at most 2 times" in over.observation()

    ledger = Ledger(facts={"verified": True})
    search = ToolCall("search", {"query": "q"})
    ledger.record(search, "error")
    ledger.record(read("/work/x"), "denied")  # a denial neither resets nor extends a run of errors
    assert g.decide(search, ledger).allowed
    ledger.record(search, "error")
    assert g.decide(search, ledger).rule_ids == ("limit:max_consecutive_errors:search",)
    ledger.record(search, "ok")  # hypothetically; a success resets the run of errors
    assert g.decide(search, ledger).allowed

    ledger = Ledger(facts={"verified": True})
    for _ in range(5):
        ledger.record(search, "ok")
    assert g.decide(read("/work/a"), ledger).rule_ids == ("limit:max_calls:*",)


def test_ledger_records_history_counts_and_errors() -> None:
    ledger = Ledger()
    ledger.record(read("/work/a"), "ok")
    ledger.record(read("/work/b"), "denied")
    ledger.record(ToolCall("search", {"q": object()}), "error")
    assert ledger.counts == {"read_file": 1, "search": 1}
    assert [h["outcome"] for h in ledger.history] == ["ok", "denied", "error"]
    assert ledger.history[2]["args"] == {"_unrepresentable": True}
    assert ledger.consecutive_errors == {"read_file": 0, "*": 1, "search": 1}
    with pytest.raises(ValueError, match="outcome must be one of"):
        ledger.record(read("/work/a"), "maybe")  # type: ignore[arg-type]


def test_max_calls_counts_calls_that_ran_and_max_denials_counts_denials() -> None:
    """"may run at most 2 times" means ran: denied calls do not use up max_calls. They
    have a budget of their own, max_denials, so the policy cannot be probed without end."""
    g, ledger = gate(), Ledger()
    for _ in range(2):
        ledger.record(read("/etc/passwd"), "denied")
    assert ledger.counts == {} and ledger.denials == {"read_file": 2} and ledger.total_denials == 2
    assert g.decide(read("/work/a"), ledger).allowed  # no max_denials in POLICY: nothing caps denials
    ledger = Ledger(facts={"verified": True})
    for _ in range(5):
        ledger.record(ToolCall("search", {"query": "x", "limit": 999}), "denied")
    assert g.decide(read("/work/a"), ledger).allowed

    capped = Gate(Policy.from_yaml(POLICY.replace("limits:\n", "limits:\n  max_denials: {read_file: 2, '*': 3}\n"), "t.yaml"), SPECS)
    ledger = Ledger(facts={"verified": True})
    for _ in range(2):
        ledger.record(read("/etc/passwd"), "denied")
    over = capped.decide(read("/work/a"), ledger)
    assert over.rule_ids == ("limit:max_denials:read_file",) and "denied 2 times" in over.observation()
    assert capped.decide(ToolCall("search", {"query": "x"}), ledger).allowed
    ledger.record(ToolCall("search", {"query": "x", "limit": 999}), "denied")
    assert capped.decide(ToolCall("search", {"query": "x"}), ledger).rule_ids == ("limit:max_denials:*",)


def test_a_rule_that_forbids_a_call_is_named_rather_than_a_limit() -> None:
    """Issue 33: after one allowed and one denied call, a third call that a rule forbids
    was refused with "read_file may run at most 2 times", hiding the rule."""
    g, ledger = gate(), Ledger()
    for call in (read("/work/a"), read("/work/../etc/passwd")):
        decision = g.decide(call, ledger)
        ledger.record(call, "ok" if decision.allowed else "denied")
    third = g.decide(read("/work/../etc/shadow"), ledger)
    assert (third.effect, third.rule_ids) == ("deny", ("no-dotdot",))
    assert third.observation().startswith("Tool call denied by policy (rule no-dotdot): paths may not contain '..'.")
    assert g.decide(read("/work/b"), ledger).allowed  # one read has run of the two allowed
    ledger.record(read("/work/b"), "ok")
    assert g.decide(read("/work/../x"), ledger).rule_ids == ("no-dotdot",)  # the rule, even past the limit
    assert g.decide(read("/work/c"), ledger).rule_ids == ("limit:max_calls:read_file",)


def test_the_ledger_keeps_summaries_not_the_episode() -> None:
    """After 20,000 calls the ledger holds a window of history, counts and digests, and a
    decision that reads all of them costs what it did at the start (it used to scan and
    convert the whole history: about 0.6 s a decision at 20,000 calls)."""
    policy = Policy.from_dict(
        {
            "default": "allow",
            "rules": [
                {"id": "repeat", "effect": "forbid", "tools": "*", "when": "denied_before", "reason": "again"},
                {"id": "noisy", "effect": "forbid", "tools": "*", "reason": "too many denials",
                 "when": "'search' in denials && denials['search'] > 50000"},
                {"id": "recent", "effect": "forbid", "tools": "*", "reason": "recent",
                 "when": "history.exists(h, h.name == 'read_file' && h.outcome == 'error')"},
            ],
        }
    )
    g, ledger = Gate(policy, SPECS), Ledger()

    def median_decision_seconds() -> float:
        times = []
        for _ in range(7):
            start = time.perf_counter()
            g.evaluate(ToolCall("search", {"query": "fresh"}), ledger)
            times.append(time.perf_counter() - start)
        return sorted(times)[3]

    ledger.record(ToolCall("search", {"query": "first"}), "denied")
    early = median_decision_seconds()
    for k in range(20_000):
        ledger.record(ToolCall("search", {"query": f"q{k}"}), "denied")
    assert len(ledger.history) == HISTORY_WINDOW and ledger.denials == {"search": 20_001}
    assert g.evaluate(ToolCall("search", {"query": "first"}), ledger).rule_ids == ("repeat",)  # not forgotten
    assert g.evaluate(ToolCall("search", {"query": "fresh"}), ledger).allowed
    assert median_decision_seconds() < max(10 * early, 0.005)


def test_denied_before_ignores_key_order_and_sees_only_denials() -> None:
    policy = Policy.from_dict(
        {"default": "allow", "rules": [{"id": "again", "effect": "forbid", "tools": "*", "when": "denied_before",
                                        "reason": "denied already"}]}
    )
    g, ledger = Gate(policy, SPECS), Ledger()
    ledger.record(ToolCall("search", {"query": "q", "limit": 5}), "denied")
    ledger.record(ToolCall("search", {"query": "ran"}), "ok")
    assert g.evaluate(ToolCall("search", {"limit": 5, "query": "q"}), ledger).rule_ids == ("again",)
    assert g.evaluate(ToolCall("search", {"query": "ran"}), ledger).allowed
    assert g.evaluate(ToolCall("read_file", {"path": "q"}), ledger).allowed


def test_parsed_arguments_are_what_conditions_read(tmp_path: Path) -> None:
    """`parse` gives conditions the normalised, resolved path; the text is never matched."""
    (tmp_path / "link").symlink_to("/etc")
    policy = Policy.from_dict(
        {
            "default": "deny",
            "work_folder": "/work",
            "parse": {"read_file": {"path": "path"}},
            "rules": [{"id": "inside", "effect": "permit", "tools": ["read_file"],
                       "when": "parsed.path.plain && parsed.path.inside"}],
        }
    )
    g = Gate(policy, SPECS, work_folder=tmp_path)
    assert g.evaluate(read("/work/notes.txt")).allowed and g.evaluate(read("notes.txt")).allowed
    for outside in ("/work/../etc/passwd", "%2e%2e/etc", "link/passwd", "/etc/passwd", "\uff0e\uff0e/x"):
        assert g.evaluate(read(outside)).rule_ids == ("default:deny",), outside
    assert Gate(policy, SPECS).evaluate(read("link/passwd")).allowed  # /work is not on this disk: spelling only


def test_history_is_visible_to_conditions() -> None:
    policy = Policy.from_dict(
        {
            "default": "allow",
            "rules": [
                {
                    "id": "after-denial",
                    "effect": "forbid",
                    "tools": "*",
                    "reason": "locked",
                    "when": "history.exists(h, h.outcome == 'denied' && h.name == tool)",
                }
            ],
        }
    )
    g, ledger = Gate(policy, SPECS), Ledger()
    assert g.decide(read("/a"), ledger).allowed
    ledger.record(read("/a"), "denied")
    assert g.decide(read("/b"), ledger).rule_ids == ("after-denial",)
    assert g.decide(ToolCall("search", {"query": "q"}), ledger).allowed


def test_redaction_and_a_non_boolean_condition() -> None:
    g = gate()
    assert g.redact("key=sk-abcdefgh end") == "key=[REDACTED] end"
    policy = Policy.from_dict(
        {
            "default": "allow",
            "rules": [{"id": "count", "effect": "forbid", "tools": "*", "when": "size(history)", "reason": "r"}],
        }
    )
    decision = Gate(policy, SPECS).decide(read("/a"))
    assert decision.effect == "deny" and "not a boolean" in decision.reason


def test_decide_logs_each_decision_once(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    g = gate(audit=log)
    decisions = [g.decide(read(p)) for p in ("/work/a", "/work/../b", "/etc/c")]
    g.evaluate(read("/work/d"))  # evaluate alone is not acted on, so it is not logged
    log.close()
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 3
    assert [d.decision_id for d in decisions] == [__import__("json").loads(line)["decision_id"] for line in lines]
    assert verify(tmp_path / "audit.jsonl").ok


def test_an_invalid_tool_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="tool 'x' has an invalid JSON schema"):
        Gate(Policy.from_dict({}), [ToolSpec("x", "x", {"type": "no-such-type"})])


# ---------------------------------------------------------------- never raises


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


class Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq either")

    __hash__ = object.__hash__


JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**80), 2**80),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.sampled_from(["..", "/work/a", "\ud800", "sk-abcdefghij", "x" * 70000]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
ODD = st.one_of(
    JSONISH,
    st.sampled_from(
        [b"bytes", Hostile(), (1, 2), {1: "int key"}, {"k": {3, 4}}, math.nan, _nested(200), _nested(20_000)]
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(st.sampled_from(["read_file", "search", "nope", ""]), st.none(), st.integers()),
    st.one_of(st.dictionaries(st.sampled_from(["path", "query", "limit", "filters", "x"]), ODD, max_size=4), ODD),
    st.dictionaries(st.sampled_from(["verified", "level"]), ODD, max_size=2),
)
def test_decide_never_raises_on_random_calls(name: Any, args: Any, facts: dict[str, Any]) -> None:
    g = Gate(Policy.from_yaml(POLICY, "test.yaml"), SPECS, approver=lambda c, d: True)
    ledger = Ledger(facts=facts)
    ledger.record(ToolCall("search", args if isinstance(args, dict) else {}), "ok")
    decision = g.decide(ToolCall(name, args), ledger)
    assert decision.effect in ("allow", "deny")
    assert isinstance(decision.observation(), str)


def test_the_ledger_keeps_its_own_copy_of_what_enters_it() -> None:
    """Facts and arguments are checked and copied once, on entry: a caller changing its
    objects afterwards cannot change what later decisions read."""
    g = gate()
    facts: dict[str, Any] = {"verified": False}
    ledger = Ledger(facts=facts)
    facts["verified"] = True
    assert g.decide(ToolCall("search", {"query": "q"}), ledger).effect == "deny"
    roles = {"verified": [False]}
    ledger.learn(roles)
    roles["verified"].append(True)
    assert ledger.facts == {"verified": [False]}
    with pytest.raises(TypeError):
        ledger.facts["verified"] = True  # type: ignore[index]
    filters: dict[str, Any] = {"tags": ["a"]}
    ledger.record(ToolCall("search", {"query": "q", "filters": filters}), "ok")
    filters["tags"].append("b")
    assert ledger.history[-1]["args"] == {"query": "q", "filters": {"tags": ["a"]}}


def test_a_fact_that_is_not_json_makes_state_conditions_fail_closed() -> None:
    g = gate()
    ledger = Ledger(facts={"verified": True})
    assert g.decide(ToolCall("search", {"query": "q"}), ledger).allowed
    ledger.learn({"session": object(), "other": 1})
    assert ledger.facts_problem is not None and "'session'" in ledger.facts_problem
    assert ledger.facts == {"verified": True, "other": 1}
    denied = g.decide(ToolCall("search", {"query": "q"}), ledger)
    assert denied.effect == "deny" and "could not be evaluated" in denied.reason
    assert g.decide(read("/work/a"), ledger).allowed  # read_file's rules never read state


def test_the_gate_converts_only_the_arguments_conditions_name() -> None:
    """An argument no condition reads (a file's content) is never converted to CEL; one
    condition reading `args` as a whole brings every argument back."""
    named = Policy.from_yaml(
        "default: allow\nrules:\n"
        "  - {id: a, effect: forbid, tools: [search], when: \"args.query == 'x' || args['limit'] > 5\", reason: stop}\n"
    )
    assert named.rules_for("search").arguments == {"query", "limit"}
    whole = Policy.from_yaml(
        "default: allow\nrules:\n"
        "  - {id: a, effect: forbid, tools: [search], when: \"args.query == 'x' || args['limit'] > 5\", reason: stop}\n"
        "  - {id: b, effect: forbid, tools: '*', when: size(args) > 2, reason: stop}\n"
    )
    assert whole.rules_for("search").arguments is None and whole.rules_for("read_file").arguments is None
    for policy in (named, whole):
        g = Gate(policy, SPECS)
        assert g.evaluate(ToolCall("search", {"query": "x"})).effect == "deny"
        assert g.evaluate(ToolCall("search", {"query": "q", "limit": 9})).effect == "deny"
        assert g.evaluate(ToolCall("search", {"query": "q", "limit": 1, "filters": {"text": "long " * 1000}})).effect == (
            "allow" if policy is named else "deny"
        )


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": ["ok", "\ud800"]}, "a string that is not valid Unicode"),
        ({"ok": 1, "\ud800": 1}, "an object key that is not valid Unicode"),
        ({"a": _Text("\ud800")}, "a string that is not valid Unicode"),  # a str subclass takes the full check
        ([1, 2.5, True, None, "\u00e9", {1: "x"}], "an object key that is a int"),
        ({"a": [b"x"]}, "a bytes, which is not JSON"),
        ({"\u00e9": ["\u00fc", 3, {"k": None}], "b": _Text("ok")}, None),
    ],
)
def test_every_leaf_of_the_arguments_is_checked(value: Any, problem: str | None) -> None:
    """Leaves in the common types are checked inside their container's loop, the rest by
    recursion; either way a bad leaf anywhere is found."""
    found = plain_json_problem(value)
    assert found is None if problem is None else problem in (found or ""), found


def test_hostile_nesting_is_denied_not_crashed() -> None:
    g = gate()
    deep = g.decide(
        ToolCall("search", {"query": "q", "filters": {"a": _nested(100_000)}}), Ledger(facts={"verified": True})
    )
    assert deep.rule_ids == ("gate:invalid_arguments",) and "nested more than" in deep.reason
    # a ledger fact too deep to convert makes every condition an error: forbids deny, permits do not match
    weird = g.decide(ToolCall("search", {"query": "q"}), Ledger(facts={"verified": _nested(100_000)}))
    assert weird.effect == "deny"


def test_screens_give_the_same_answer_as_rule_by_rule() -> None:
    """The OR screen of 40 forbids (two chunks) may only skip rules when all are False."""
    rules = [{"id": f"f{i}", "effect": "forbid", "tools": ["read_file"], "when": f"args.path == '/x/{i}'", "reason": "no"}
             for i in range(40)]
    permits = [{"id": f"p{i}", "effect": "permit", "tools": ["read_file"], "when": f"args.path == '/work/{i}'"} for i in range(3)]
    failing = {"id": "broken", "effect": "forbid", "tools": ["read_file"], "when": "state.missing == 1", "reason": "no"}
    quiet = Gate(Policy.from_dict({"default": "deny", "rules": rules + permits}), SPECS)
    assert quiet.policy.rules_for("read_file").forbid_screen is not None
    assert quiet.evaluate(read("/work/elsewhere")).rule_ids == ("default:deny",)
    assert quiet.evaluate(read("/work/2")).rule_ids == ("p2",)
    assert quiet.evaluate(read("/x/37")).rule_ids == ("f37",)  # in the second chunk
    noisy = Gate(Policy.from_dict({"default": "allow", "rules": rules[:20] + [failing] + rules[20:]}), SPECS)
    decision = noisy.evaluate(read("/work/anything"))
    assert (decision.effect, decision.rule_ids) == ("deny", ("broken",))
    assert "could not be evaluated" in decision.reason
    both = noisy.evaluate(read("/x/5"))
    assert (both.effect, both.rule_ids) == ("deny", ("f5", "broken"))
