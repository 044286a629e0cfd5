"""Gate layer: policy files, rule evaluation, decisions, the episode ledger, the audit log.

policy = Policy.load("examples/policies/workspace.yaml")
gate = Gate(policy, toolset, audit=AuditLog("run/audit.jsonl"),
            work_folder="/srv/agent-42")   # where the policy's work_folder (/workspace) is on this machine
ledger = Ledger()                      # one per episode
admission = admit(gate, ledger, call)  # allow or deny, logged once
if admission.runs:
    result = toolset.call(call); settle(ledger, call, result.ok, result.facts)
    text = gate.redact(result.content)
else:
    text = admission.decision.observation()
"""

from toolpolicy.gate.audit import AuditError, AuditLog, VerifyResult, generate_keypair, rewind_audit_log, verify
from toolpolicy.gate.decide import Approver, Decision, Gate, Outcome
from toolpolicy.gate.gated import MALFORMED, Admission, admit, conclude, release, settle
from toolpolicy.gate.ledger import Ledger
from toolpolicy.gate.policy import Policy, PolicyError, PolicyWarning, Rule
from toolpolicy.gate.values import mentions, reveals

__all__ = [
    "MALFORMED",
    "Admission",
    "Approver",
    "AuditError",
    "AuditLog",
    "Decision",
    "Outcome",
    "Gate",
    "Ledger",
    "Policy",
    "PolicyError",
    "PolicyWarning",
    "Rule",
    "VerifyResult",
    "admit",
    "conclude",
    "generate_keypair",
    "mentions",
    "release",
    "reveals",
    "rewind_audit_log",
    "settle",
    "verify",
]
