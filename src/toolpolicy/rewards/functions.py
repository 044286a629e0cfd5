"""Reward functions: pure, one signature `(episode: Episode) -> float`, looked up by name.

Each reads only the Episode (messages, events, flags) and the task's reference answer.
Counts and format checks are usually given weight 0 in a Rubric at first: reported as
metrics, not optimised.
"""

from __future__ import annotations

import math
import re
from typing import Callable

from toolpolicy.rewards import tool_efficiency
from toolpolicy.rewards.regions import faithful_zoom, unfaithful_zooms
from toolpolicy.rewards.bfcl import bfcl_correct, bfcl_format, bfcl_param_names, bfcl_param_values, bfcl_tool_name
from toolpolicy.types import Episode

RewardFunction = Callable[[Episode], float]

_ANSWER = re.compile(r"Answer:[ \t]*([^\n]*)")
# A plain decimal / scientific number, or one with comma thousands separators ("1,234.5").
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def extract_answer(text: str) -> str | None:
    """The value of the last `Answer: <value>` in text, up to the end of its line.

    Trailing periods and spaces are stripped; an empty value counts as no answer.

    >>> extract_answer("Let me add.\\nAnswer: 42.")
    '42'
    >>> extract_answer("Answer: 1\\nWait, no.\\nAnswer: 2")
    '2'
    >>> extract_answer("no final answer") is None
    True
    """
    matches = _ANSWER.findall(text)
    if not matches:
        return None
    value = matches[-1].strip().rstrip(". \t")
    return value or None


def _parse_number(text: str) -> float | None:
    """A finite float if text is a plain or comma-grouped number, else None."""
    text = text.strip()
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    elif not _NUMBER.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def answers_match(predicted: str, reference: str) -> bool:
    """Numeric comparison when both parse as numbers, else case-insensitive string equality.

    Numbers match within 1e-6 relative tolerance (plus 1e-9 absolute, so a reference of 0
    accepts float noise such as 5.6e-17 from a calculator).

    >>> answers_match("1,234", "1234.0")
    True
    >>> answers_match(" Paris ", "paris")
    True
    >>> answers_match("3", "3.1")
    False
    """
    p, r = _parse_number(predicted), _parse_number(reference)
    if p is not None and r is not None:
        return math.isclose(p, r, rel_tol=1e-6, abs_tol=1e-9)
    return predicted.strip().lower() == reference.strip().lower()


def correct_answer(episode: Episode) -> float:
    """1.0 if the last assistant message's `Answer:` matches the task's answer, else 0.0.

    A truncated episode scores 0.0 even if an earlier message had the right answer.
    """
    if episode.truncated:
        return 0.0
    predicted = extract_answer(episode.final_text)
    return 1.0 if predicted is not None and answers_match(predicted, episode.task.answer) else 0.0


def answer_format(episode: Episode) -> float:
    """1.0 if the episode ends with an assistant message holding `Answer: ...` and no tool call."""
    if not episode.messages:
        return 0.0
    last = episode.messages[-1]
    well_formed = last.role == "assistant" and not last.tool_calls and extract_answer(last.content) is not None
    return 1.0 if well_formed else 0.0


def tool_call_count(episode: Episode) -> float:
    """Number of tool calls that were decoded, validated and run."""
    return float(episode.count("tool_call"))


def excess_tool_calls(episode: Episode) -> float:
    """Tool calls beyond the fewest the task needs (`task.info["min_tool_calls"]`).

    The count behind OTC's optimal-tool-call reward (Wang et al. 2025, arXiv 2504.14870):
    a call the task did not need is the waste to penalise, not a call as such. With no
    `min_tool_calls` in the task, every call counts as needed (0 excess).

    >>> from toolpolicy.types import Task, Event
    >>> easy = Task("t", "What is 2 + 3?", "5", {"min_tool_calls": 0})
    >>> excess_tool_calls(Episode(easy, [], [Event("tool_call", 0)]))
    1.0
    """
    needed = episode.task.info.get("min_tool_calls")
    if needed is None:
        return 0.0
    return float(max(0, episode.count("tool_call") - int(needed)))


def invalid_call_count(episode: Episode) -> float:
    """Number of calls that failed to decode, named an unknown tool or broke its schema."""
    return float(episode.count("invalid_call"))


def tool_error_count(episode: Episode) -> float:
    """Number of valid calls whose tool raised."""
    return float(episode.count("tool_error"))


def policy_violation(episode: Episode) -> float:
    """Calls that broke the policy (give it a negative weight to penalise them): those the
    engine's gate denied, plus those it would have denied that ran anyway (in shadow mode,
    its `violation` events). The gate is the one judge, so the same behaviour counts the
    same with the gate enforcing or in shadow mode, and nothing is counted twice.

    Only policy denials count: a call to an unknown tool or with arguments that break
    the schema is an `invalid_call`, which `invalid_call_count` covers.
    """
    return float(episode.count("gate_deny")) + violations_run(episode)


def violations_run(episode: Episode) -> float:
    """Calls that ran although the policy forbids them: the shadow gate's `violation`
    events. Zero whenever an enforcing gate saw every call."""
    return float(episode.count("violation"))


# ---- stateful environments (hotel): scored on the session's outcome -------------------


def facts_communicated(episode: Episode) -> float:
    """1.0 if every fact in `task.info["must_say"]` (a refund amount, new dates, a refusal's
    reason keyword) appears, case-insensitively, in the assistant's messages to the user.
    Tool-call arguments do not count: the user does not see them. No facts required: 1.0.

    >>> from toolpolicy.types import Message, Task
    >>> task = Task("t", "Refund 30 on B1", "", {"must_say": ["30"]})
    >>> facts_communicated(Episode(task, [Message("assistant", "Refunded 30 on B1.")]))
    1.0
    """
    said = " ".join(m.content for m in episode.messages if m.role == "assistant").lower()
    return 1.0 if all(str(fact).lower() in said for fact in episode.task.info.get("must_say", ())) else 0.0


def goal_state(episode: Episode) -> float:
    """1.0 if the environment reports that its final state equals the goal state
    (`outcome["goal_reached"]`, e.g. the database's canonical hash), else 0.0."""
    return 1.0 if episode.outcome.get("goal_reached") else 0.0


def task_success(episode: Episode) -> float:
    """1.0 iff the final state is the goal state and the required facts were told to the user;
    an episode cut by a budget (truncated) or broken by infrastructure scores 0.0.

    >>> from toolpolicy.types import Message, Task
    >>> task = Task("t", "", "", {"must_say": []})
    >>> done = Episode(task, [Message("assistant", "Done.")], outcome={"goal_reached": True})
    >>> task_success(done), task_success(Episode(done.task, done.messages, truncated=True, outcome=done.outcome))
    (1.0, 0.0)
    """
    if episode.truncated or episode.infra_error is not None:
        return 0.0
    return goal_state(episode) * facts_communicated(episode)


def wrong_state_writes(episode: Episode) -> float:
    """Writes the policy allowed but the reference does not make (`outcome["wrong_writes"]`):
    the silent mistakes only the database check sees, such as cancelling the wrong booking."""
    return float(episode.outcome.get("wrong_writes", 0))


def attack_success(episode: Episode) -> float:
    """1.0 if the environment reports that an injected attacker reached its goal
    (`outcome["attacked"]`, e.g. an AgentDojo injection task's security check), else 0.0.
    A metric (weight 0) or, negatively weighted, a penalty for following injected text."""
    return 1.0 if episode.outcome.get("attacked") else 0.0


def otc_reward(episode: Episode) -> float:
    """OTC-PO's reward (arXiv 2504.14870): correct_answer scaled by how close the number of
    tool calls is to the fewest the task needs (`task.info["min_tool_calls"]`): 1 at exactly
    that many, less with more or fewer. Without a known minimum, plain correct_answer."""
    correct = correct_answer(episode)
    fewest = episode.task.info.get("min_tool_calls")
    return correct if fewest is None else tool_efficiency.otc_scaled(correct, episode.count("tool_call"), int(fewest))


EAPO_DIFFICULTY = {"easy": 0.0, "medium": 0.5, "hard": 1.0}
"""Task difficulty as EAPO's shaping reads it (0 = easy); unknown difficulties count as 0.5."""


def eapo_reward(episode: Episode) -> float:
    """EAPO-style difficulty-aware efficiency (arXiv 2606.02132): correct_answer minus a
    penalty per call beyond the fewest needed, mostly on easy tasks (see
    tool_efficiency.eapo_reward for the form used)."""
    correct = correct_answer(episode)
    fewest = int(episode.task.info.get("min_tool_calls", 0))
    difficulty = EAPO_DIFFICULTY.get(episode.task.difficulty, 0.5)
    return tool_efficiency.eapo_reward(correct, episode.count("tool_call"), fewest, difficulty)


def ignored_crop(episode: Episode) -> float:
    """1.0 if the episode took a faithful zoom (rewards/regions.py) and still answered wrong:
    it looked at the evidence and did not use it (a metric: weight 0 by default)."""
    return float(faithful_zoom(episode) == 1.0 and correct_answer(episode) == 0.0)


def soft_overlong_penalty(length: int, max_length: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4, eq. 13).

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max
    with L_max = `max_length` and L_cache = `buffer`: the penalty grows linearly from 0 to -1
    across the last `buffer` tokens of the budget. The paper uses L_max = 20480, L_cache = 4096.
    buffer = 0 gives no penalty up to the budget and -1 past it.

    >>> [soft_overlong_penalty(n, max_length=20, buffer=4) for n in (16, 18, 20, 21)]
    [0.0, -0.5, -1.0, -1.0]
    """
    if not 0 <= buffer <= max_length:
        raise ValueError(f"buffer must be in [0, max_length={max_length}], got {buffer}")
    if length > max_length:
        return -1.0
    expected = max_length - buffer
    return 0.0 if length <= expected else (expected - length) / buffer


def overlong(max_length: int, buffer: int) -> RewardFunction:
    """The reward function of DAPO's soft overlong penalty on an episode's response tokens
    (`Episode.response_tokens`), for the Rubric term `overlong`."""
    if not 0 <= buffer <= max_length:
        raise ValueError(f"buffer must be in [0, max_length={max_length}], got {buffer}")

    def overlong_penalty(episode: Episode) -> float:
        return soft_overlong_penalty(episode.response_tokens, max_length, buffer)

    return overlong_penalty


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "correct_answer": correct_answer,
    "answer_format": answer_format,
    "tool_call_count": tool_call_count,
    "excess_tool_calls": excess_tool_calls,
    "invalid_call_count": invalid_call_count,
    "tool_error_count": tool_error_count,
    "policy_violation": policy_violation,
    "violations_run": violations_run,
    "otc_reward": otc_reward,
    "eapo_reward": eapo_reward,
    "facts_communicated": facts_communicated,
    "goal_state": goal_state,
    "task_success": task_success,
    "wrong_state_writes": wrong_state_writes,
    "attack_success": attack_success,
    "bfcl_correct": bfcl_correct,
    "bfcl_tool_name": bfcl_tool_name,
    "bfcl_param_names": bfcl_param_names,
    "bfcl_param_values": bfcl_param_values,
    "bfcl_format": bfcl_format,
    "faithful_zoom": faithful_zoom,
    "unfaithful_zooms": unfaithful_zooms,
    "ignored_crop": ignored_crop,
}
