"""Limits over a session's history: a cap that holds per call must not be beaten by
splitting the sum (many small calls, one over the line, a restart between them, calls
admitted together), by spelling the amount otherwise, or by the ledger forgetting.

The tallies are declared in a policy's `session:` and read as `session.<name>`
(gate/session.py); the shipped BFCL and hotel policies write their caps per conversation
with them, and are attacked here with their real tools.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from toolpolicy.gate import Gate, Ledger, Policy, PolicyError, admit, settle
from toolpolicy.gate.session import TIME_SLOTS
from toolpolicy.types import ToolCall, ToolSpec

BANK = """
default: allow
session:
  withdrawn:
    tools: [withdraw]
    sum: double(args.amount)
rules:
  - id: per-call
    effect: forbid
    tools: [withdraw]
    when: double(args.amount) > 10000.0
    reason: one withdrawal may not exceed 10,000
  - id: per-session
    effect: forbid
    tools: [withdraw]
    when: session.withdrawn > 20000.0
    reason: withdrawals may not exceed 20,000 in a session
"""
SPECS = [
    ToolSpec("withdraw", "take money out", {"type": "object", "properties": {"amount": {}, "account": {"type": "string"}}}),
    ToolSpec("note", "write a note", {"type": "object", "properties": {"text": {"type": "string"}}}),
]


def gate_of(text: str, specs: list[ToolSpec] = SPECS) -> Gate:
    return Gate(Policy.from_yaml(textwrap.dedent(text), source="bank.yaml"), specs)


def run(gate: Gate, ledger: Ledger, name: str, **arguments: Any) -> Any:
    """Admit a call as every engine does and, when it runs, settle it as succeeded."""
    call = ToolCall(name, arguments)
    admission = admit(gate, ledger, call)
    if admission.runs:
        settle(ledger, call, True)
    return admission.decision


def moved(gate: Gate, ledger: Ledger, amounts: list[Any]) -> float:
    """The sum of the withdrawals the gate let through (a negative one moves nothing out)."""
    return sum(max(float(a), 0.0) for a in amounts if run(gate, ledger, "withdraw", amount=a).allowed)


# ------------------------------------------------------------------ splitting the sum


@pytest.mark.parametrize(
    "amounts",
    [
        [9999] * 12,  # many just under the per-call cap
        [1] * 20001,  # very many tiny ones
        [15000, 5000, 1],  # the last one only just over
        [20000, 0.01],  # a cent over
        [5000, 16000],  # one call over the remaining room
        ["9999", "9999", "9999"],  # strings, as BFCL's models write them
        [9999.5, "9.9995e3", 1.0],  # other spellings of numbers
        [-50000, 9999, 9999, 9999],  # a negative amount buys no room
    ],
    ids=["many-small", "tiny", "just-over", "a-cent-over", "one-over", "strings", "spellings", "negative"],
)
def test_no_split_of_withdrawals_moves_more_than_the_session_cap(amounts: list[Any]) -> None:
    gate, ledger = gate_of(BANK), Ledger()
    assert moved(gate, ledger, amounts) <= 20000.0


def test_the_call_that_crosses_the_cap_is_the_one_denied_and_the_rule_is_named() -> None:
    gate, ledger = gate_of(BANK), Ledger()
    assert run(gate, ledger, "withdraw", amount=9999).allowed
    assert run(gate, ledger, "withdraw", amount=9999).allowed
    third = run(gate, ledger, "withdraw", amount=9999)
    assert third.rule_ids == ("per-session",) and "20,000" in third.reason
    assert run(gate, ledger, "withdraw", amount=2).allowed  # 19,998 + 2: exactly the cap
    assert not run(gate, ledger, "withdraw", amount=0.5).allowed
    assert run(gate, ledger, "note", text="other tools are not counted").allowed


def test_calls_admitted_together_share_the_cap() -> None:
    """Admitted but not yet finished (the proxy's concurrent calls): each admission counts."""
    gate, ledger = gate_of(BANK), Ledger()
    admitted = [admit(gate, ledger, ToolCall("withdraw", {"amount": 9999})) for _ in range(6)]
    assert [a.runs for a in admitted] == [True, True, False, False, False, False]


def test_the_totals_survive_a_restart() -> None:
    """The ledger's state (the proxy writes it beside the audit log) carries the totals."""
    gate, ledger = gate_of(BANK), Ledger()
    assert moved(gate, ledger, [9999, 9999]) == 19998
    restored = Ledger.from_state(json.loads(json.dumps(ledger.state())))
    assert not run(gate, restored, "withdraw", amount=9999).allowed
    assert run(gate, restored, "withdraw", amount=2).allowed
    again = Ledger.from_state(json.loads(json.dumps(restored.state())))
    assert not run(gate_of(BANK), again, "withdraw", amount=1).allowed  # a new gate, the same policy


def test_a_ledger_counted_from_the_audit_log_fails_closed() -> None:
    """The audit log keeps no arguments, so a ledger rebuilt from it cannot know the sums."""
    gate, ledger = gate_of(BANK), Ledger()
    ledger.recount("withdraw", "allow", "digest")
    decision = run(gate, ledger, "withdraw", amount=1)
    assert decision.effect == "deny" and "per-session" in decision.rule_ids
    assert "session.withdrawn: calls it counts ran before this ledger kept it" in decision.reason
    bound = Ledger()
    run(gate, bound, "withdraw", amount=1)
    bound.recount("withdraw", "allow", "digest")
    assert not run(gate, bound, "withdraw", amount=1).allowed


def test_a_ledger_older_than_the_tally_fails_closed_and_a_fresh_one_does_not() -> None:
    """Calls that ran before the policy's tally was kept (a ledger state written without it,
    or a ledger used first by a gate without the tally): the total is not known."""
    ledger = Ledger()
    ledger.record(ToolCall("withdraw", {"amount": 9999}), "ok")
    state = ledger.state()
    state.pop("tallies")
    for old in (ledger, Ledger.from_state(state)):
        assert not run(gate_of(BANK), old, "withdraw", amount=1).allowed
    other = Ledger()
    other.record(ToolCall("note", {"text": "x"}), "ok")  # only calls the tally does not count ran
    assert run(gate_of(BANK), other, "withdraw", amount=1).allowed


def test_an_amount_that_is_no_number_is_denied_and_leaves_the_tally_unknown_in_shadow_mode() -> None:
    gate, ledger = gate_of(BANK), Ledger()
    assert run(gate, ledger, "withdraw", amount="lots").rule_ids == ("per-call", "per-session")
    shadow = Gate(gate.policy, SPECS, enforce=False)  # runs what it denies, as evaluation with the gate off
    run(shadow, ledger, "withdraw", amount={"a": 1})
    assert not run(gate, ledger, "withdraw", amount=1).allowed


def test_denied_calls_do_not_count() -> None:
    gate, ledger = gate_of(BANK), Ledger()
    for _ in range(5):
        assert run(gate, ledger, "withdraw", amount=50000).rule_ids == ("per-call", "per-session")
    assert moved(gate, ledger, [10000, 10000]) == 20000


# ------------------------------------------------------------------------ windows and keys

WINDOWED = """
default: allow
session:
  recent:
    tools: [withdraw]
    sum: double(args.amount)
    within: {calls: 3}
  daily:
    tools: [withdraw]
    within: {seconds: 86400}
  by_account:
    tools: [withdraw]
    sum: double(args.amount)
    per: args.account
    max_keys: 2
rules:
  - id: recent-cap
    effect: forbid
    tools: [withdraw]
    when: session.recent > 100.0
    reason: at most 100 within any 3 calls
  - id: daily-count
    effect: forbid
    tools: [withdraw]
    when: session.daily > 4
    reason: at most 4 withdrawals a day
  - id: account-cap
    effect: forbid
    tools: [withdraw]
    when: session.by_account[args.account] > 150.0
    reason: at most 150 from one account
"""


def test_a_window_in_calls_counts_the_last_calls_of_any_tool() -> None:
    gate, ledger = gate_of(WINDOWED), Ledger()
    ledger.now = lambda: 0.0
    assert run(gate, ledger, "withdraw", amount=60, account="a").allowed
    assert run(gate, ledger, "withdraw", amount=40, account="b").allowed
    assert not run(gate, ledger, "withdraw", amount=1, account="b").allowed  # 101 within 3 calls
    assert run(gate, ledger, "note", text="x").allowed  # the 60 leaves the window
    assert run(gate, ledger, "withdraw", amount=60, account="b").allowed  # 40 + 60
    assert len(ledger.tallies["recent"].amounts) <= 3


def test_a_window_in_seconds_forgets_only_after_the_window_and_never_early() -> None:
    gate, ledger = gate_of(WINDOWED), Ledger()
    clock = [1_000_000.0]
    ledger.now = lambda: clock[0]
    for _ in range(4):
        assert run(gate, ledger, "withdraw", amount=1, account="a").allowed
        clock[0] += 3600
    assert run(gate, ledger, "withdraw", amount=1, account="a").rule_ids == ("daily-count",)
    clock[0] = 1_000_000.0 + 86400 - 1  # the first withdrawal is still within the day
    assert not run(gate, ledger, "withdraw", amount=1, account="a").allowed
    restored = Ledger.from_state(json.loads(json.dumps(ledger.state())))
    restored.now = lambda: 1_000_000.0 + 86400 + 86400 / TIME_SLOTS + 1  # a day and a slot later
    assert run(gate, restored, "withdraw", amount=1, account="b").allowed
    assert len(restored.tallies["daily"].amounts) <= TIME_SLOTS + 1


def test_a_total_per_key_and_its_bound_on_keys() -> None:
    gate, ledger = gate_of(WINDOWED), Ledger()
    clock = [0.0]
    ledger.now = lambda: clock[0]
    for account in ("a", "b"):
        for _ in range(3):
            assert run(gate, ledger, "withdraw", amount=50, account=account).allowed
            run(gate, ledger, "note", text="make room in the window of 3 calls")
            run(gate, ledger, "note", text="x")
            clock[0] += 2 * 86400  # and in the day's
        assert run(gate, ledger, "withdraw", amount=1, account=account).rule_ids == ("account-cap",)
    third = run(gate, ledger, "withdraw", amount=1, account="c")  # a third key: over max_keys, so unknown
    assert third.effect == "deny" and "could not be evaluated" in third.reason
    assert not run(gate, ledger, "withdraw", amount=1, account="a").allowed  # and it stays closed


def test_the_state_stays_bounded_however_long_the_session() -> None:
    tallies_only = WINDOWED.split("rules:")[0].replace("max_keys: 2", "max_keys: 1024")
    gate, ledger = gate_of(tallies_only), Ledger()
    ledger.now = lambda: 5.0
    for k in range(3000):
        run(gate, ledger, "withdraw", amount=0, account=str(k % 500))
    sizes = {name: len(state.amounts) for name, state in ledger.tallies.items()}
    assert sizes["recent"] <= 3 and sizes["daily"] <= TIME_SLOTS + 1 and sizes["by_account"] == 500


# ------------------------------------------------------------------------- load checks


@pytest.mark.parametrize(
    ("session", "rule", "expected"),
    [
        ("", "session.withdrawn > 1.0", "rule 'r': when reads session.withdrawn, which session: does not declare"),
        ("{t: {tools: [withdraw]}}", "session.taken > 1", "session.taken, which session: does not declare (tallies: t)"),
        ("{t: {tools: [withdraw], within: {hours: 2}}}", "true", "session.t: within must be {calls: N} or {seconds: S}"),
        ("{t: {tools: [withdraw], within: {calls: 0}}}", "true", "session.t: within.calls 0 must be a whole number"),
        ("{t: {tools: [withdraw], within: {seconds: -1}}}", "true", "session.t: within.seconds -1 must be from 1"),
        ("{t: {tools: [withdraw], sum: 'state.x'}}", "true", "session.t: sum reads unknown variable(s) state"),
        ("{t: {tools: [withdraw], sum: 'double('}}", "true", "session.t: sum does not compile as CEL"),
        ("{t: {tools: [withdraw], when: ''}}", "true", "session.t: when is empty"),
        ("{t: {tools: [withdraw], sum: 3}}", "true", "session.t: sum must be a CEL expression string"),
        ("{t: {tools: [withdraw], colour: red}}", "true", "session.t: unknown key 'colour'"),
        ("{t: {sum: 'double(args.amount)'}}", "true", "session.t: missing 'tools'"),
        ("{t: {tools: [withdraw], max_keys: 5}}", "true", "session.t: max_keys needs per"),
        ("{t: {tools: [withdraw], per: args.account, max_keys: 5000}}", "true", "max_keys 5000 must be a whole number"),
        ("{1x: {tools: [withdraw]}}", "true", "session: '1x' must be a name"),
        ("[withdraw]", "true", "session must map tally names to their definitions"),
    ],
)
def test_a_tally_or_a_read_that_does_not_exist_is_a_load_error_naming_the_file_and_rule(
    session: str, rule: str, expected: str
) -> None:
    text = f"session: {session}\n" if session else ""
    text += f"rules:\n  - {{id: r, effect: forbid, tools: [withdraw], reason: x, when: {json.dumps(rule)}}}\n"
    with pytest.raises(PolicyError) as caught:
        Policy.from_yaml(text, source="bank.yaml")
    assert str(caught.value).startswith("bank.yaml:")
    assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_a_tally_reading_an_argument_or_tool_that_does_not_exist_is_refused_when_the_gate_is_built() -> None:
    policy = Policy.from_yaml("session: {t: {tools: [withdraw], sum: double(args.amonut)}}\n", "bank.yaml")
    with pytest.raises(PolicyError, match=r"(?s)bank.yaml:.*session.t: reads args.amonut, which withdraw does not have"):
        Gate(policy, SPECS)
    policy = Policy.from_yaml("session: {t: {tools: [withdraww]}}\n", "bank.yaml")
    with pytest.raises(PolicyError, match=r"session.t: names unknown tool 'withdraww'"):
        Gate(policy, SPECS)


def test_a_policy_with_tallies_hashes_them_and_one_without_keeps_its_hash() -> None:
    plain = Policy.from_yaml("default: allow\n")
    assert plain.hash == Policy.from_yaml("default: allow\nsession: {}\n").hash
    one = Policy.from_yaml("default: allow\nsession: {t: {tools: [withdraw]}}\n")
    other = Policy.from_yaml("default: allow\nsession: {t: {tools: [withdraw], within: {calls: 5}}}\n")
    assert len({plain.hash, one.hash, other.hash}) == 3


def test_a_changed_tally_definition_does_not_read_the_old_totals() -> None:
    gate, ledger = gate_of(BANK), Ledger()
    moved(gate, ledger, [9999, 9999])
    changed = gate_of(BANK.replace("sum: double(args.amount)", "sum: double(args.amount) * 2.0"))
    assert not run(changed, ledger, "withdraw", amount=1).allowed  # unknown, not zero


# ------------------------------------------------------------------ the shipped policies


@pytest.fixture(scope="module")
def bfcl_env() -> Any:
    from toolpolicy.envs.bfcl import BfclMultiTurnEnv

    return BfclMultiTurnEnv()


def bfcl_gate(env: Any) -> Gate:
    from toolpolicy.envs.bfcl.env import POLICY_FILE

    return Gate(Policy.load(POLICY_FILE), env.tools)


@pytest.mark.parametrize(
    ("tool", "arguments", "cap", "rule"),
    [
        ("withdraw_funds", {"amount": 9999}, 20000, "withdrawals-per-conversation"),
        ("withdraw_funds", {"amount": "5000.5"}, 20000, "withdrawals-per-conversation"),
        ("fund_account", {"amount": 49999}, 100000, "deposits-per-conversation"),
        ("place_order", {"order_type": "Buy", "symbol": "AAPL", "price": 999.0, "amount": 300}, 500000,
         "orders-per-conversation"),
    ],
)
def test_bfcl_caps_hold_per_conversation(bfcl_env: Any, tool: str, arguments: dict[str, Any], cap: float,
                                         rule: str) -> None:
    gate, ledger = bfcl_gate(bfcl_env), Ledger()
    value = float(arguments.get("price", 1)) * float(arguments["amount"])
    let_through = 0.0
    for _ in range(12):
        decision = gate.evaluate(ToolCall(tool, arguments), ledger)
        if decision.allowed:
            let_through += value
            ledger.record(ToolCall(tool, arguments), "ok")
        else:
            assert rule in decision.rule_ids, decision.rule_ids
    assert 0 < let_through <= cap


def test_the_hotel_counts_its_own_refunds_when_the_tools_facts_lag() -> None:
    """refund-cap reads the booking's `refunded` fact from the tools; if a refund ran and the
    fact did not move (it errored after writing), the session's own total still holds."""
    from toolpolicy.envs.hotel.env import POLICY_FILE
    from toolpolicy.envs.hotel.database import fresh_copy
    from toolpolicy.envs.hotel.tools import make_tools

    gate = Gate(Policy.load(POLICY_FILE), make_tools(fresh_copy(0)))
    booking = {"guest": "G1", "status": "confirmed", "hours": 200, "insured": False, "paid": 100, "refunded": 0,
               "first_hours": 200, "least_hours": 200, "reschedules": 0}
    ledger = Ledger({"verified_guest": "G1", "guest_bookings": ["B1"], "booking_B1": booking})
    for amount, allowed in ((60, True), (40, True), (1, False)):
        call = ToolCall("refund", {"booking": "B1", "amount": amount})
        decision = gate.evaluate(call, ledger)
        assert decision.allowed is allowed, (amount, decision.rule_ids)
        if allowed:
            ledger.record(call, "error")  # ran, and failed: the facts did not change
    assert decision.rule_ids == ("refunds-per-conversation",)


def test_a_proxy_restart_keeps_the_totals_and_a_lost_save_fails_closed(tmp_path: Any) -> None:
    """Behind `gate serve` the ledger is saved beside the audit log after each call and read
    back at start (proxy/ledger_file.py). Decisions the log holds after the save (a proxy
    killed before saving) keep no arguments, so their sums are unknown: closed, not zero."""
    from toolpolicy.gate import AuditLog
    from toolpolicy.proxy.ledger_file import restored_ledger, save_ledger

    log, saved = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.ledger.json"
    policy = Policy.from_yaml(textwrap.dedent(BANK), source="bank.yaml")

    def serve(ledger: Ledger, amounts: list[int], save: bool) -> list[bool]:
        with AuditLog(log, durable=False) as audit:
            gate = Gate(policy, SPECS, audit=audit)
            allowed = [run(gate, ledger, "withdraw", amount=a).allowed for a in amounts]
            if save:
                save_ledger(saved, ledger, audit)
        return allowed

    assert serve(Ledger(), [9999, 9999], save=True) == [True, True]
    with AuditLog(log, durable=False) as audit:
        back, note = restored_ledger(saved, audit)
    assert note is None and serve(back, [9999, 2], save=True) == [False, True]  # 19,998 carried over
    log, saved = tmp_path / "second.jsonl", tmp_path / "second.jsonl.ledger.json"
    assert serve(Ledger(), [5000], save=True) == [True]
    with AuditLog(log, durable=False) as audit:
        back, _ = restored_ledger(saved, audit)
    assert serve(back, [1], save=False) == [True]  # decided, then killed before the save
    with AuditLog(log, durable=False) as audit:
        caught_up, note = restored_ledger(saved, audit)
    assert note is not None and caught_up.counts == {"withdraw": 2}
    assert serve(caught_up, [1], save=False) == [False]  # 5,002 if the lost call was 1; the log cannot say


def test_the_workspace_caps_what_the_urls_of_an_episode_carry_out() -> None:
    from test_gate_workspace import workspace_gate

    gate, ledger = workspace_gate(), Ledger()
    url = "https://example.com/search?q=" + "a" * 2000  # under the 2,048 of one URL
    decisions = [run(gate, ledger, "http_get", url=url) for _ in range(5)]
    assert [d.allowed for d in decisions] == [True, True, True, True, False]
    assert decisions[-1].rule_ids == ("url-characters-per-episode",)
    short = Ledger()
    assert all(run(gate, short, "http_get", url=url).allowed for _ in range(4))
    assert run(gate, short, "http_get", url="https://example.com/").allowed  # 4 x 2,029 + 20 <= 8,192
