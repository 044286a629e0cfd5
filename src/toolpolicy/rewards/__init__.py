"""Pure reward functions `(episode: Episode) -> float` and the Rubric that weights them."""

from toolpolicy.rewards.functions import (
    REWARD_FUNCTIONS,
    RewardFunction,
    answer_format,
    answers_match,
    correct_answer,
    excess_tool_calls,
    extract_answer,
    gate_deny_count,
    invalid_call_count,
    tool_call_count,
    tool_error_count,
)
from toolpolicy.rewards.rubric import Rubric, RubricTerm, Score

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunction",
    "Rubric",
    "RubricTerm",
    "Score",
    "answer_format",
    "answers_match",
    "correct_answer",
    "excess_tool_calls",
    "extract_answer",
    "gate_deny_count",
    "invalid_call_count",
    "tool_call_count",
    "tool_error_count",
]
