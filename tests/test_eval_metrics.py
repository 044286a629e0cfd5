"""pass@k, pass^k and the evaluation summary, against hand-computed values."""

import doctest
import json
import math

import pytest

import toolpolicy.eval.metrics
import toolpolicy.report.comparison
from toolpolicy.eval.metrics import MAX_PASS_K, ScoredEpisode, pass_at_k, pass_hat_k, summarize
from toolpolicy.types import Episode, Event, Message, Task
from toolpolicy.report import format_comparison, format_summary


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 1, 1, 0.25),  # k = 1 is c / n
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 0, 3, 0.0),  # nothing correct
        (3, 3, 1, 1.0),  # everything correct
        (4, 2, 3, 1.0),  # n - c < k: every draw of 3 contains a correct one
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 2, 2, 1 / 6),  # C(2,2)/C(4,2)
        (5, 3, 2, 0.3),  # C(3,2)/C(5,2) = 3/10
        (4, 1, 2, 0.0),  # c < k
        (4, 4, 4, 1.0),
        (4, 3, 1, 0.75),  # k = 1 is c / n
    ],
)
def test_pass_hat_k_by_hand(n, c, k, expected):
    assert pass_hat_k(n, c, k) == pytest.approx(expected)


def test_pass_estimators_match_binomials():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
                assert pass_hat_k(n, c, k) == pytest.approx(math.comb(c, k) / math.comb(n, k))


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form does not.
    assert 0.0 <= pass_at_k(1000, 3, 500) <= 1.0
    assert pass_hat_k(1000, 999, 500) == pytest.approx(0.5)  # (1000-500)/1000


@pytest.mark.parametrize(("n", "c", "k"), [(2, 1, 3), (2, 3, 1), (2, 1, 0)])
def test_pass_estimators_reject_bad_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        pass_hat_k(n, c, k)


def record(task_id, difficulty, correct, tool_calls=1, invalid_calls=0, truncated=False, infra=False, tokens=100):
    return ScoredEpisode(task_id, difficulty, correct, tool_calls, invalid_calls, truncated, infra, tokens)


def test_summarize_uneven_trials_and_infra_exclusion():
    records = [
        # task a (easy): 4 trials, 2 correct
        record("a", "easy", True, tool_calls=2, tokens=100),
        record("a", "easy", True, tool_calls=2, tokens=100),
        record("a", "easy", False, tool_calls=0, invalid_calls=2, tokens=200),
        record("a", "easy", False, tool_calls=0, truncated=True, tokens=400),
        # task b (hard): 2 trials, both correct
        record("b", "hard", True, tool_calls=1, tokens=50),
        record("b", "hard", True, tool_calls=1, tokens=50),
        # infra failures: excluded everywhere, would otherwise lower b's accuracy and add task c
        record("b", "hard", False, tool_calls=9, invalid_calls=9, tokens=999, infra=True),
        record("c", "hard", False, infra=True),
    ]
    summary = summarize(records)
    assert summary["infra_errors"] == 2
    assert summary["n"] == 6
    assert summary["accuracy"] == pytest.approx(4 / 6)
    assert summary["tool_calls_per_episode"] == pytest.approx(6 / 6)  # 2 + 2 + 0 + 0 + 1 + 1
    assert summary["invalid_call_rate"] == pytest.approx(2 / 8)  # 2 invalid / (6 valid + 2 invalid)
    assert summary["truncated_rate"] == pytest.approx(1 / 6)
    assert summary["tokens_per_episode"] == pytest.approx(900 / 6)
    # k = 1, 2 average over both tasks; k = 3, 4 over task a alone (b has 2 scored trials).
    # pass@1: mean(2/4, 2/2) = 0.75. pass@2: mean(5/6, 1) = 11/12. pass^2: mean(1/6, 1) = 7/12.
    # pass@3 = 1 - C(2,3)/C(4,3) = 1, pass@4 = 1; pass^3 = C(2,3)/C(4,3) = 0, pass^4 = 0.
    assert summary["pass_at_k"] == pytest.approx({"1": 0.75, "2": 11 / 12, "3": 1.0, "4": 1.0})
    assert summary["pass_hat_k"] == pytest.approx({"1": 0.75, "2": 7 / 12, "3": 0.0, "4": 0.0})
    assert summary["pass_k_tasks"] == {"1": 2, "2": 2, "3": 1, "4": 1}

    easy, hard = summary["by_difficulty"]["easy"], summary["by_difficulty"]["hard"]
    assert list(summary["by_difficulty"]) == ["easy", "hard"]
    assert easy["n"] == 4 and easy["accuracy"] == pytest.approx(0.5)
    assert easy["invalid_call_rate"] == pytest.approx(2 / 6)
    # easy has 4 trials of its single task (2 correct), so k goes up to 4.
    # pass@3 = 1 - C(2,3)/C(4,3) = 1 (any 3 of 4 include a success); pass^3 = C(2,3)/C(4,3) = 0.
    assert easy["pass_at_k"] == pytest.approx({"1": 0.5, "2": 5 / 6, "3": 1.0, "4": 1.0})
    assert easy["pass_hat_k"] == pytest.approx({"1": 0.5, "2": 1 / 6, "3": 0.0, "4": 0.0})
    assert hard["n"] == 2 and hard["accuracy"] == 1.0 and hard["tokens_per_episode"] == 50
    assert set(easy) == set(summary) - {"by_difficulty", "infra_errors", "wrong_write_examples"}
    json.dumps(summary)  # JSON-ready


def test_summarize_empty_and_all_infra():
    for records in ([], [record("a", "easy", True, infra=True)]):
        summary = summarize(records)
        assert summary["n"] == 0 and summary["accuracy"] == 0.0
        assert summary["pass_at_k"] == {} and summary["by_difficulty"] == {}
        assert summary["pass_k_tasks"] == {}
    assert summarize([record("a", "easy", True, infra=True)])["infra_errors"] == 1


def test_an_infra_failed_trial_keeps_pass_hat_4_for_the_other_tasks():
    # Three tasks, 4 trials each; task c's fourth trial hit an infrastructure error.
    records = [
        *(record("a", "easy", ok) for ok in (True, True, True, True)),  # a: 4 of 4
        *(record("b", "easy", ok) for ok in (True, True, True, False)),  # b: 3 of 4
        *(record("c", "easy", ok) for ok in (True, True, True)),  # c: 3 of 3 scored
        record("c", "easy", False, infra=True),  # excluded, not a failure
    ]
    summary = summarize(records)
    # k = 1..3 cover all three tasks, k = 4 only a and b.
    assert summary["pass_k_tasks"] == {"1": 3, "2": 3, "3": 3, "4": 2}
    # pass^1 = mean(4/4, 3/4, 3/3) = 2.75/3
    # pass^2 = mean(C(4,2)/C(4,2), C(3,2)/C(4,2), C(3,2)/C(3,2)) = mean(1, 3/6, 1) = 2.5/3
    # pass^3 = mean(C(4,3)/C(4,3), C(3,3)/C(4,3), C(3,3)/C(3,3)) = mean(1, 1/4, 1) = 2.25/3 = 0.75
    # pass^4 = mean(C(4,4)/C(4,4), C(3,4)/C(4,4)) = mean(1, 0) = 0.5: c is left out, not scored 0
    assert summary["pass_hat_k"] == pytest.approx({"1": 2.75 / 3, "2": (1 + 0.5 + 1) / 3, "3": 0.75, "4": 0.5})
    # pass@k: b fails once, so any 2+ of its 4 trials include a success; pass@1 = pass^1.
    assert summary["pass_at_k"] == pytest.approx({"1": 2.75 / 3, "2": 1.0, "3": 1.0, "4": 1.0})
    assert summary["infra_errors"] == 1
    assert format_summary(summary).count("(2 of 3 tasks)") == 2  # pass@4 and pass^4, nothing else
    assert "pass^4 (2 of 3 tasks)" in format_summary(summary) and "pass^3 (" not in format_summary(summary)


def test_pass_k_coverage_counts_tasks_with_at_least_k_trials():
    # trials per task: a 1, b 2, c 2, d 5; all correct, so every pass figure is 1.
    records = [record(t, "easy", True) for t, n in (("a", 1), ("b", 2), ("c", 2), ("d", 5)) for _ in range(n)]
    summary = summarize(records)
    # k=1: a b c d; k=2: b c d; k=3..5: d.
    assert summary["pass_k_tasks"] == {"1": 4, "2": 3, "3": 1, "4": 1, "5": 1}
    assert summary["pass_hat_k"] == pytest.approx({str(k): 1.0 for k in range(1, 6)})
    assert summary["by_difficulty"]["easy"]["pass_k_tasks"] == summary["pass_k_tasks"]
    # capped at MAX_PASS_K trials however many a task has
    many = summarize([record("a", "easy", True) for _ in range(MAX_PASS_K + 3)])
    assert list(many["pass_k_tasks"]) == [str(k) for k in range(1, MAX_PASS_K + 1)]


def test_pass_coverage_in_a_before_after_table():
    before = {"pass_hat_k": {"4": 0.5}, "pass_k_tasks": {"1": 60, "4": 59}}
    after = {"pass_hat_k": {"4": 0.6}, "pass_k_tasks": {"1": 60, "4": 60}}
    assert "pass^4 (59 of 60 / 60 of 60 tasks)" in format_comparison(before, after)
    assert "pass^4 (59 of 60 tasks)" in format_comparison(before, before)
    full = format_comparison(after, after)
    assert "pass^4 " in full and "of 60" not in full  # every task covered: no note
    assert "pass^4 " in format_comparison({"pass_hat_k": {"4": 0.5}}, after)  # older evals lack the counts
    assert doctest.testmod(toolpolicy.report.comparison).failed == 0


def test_record_from_episode():
    task = Task("t7", "2+2?", "4", {"difficulty": "medium"})
    ep = Episode(
        task,
        [Message("user", "2+2?"), Message("assistant", "Answer: 4")],
        [Event("tool_call", 0), Event("invalid_call", 0), Event("invalid_call", 1), Event("tool_call", 1)],
        truncated=True,
        infra_error="calculator timed out",
    )
    assert ScoredEpisode.from_episode(ep, correct=False, tokens=321) == ScoredEpisode(
        "t7", "medium", False, 2, 2, True, True, 321
    )
    clean = Episode(Task("t8", "?", "1"), [])
    assert ScoredEpisode.from_episode(clean, True, 0) == ScoredEpisode("t8", "all", True, 0, 0, False, False, 0)


def test_docstring_examples():
    result = doctest.testmod(toolpolicy.eval.metrics)
    assert result.attempted > 0 and result.failed == 0


def test_violations_wrong_writes_and_categories_come_from_the_episode():
    task = Task("h1", "cancel my stay", "", {"category": "forbidden"})
    shadow = [Event("violation", 2, "late-cancel"), Event("violation", 3, "refund-cap")]  # denied in shadow mode, ran
    ep = Episode(task, [], [Event("gate_deny", 0, "late-cancel"), Event("tool_call", 1, "get_booking"), *shadow])
    ep.outcome = {"wrong_writes": 1, "wrong_write_calls": ["cancel(booking=B7)"]}
    r = ScoredEpisode.from_episode(ep, False, 40)
    assert (r.category, r.violations, r.violations_run, r.wrong_writes, r.denials) == ("forbidden", 3, 2, 1, 1)
    clean = Episode(Task("h2", "x", "", {"category": "feasible"}), [])
    summary = summarize([r, ScoredEpisode.from_episode(clean, True, 10)])
    assert summary["violations_per_episode"] == 1.5 and summary["wrong_writes_per_episode"] == 0.5
    assert summary["violations_run_per_episode"] == 1.0
    assert summary["wrong_write_examples"] == ["h1 (forbidden): cancel(booking=B7)"]
    assert format_summary({**summary, "name": "off"}).endswith("first 1):\n  h1 (forbidden): cancel(booking=B7)")
    assert list(summary["by_category"]) == ["feasible", "forbidden"]
    assert summary["by_category"]["forbidden"]["accuracy"] == 0.0 and summary["by_category"]["feasible"]["accuracy"] == 1.0
    assert "by_category" not in summarize([ScoredEpisode.from_episode(Episode(Task("c", "x", "1"), []), True, 1)])


def test_paired_bootstrap_interval_by_hand() -> None:
    """Differences [1, 0]: a resample of two items has mean 0 (1/4), 0.5 (1/2) or 1 (1/4), so the
    95% percentile interval is [0, 1] around the mean 0.5; a constant difference has no spread."""
    from toolpolicy.eval.metrics import paired_bootstrap

    spread = paired_bootstrap([0, 0], [1, 0], resamples=4000, seed=1)
    assert spread == {"mean": 0.5, "low": 0.0, "high": 1.0, "n": 2}
    assert paired_bootstrap([0, 1, 0], [1, 2, 1]) == {"mean": 1.0, "low": 1.0, "high": 1.0, "n": 3}
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([0, 1], [1])
