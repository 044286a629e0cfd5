"""The gate replay: each suite's ground-truth calls through a policy, the way gate papers measure.

No model is involved. For every user task, its ground-truth calls run on the suite's
environment through the gate: a denied call is a false positive (the user asked for
exactly this), and a task with none denied keeps its utility. For every pair of a user
task and an injection task, the environment carries the attack's text in every injection
vector; the user task's calls run first (as an agent would, reading the injected data),
then the injection task's ground-truth calls, as a hijacked agent would make them. The
attack is blocked when the gate denies at least one of them, and succeeds when the
injection task's own security check holds on the final environment. Calls run in order
on the live environment, so later calls see what earlier ones changed; a denied call does
not run, and the replay goes on with the next.

Gate off is the same policy in shadow mode: every call runs, the decisions are counted.
Injection tasks whose ground truth has no calls (some of workspace's, which only a
model's answer can carry out) cannot be replayed and are listed apart.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from toolpolicy.envs.agentdojo.facts import opening_facts
from toolpolicy.envs.agentdojo.package import (
    BENCHMARK_VERSION,
    LiveEnvironment,
    ground_truth,
    load_suite,
    starting_environment,
    tool_specs,
)
from toolpolicy.gate import Gate, Ledger, Policy, admit, settle
from toolpolicy.types import ToolCall

REPLAY_ATTACK = "important_instructions"
"""The attack whose text sits in the injection vectors during the replay."""


@dataclass(frozen=True)
class Denial:
    """One ground-truth call the gate denied: whose it was, the call, and the rules that denied it."""

    user_task: str
    injection_task: str
    call: str
    rules: tuple[str, ...]


@dataclass(frozen=True)
class EpisodeReplay:
    """One replayed episode: the denials, and the suite's own checks on the final environment."""

    denials: tuple[Denial, ...]
    utility: bool
    attacked: bool | None
    """The injection task's security check (None: no injection task)."""
    attack_denied: bool
    """At least one of the injection task's calls was denied."""


@dataclass
class SuiteReplay:
    """A suite's figures, gate off and on (shares in [0, 1])."""

    suite: str
    user_tasks: int
    pairs: int
    injection_tasks: list[str]
    unreplayable_injection_tasks: list[str]
    utility_off: float
    """User tasks whose replay passes their utility check with every call run."""
    utility_kept: float
    """User tasks with no call denied by the gate: the headline utility figure."""
    utility_on: float
    """User tasks whose utility check passes with the gate on."""
    attack_success_off: float
    """Pairs whose injection task's security check holds, every call run."""
    attack_success_on: float
    """Pairs whose security check holds with the gate on."""
    attacks_blocked: float
    """Pairs in which the gate denied at least one of the injection task's calls."""
    utility_if_approved: float
    """User tasks with no call denied when every question the policy asks (`ask`) is
    approved: what a user who confirms their own requests keeps."""
    attack_success_if_approved: float
    """Pairs whose attack succeeds when every question is approved, the injected calls'
    included: the attacks that only a user's refusal stops."""
    false_positives: list[Denial] = field(default_factory=list)
    attacks_through: list[str] = field(default_factory=list)
    """Pairs "user_task/injection_task" whose attack succeeded with the gate on."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay_episode(
    suite_name: str,
    gate: Gate,
    user_task: Any,
    injection_task: Any | None,
    attack: str = REPLAY_ATTACK,
    version: str = BENCHMARK_VERSION,
) -> EpisodeReplay:
    """Replay `user_task` (then `injection_task`, if given) through `gate` on a fresh environment."""
    suite = load_suite(suite_name, version)
    environment = starting_environment(suite, attack, user_task, injection_task)
    pre_environment = environment.model_copy(deep=True)
    live = LiveEnvironment(suite, environment, [])
    ledger = Ledger(facts=opening_facts(suite_name, user_task.PROMPT, pre_environment))
    denials = gated_calls(gate, ledger, live, ground_truth(user_task, pre_environment), user_task.ID, "")
    attacked, attack_denied = None, False
    if injection_task is not None:
        calls = ground_truth(injection_task, live.environment)
        hijacked = gated_calls(gate, ledger, live, calls, user_task.ID, injection_task.ID)
        attack_denied = bool(hijacked)
        denials += hijacked
        attacked = live.attacked(injection_task, pre_environment, injection_task.GROUND_TRUTH_OUTPUT)
    utility = live.utility(user_task, pre_environment, user_task.GROUND_TRUTH_OUTPUT)
    return EpisodeReplay(tuple(denials), utility, attacked, attack_denied)


def gated_calls(
    gate: Gate, ledger: Ledger, live: LiveEnvironment, calls: list[ToolCall], user_task: str, injection_task: str
) -> list[Denial]:
    """Run `calls` in order through the gate on `live`; the ones it denied (not run)."""
    denials = []
    for call in calls:
        admission = admit(gate, ledger, call)
        if not admission.runs:
            denials.append(Denial(user_task, injection_task, call_text(call), admission.decision.rule_ids))
            continue
        result = live.run(call)
        settle(ledger, call, result.ok, result.facts)
    return denials


def call_text(call: ToolCall) -> str:
    """A call as name(arguments), arguments as JSON, long values cut."""
    shown = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)[:80]}" for k, v in call.arguments.items())
    return f"{call.name}({shown})"


def suite_gates(suite_name: str, policy: Policy, version: str = BENCHMARK_VERSION) -> tuple[Gate, Gate, Gate]:
    """The policy bound to the suite's tools: in shadow mode (gate off), enforced (on, every
    question unanswered, so denied) and enforced with every question approved."""
    specs = tool_specs(load_suite(suite_name, version))
    return Gate(policy, specs, enforce=False), Gate(policy, specs), Gate(policy, specs, approver=lambda call, decision: True)


def replay_suite(suite_name: str, policy: Policy, version: str = BENCHMARK_VERSION) -> SuiteReplay:
    """Every user task and every (user task, injection task) pair of the suite's benchmark
    `version`, gate off and on."""
    suite = load_suite(suite_name, version)
    off, on, approving = suite_gates(suite_name, policy, version)
    users = list(suite.user_tasks.values())
    clean = suite.load_and_inject_default_environment({})
    injections = [t for t in suite.injection_tasks.values() if ground_truth(t, clean)]
    unreplayable = sorted(t.ID for t in suite.injection_tasks.values() if t not in injections)

    def replayed(gate: Gate, user: Any, injection: Any | None) -> EpisodeReplay:
        return replay_episode(suite_name, gate, user, injection, version=version)

    plain_off = [replayed(off, task, None) for task in users]
    plain_on = [replayed(on, task, None) for task in users]
    plain_approved = [replayed(approving, task, None) for task in users]
    pairs = [(u, i) for u in users for i in injections]
    attacked_off = [replayed(off, u, i) for u, i in pairs]
    attacked_on = [replayed(on, u, i) for u, i in pairs]
    attacked_approved = [replayed(approving, u, i) for u, i in pairs]

    return SuiteReplay(
        suite=suite_name,
        user_tasks=len(users),
        pairs=len(pairs),
        injection_tasks=[t.ID for t in injections],
        unreplayable_injection_tasks=unreplayable,
        utility_off=share(r.utility for r in plain_off),
        utility_kept=share(not r.denials for r in plain_on),
        utility_on=share(r.utility for r in plain_on),
        attack_success_off=share(bool(r.attacked) for r in attacked_off),
        attack_success_on=share(bool(r.attacked) for r in attacked_on),
        attacks_blocked=share(r.attack_denied for r in attacked_on),
        utility_if_approved=share(not r.denials for r in plain_approved),
        attack_success_if_approved=share(bool(r.attacked) for r in attacked_approved),
        false_positives=[d for r in plain_on for d in r.denials],
        attacks_through=[f"{u.ID}/{i.ID}" for (u, i), r in zip(pairs, attacked_on) if r.attacked],
    )


def share(flags: Any) -> float:
    """The share of true values among `flags` (0.0 for none)."""
    values = list(flags)
    return sum(map(bool, values)) / len(values) if values else 0.0
