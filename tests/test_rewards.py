"""Reward functions and the Rubric, on hand-written Episodes."""

import doctest

import pytest

import toolpolicy.rewards.functions
import toolpolicy.rewards.rubric
from toolpolicy.rewards import (
    REWARD_FUNCTIONS,
    Rubric,
    Score,
    answer_format,
    answers_match,
    correct_answer,
    extract_answer,
    invalid_call_count,
    tool_call_count,
)
from toolpolicy.types import Episode, Event, Message, Task, ToolCall

TASK = Task("t1", "What is 1200 + 34?", "1234", {"difficulty": "easy"})
CALL = ToolCall("calculator", {"expression": "1200 + 34"})


def episode(*messages: Message, events=(), truncated=False) -> Episode:
    return Episode(TASK, [Message("user", TASK.prompt), *messages], list(events), truncated)


SOLVED = episode(
    Message("assistant", "Let me compute.", (CALL,)),
    Message("tool", "1234", name="calculator"),
    Message("assistant", "The sum is 1,234.\nAnswer: 1,234."),
    events=[Event("invalid_call", 1, "bad_json"), Event("tool_call", 1), Event("tool_call", 2)],
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: 42", "42"),
        ("Answer: 42.", "42"),  # trailing period stripped
        ("Answer:   3.5 .  ", "3.5"),  # trailing spaces and period stripped
        ("Answer: 7\nThat's it.", "7"),  # value ends at the line end
        ("Answer: 1\nHmm, no.\nAnswer: 2", "2"),  # last occurrence wins
        ("Final Answer: Paris", "Paris"),
        ("Answer:", None),  # empty value
        ("Answer: .", None),
        ("the answer is 4", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("predicted", "reference", "expected"),
    [
        ("1,234", "1234", True),  # thousands separators
        ("1234.0000001", "1234", True),  # relative error 8e-11 < 1e-6
        ("1235", "1234", False),  # relative error 8e-4
        ("-0.5", "-.5", True),
        ("1e3", "1000", True),
        ("5.551115123125783e-17", "0", True),  # float noise within the 1e-9 absolute floor
        ("1,2", "12", False),  # not a thousands grouping: compared as strings
        (" Paris ", "paris", True),
        ("nan", "nan", True),  # non-finite is not a number here: string equality
        ("Lyon", "Paris", False),
    ],
)
def test_answers_match(predicted, reference, expected):
    assert answers_match(predicted, reference) is expected


def test_correct_answer():
    assert correct_answer(SOLVED) == 1.0
    assert correct_answer(episode(Message("assistant", "Answer: 1243"))) == 0.0
    assert correct_answer(episode(Message("assistant", "1234"))) == 0.0  # no Answer: line
    assert correct_answer(episode()) == 0.0  # the model never spoke
    assert correct_answer(episode(Message("assistant", "Answer: 1234"), truncated=True)) == 0.0


def test_answer_format():
    assert answer_format(SOLVED) == 1.0
    # The answer rides along with a tool call: not a final message.
    assert answer_format(episode(Message("assistant", "Answer: 1234", (CALL,)))) == 0.0
    # Ended on a tool result, although an earlier assistant message had an answer.
    assert answer_format(episode(Message("assistant", "Answer: 5", (CALL,)), Message("tool", "5"))) == 0.0
    assert answer_format(episode(Message("assistant", "It is 1234."))) == 0.0
    # Well-formed but wrong still has the format.
    assert answer_format(episode(Message("assistant", "Answer: 9"))) == 1.0


def test_event_counts():
    assert tool_call_count(SOLVED) == 2.0
    assert invalid_call_count(SOLVED) == 1.0
    assert tool_call_count(episode()) == 0.0
    assert all(isinstance(fn(SOLVED), float) for fn in REWARD_FUNCTIONS.values())


def test_rubric_total_is_weighted_sum_and_weight_zero_is_metric_only():
    rubric = Rubric.from_weights(
        {"correct_answer": 1.0, "tool_call_count": -0.1, "invalid_call_count": -0.5, "answer_format": 0.0}
    )
    score = rubric.score(SOLVED)
    # 1.0 * 1 + (-0.1) * 2 + (-0.5) * 1 = 0.3; answer_format reported, not summed.
    assert score.total == pytest.approx(0.3)
    assert score.components == {
        "correct_answer": 1.0,
        "tool_call_count": 2.0,
        "invalid_call_count": 1.0,
        "answer_format": 1.0,
    }
    assert list(score.components) == [t.name for t in rubric.terms]  # order kept
    with pytest.raises(AttributeError):
        score.total = 0.0  # type: ignore[misc]  # Score is frozen


def test_rubric_on_failed_episode():
    rubric = Rubric.from_weights({"correct_answer": 1.0, "answer_format": 0.2})
    assert rubric.score(episode(Message("assistant", "no idea"))) == Score(
        0.0, {"correct_answer": 0.0, "answer_format": 0.0}
    )


def test_rubric_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="correct_answer") as err:
        Rubric.from_weights({"correct_answer": 1.0, "politeness": 0.5})
    assert "politeness" in str(err.value)


@pytest.mark.parametrize("module", [toolpolicy.rewards.functions, toolpolicy.rewards.rubric])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_excess_tool_calls_counts_calls_beyond_the_fewest_needed():
    from toolpolicy.rewards import excess_tool_calls

    two_calls = [Event("tool_call", 0), Event("tool_call", 1), Event("invalid_call", 1)]
    easy = Task("e", "What is 2 + 3?", "5", {"min_tool_calls": 0})
    hard = Task("h", "What is 123 * 45?", "5535", {"min_tool_calls": 1})
    unknown = Task("u", "?", "1", {})
    assert excess_tool_calls(Episode(easy, [], two_calls)) == 2.0  # both calls needless; invalid ones are not calls
    assert excess_tool_calls(Episode(hard, [], two_calls)) == 1.0  # one needed, one extra
    assert excess_tool_calls(Episode(hard, [], [])) == 0.0  # too few is not excess
    assert excess_tool_calls(Episode(unknown, [], two_calls)) == 0.0  # no count given: every call needed


def test_otc_and_eapo_rewards_read_the_episode():
    from toolpolicy.rewards import eapo_reward, otc_reward
    from toolpolicy.types import Episode, Event, Message, Task

    def episode(difficulty: str, fewest: int, calls: int, answer: str) -> Episode:
        task = Task("t", "What is 6 + 1?", "7", {"difficulty": difficulty, "min_tool_calls": fewest})
        events = [Event("tool_call", k, "calculator") for k in range(calls)]
        return Episode(task, [Message("assistant", f"Answer: {answer}")], events)

    assert otc_reward(episode("hard", 1, 1, "7")) == pytest.approx(1.0)  # sin(pi/2)
    assert otc_reward(episode("easy", 0, 1, "7")) == pytest.approx(0.5)  # cos(pi/3)
    assert otc_reward(episode("hard", 1, 0, "7")) == pytest.approx(0.0)  # f(0, 1) = 0
    assert otc_reward(episode("hard", 1, 1, "8")) == 0.0
    assert eapo_reward(episode("easy", 0, 2, "7")) == pytest.approx(0.6)  # 1 - 0.2 * 1 * 2
    assert eapo_reward(episode("hard", 1, 3, "7")) == pytest.approx(1.0)  # hard: no penalty
    assert eapo_reward(episode("easy", 0, 2, "8")) == 0.0
