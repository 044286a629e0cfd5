"""Reward functions: pure, one signature `(episode: Episode) -> float`, looked up by name.

Each reads only the Episode (messages, events, flags) and the task's reference answer.
Counts and format checks are usually given weight 0 in a Rubric at first: reported as
metrics, not optimised.
"""

from __future__ import annotations

import math
import re
from typing import Callable

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


def gate_deny_count(episode: Episode) -> float:
    """Number of calls the gate denied."""
    return float(episode.count("gate_deny"))


REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "correct_answer": correct_answer,
    "answer_format": answer_format,
    "tool_call_count": tool_call_count,
    "excess_tool_calls": excess_tool_calls,
    "invalid_call_count": invalid_call_count,
    "tool_error_count": tool_error_count,
    "gate_deny_count": gate_deny_count,
}
