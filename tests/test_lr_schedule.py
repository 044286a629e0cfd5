"""The learning-rate schedules (trainer/schedule.py) by their worked examples; the RL trainer's
use of them is tested in tests/test_rl_stall.py."""

from __future__ import annotations

import doctest

import toolpolicy.trainer.schedule


def test_the_schedules_worked_examples() -> None:
    result = doctest.testmod(toolpolicy.trainer.schedule)
    assert result.attempted >= 4 and result.failed == 0
