"""Gate layer: policy files, rule evaluation, decisions, the episode ledger, the audit log.

policy = Policy.load("examples/policies/workspace.yaml")
gate = Gate(policy, toolset, audit=AuditLog("run/audit.jsonl"))
ledger = Ledger()                      # one per episode
decision = gate.decide(call, ledger)   # allow or deny, logged once
if decision.allowed:
    result = toolset.call(call); ledger.record(call, "ok" if result.ok else "error")
    text = gate.redact(result.content)
else:
    ledger.record(call, "denied"); text = decision.observation()
"""

from toolpolicy.gate.audit import AuditError, AuditLog, VerifyResult, generate_keypair, verify
from toolpolicy.gate.decide import Approver, Decision, Gate
from toolpolicy.gate.ledger import Ledger
from toolpolicy.gate.policy import Policy, PolicyError, Rule

__all__ = [
    "Approver",
    "AuditError",
    "AuditLog",
    "Decision",
    "Gate",
    "Ledger",
    "Policy",
    "PolicyError",
    "Rule",
    "VerifyResult",
    "generate_keypair",
    "verify",
]
