"""The AgentDojo gate replay of the shipped policies equals the published figures.

Replays banking and slack (the fast suites: their environments parse in tens of
milliseconds) with their policies in examples/policies/agentdojo/ and compares every
figure, false positive and attack that got through with docs/results/agentdojo/gate.json,
which bench/agentdojo_gate.py writes for all four suites. A policy edit that changes a
decision fails here until the bench is re-run and the docs say what changed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("agentdojo")

from toolpolicy.envs.agentdojo.package import load_suite  # noqa: E402
from toolpolicy.envs.agentdojo.replay import replay_episode, replay_suite, suite_gates  # noqa: E402
from toolpolicy.gate import Policy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = json.loads((ROOT / "docs" / "results" / "agentdojo" / "gate.json").read_text())["suites"]


def policy(suite: str) -> Policy:
    return Policy.load(ROOT / "examples" / "policies" / "agentdojo" / f"{suite}.yaml")


@pytest.mark.parametrize("suite", ["banking", "slack"])
def test_replay_matches_published_figures(suite: str) -> None:
    replay = replay_suite(suite, policy(suite)).to_dict()
    published = {k: v for k, v in PUBLISHED[suite].items() if k != "seconds"}
    assert json.loads(json.dumps(replay)) == published
    assert replay["utility_off"] == 1.0  # the ground truth solves every task: the replay runs the real suite


def test_attack_runs_without_the_policy_and_is_denied_with_it() -> None:
    """The banking attack that empties the account reaches its goal with the gate off and not on."""
    suite = load_suite("banking")
    off, on, _ = suite_gates("banking", policy("banking"))
    user, attack = suite.user_tasks["user_task_1"], suite.injection_tasks["injection_task_5"]
    ungated, gated = replay_episode("banking", off, user, attack), replay_episode("banking", on, user, attack)
    assert ungated.attacked is True and not ungated.attack_denied
    assert gated.attacked is False and gated.attack_denied
    assert {rule for d in gated.denials for rule in d.rules} == {"confirm-new-payee"}


def test_a_question_is_the_users_to_answer() -> None:
    """Banking asks before paying a payee read only from a document: a user who approves
    keeps user_task_0 (the bill's account), and an injected payee then goes through too."""
    suite = load_suite("banking")
    _, on, approving = suite_gates("banking", policy("banking"))
    bill = suite.user_tasks["user_task_0"]
    assert [d.rules for d in replay_episode("banking", on, bill, None).denials] == [("confirm-new-payee",)]
    assert replay_episode("banking", approving, bill, None).denials == ()
    user, attack = suite.user_tasks["user_task_1"], suite.injection_tasks["injection_task_5"]
    assert replay_episode("banking", approving, user, attack).attacked is True
