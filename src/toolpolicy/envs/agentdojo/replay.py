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
`replay_suite_scoped` replays the same episodes through the policy alone and through it
narrowed by each task's scope (gate/scope.py), derived from the request before any call.
Injection tasks whose ground truth has no calls (some of workspace's, which only a
model's answer can carry out) cannot be replayed and are listed apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
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
from toolpolicy.gate.scope import Scope, scoped_gate
from toolpolicy.types import ToolCall, ToolSpec

Scoper = Callable[[str, Sequence[ToolSpec]], Scope]
"""(a user task's request, the suite's tools) -> the task's scope: `ScopeRules.derive`, or a
planner through `scope_from_planner`."""
InjectedCalls = Callable[[dict[str, Any]], list[ToolCall]]
"""(the episode's opening facts) -> the calls an attacker's goal makes in that episode."""

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
    scope: Scope | None = None,
    injected: InjectedCalls | None = None,
) -> EpisodeReplay:
    """Replay `user_task` (then `injection_task`, if given) through `gate` on a fresh environment.

    scope: the task's scope, derived from its request before any call: the replay runs
        through `gate` narrowed by it (gate/scope.py), as a deployment that scopes each task does.
    injected: calls to replay after the user's in place of the injection task's ground
        truth (an attacker's own goal, made from the episode's facts)."""
    suite = load_suite(suite_name, version)
    environment = starting_environment(suite, attack, user_task, injection_task)
    pre_environment = environment.model_copy(deep=True)
    live = LiveEnvironment(suite, environment, [])
    facts = opening_facts(suite_name, user_task.PROMPT, pre_environment)
    if scope is not None:
        gate = scoped_episode_gate(gate, tool_specs(suite), scope)
    ledger = Ledger(facts=facts)
    denials = gated_calls(gate, ledger, live, ground_truth(user_task, pre_environment), user_task.ID, "")
    attacked, attack_denied = None, False
    if injected is not None:
        hijacked = gated_calls(gate, ledger, live, injected(facts), user_task.ID, "injected")
        attack_denied = bool(hijacked)
        denials += hijacked
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


def scoped_episode_gate(gate: Gate, specs: Sequence[ToolSpec], scope: Scope) -> Gate:
    """`gate`'s policy narrowed by one task's `scope`, with `gate`'s approver, audit log and mode."""
    return scoped_gate(gate.policy, specs, scope, approver=gate.approver, audit=gate.audit, enforce=gate.enforce)


@dataclass
class ScopedReplay:
    """A suite's figures with the static policy alone and with each task's scope on top (shares in [0, 1])."""

    suite: str
    user_tasks: int
    pairs: int
    utility_kept_static: float
    """User tasks with no ground-truth call denied, static policy alone."""
    utility_kept_scoped: float
    """The same with the task's scope: the scope's false denials are the difference."""
    utility_on_scoped: float
    """User tasks whose utility check passes, scope on."""
    benign_calls: int
    false_denials_static: list[Denial]
    false_denials_scoped: list[Denial]
    attack_success_static: float
    attack_success_scoped: float
    injections_admitted_static: float
    """Pairs in which every call of the injection task's ground truth was allowed."""
    injections_admitted_scoped: float
    unnarrowed_tasks: list[str]
    """User tasks whose scope narrows nothing (every tool, no bound): a request that hands
    its task to a document, or a planner that asked for everything."""
    scopes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay_suite_scoped(suite_name: str, policy: Policy, scoper: Scoper, version: str = BENCHMARK_VERSION) -> ScopedReplay:
    """Every user task and (user task, injection task) pair of the suite, through the static
    policy alone and through it narrowed by each task's scope (enforced, no approver)."""
    suite = load_suite(suite_name, version)
    _, on, _ = suite_gates(suite_name, policy, version)
    specs = tool_specs(suite)
    users = list(suite.user_tasks.values())
    clean = suite.load_and_inject_default_environment({})
    injections = [t for t in suite.injection_tasks.values() if ground_truth(t, clean)]
    scopes = {u.ID: scoper(u.PROMPT, specs) for u in users}  # each task's scope, derived once
    plain_static = [replay_episode(suite_name, on, u, None, version=version) for u in users]
    plain_scoped = [replay_episode(suite_name, on, u, None, version=version, scope=scopes[u.ID]) for u in users]
    pairs = [(u, i) for u in users for i in injections]
    attacked_static = [replay_episode(suite_name, on, u, i, version=version) for u, i in pairs]
    attacked_scoped = [replay_episode(suite_name, on, u, i, version=version, scope=scopes[u.ID]) for u, i in pairs]
    every_tool = frozenset(spec.name for spec in specs)
    return ScopedReplay(
        suite=suite_name,
        user_tasks=len(users),
        pairs=len(pairs),
        utility_kept_static=share(not r.denials for r in plain_static),
        utility_kept_scoped=share(not r.denials for r in plain_scoped),
        utility_on_scoped=share(r.utility for r in plain_scoped),
        benign_calls=sum(len(ground_truth(u, clean)) for u in users),
        false_denials_static=[d for r in plain_static for d in r.denials],
        false_denials_scoped=[d for r in plain_scoped for d in r.denials],
        attack_success_static=share(bool(r.attacked) for r in attacked_static),
        attack_success_scoped=share(bool(r.attacked) for r in attacked_scoped),
        injections_admitted_static=share(not r.attack_denied for r in attacked_static),
        injections_admitted_scoped=share(not r.attack_denied for r in attacked_scoped),
        unnarrowed_tasks=[u.ID for u in users if scopes[u.ID].tools == every_tool and not scopes[u.ID].bounds and not scopes[u.ID].values],
        scopes={u.ID: scopes[u.ID].to_data() for u in users},
    )


def share(flags: Any) -> float:
    """The share of true values among `flags` (0.0 for none)."""
    values = list(flags)
    return sum(map(bool, values)) / len(values) if values else 0.0
