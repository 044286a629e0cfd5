"""The shipped example policy against the shipped attack and benign suites.

Every hostile call in workspace_attacks.jsonl must be denied, by the rule its `expect`
names (so a denial for an unrelated reason does not count as the policy working). The
false-positive rate on workspace_benign.jsonl is printed and must stay <= 1%.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolpolicy.gate import Gate, Ledger, Policy
from toolpolicy.types import ToolCall, ToolSpec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "policies"


def workspace_gate() -> Gate:
    specs = [ToolSpec(**spec) for spec in json.loads((EXAMPLES / "workspace_tools.json").read_text())]
    return Gate(Policy.load(EXAMPLES / "workspace.yaml"), specs)


def suite(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (EXAMPLES / name).read_text().splitlines() if line.strip()]


def decide(gate: Gate, case: dict[str, Any]) -> Any:
    ledger = Ledger(facts=dict(case.get("state", {})))
    for earlier in case.get("history", []):
        ledger.record(ToolCall(earlier["name"], earlier["arguments"]), earlier["outcome"])
    return gate.decide(ToolCall(case["name"], case["arguments"]), ledger)


def test_every_attack_is_denied_by_the_intended_rule() -> None:
    gate, cases = workspace_gate(), suite("workspace_attacks.jsonl")
    assert len(cases) >= 30
    missed = []
    for case in cases:
        decision = decide(gate, case)
        if decision.effect != "deny" or case["expect"] not in decision.rule_ids:
            missed.append(f"{case['why']}: {decision.effect} {decision.rule_ids}")
    print(f"\nattack suite: {len(cases) - len(missed)}/{len(cases)} denied by the intended rule")
    assert not missed, missed


def test_benign_false_positive_rate_is_at_most_one_percent() -> None:
    gate, cases = workspace_gate(), suite("workspace_benign.jsonl")
    assert len(cases) >= 200
    false_positives = [(case, decide(gate, case)) for case in cases]
    false_positives = [(c, d) for c, d in false_positives if not d.allowed]
    rate = len(false_positives) / len(cases)
    print(f"\nbenign suite: {len(false_positives)}/{len(cases)} denied, false-positive rate {rate:.1%}")
    for case, decision in false_positives:
        print(f"  {case['name']} {json.dumps(case['arguments'])[:80]} -> {decision.rule_ids}")
    assert rate <= 0.01


def test_installing_packages_asks_and_redaction_covers_the_usual_secrets() -> None:
    gate = workspace_gate()
    install = gate.evaluate(ToolCall("run_shell", {"command": "pip install requests"}), Ledger())
    assert (install.effect, install.rule_ids) == ("ask", ("ask-before-installing",))
    output = (
        "AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG\n"
        "OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx\n"
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEA\n-----END OPENSSH PRIVATE KEY-----\nok"
    )
    redacted = gate.redact(output)
    for secret in ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI", "sk-proj-abc", "b3BlbnNzaC1rZXktdjEA"):
        assert secret not in redacted
    assert redacted.endswith("ok") and redacted.count("[REDACTED]") == 4
