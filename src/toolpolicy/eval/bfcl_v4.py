"""BFCL v4's single-turn categories, read from the installed `bfcl-eval` package.

`toolpolicy eval CONFIG --bfcl v4 [--categories simple_python,live_multiple ...]` (or BFCL's
names for groups: `--categories non_live`) scores a model on the Berkeley Function Calling
Leaderboard's own test files and possible answers (`bfcl_eval/data/`), nothing copied into
this repository. The entries are read, and shown to the model as BFCL shows them, by
toolpolicy.envs.bfcl.single_data (which the `bfcl` environment reads too);
irrelevance entries pass when no call is made, relevance entries when any call is.

Scores follow BFCL's leaderboard: per-category accuracy; non-live AST as the
unweighted mean of simple (itself the mean of Python, Java and JavaScript),
multiple, parallel and parallel multiple; live AST as the accuracy over all live
AST entries (weighted by count); hallucination as the mean of irrelevance and
live irrelevance. BFCL v4's overall score weights non-live, live, hallucination,
multi-turn and agentic 10:10:10:30:40; `single_turn` is the first three at their
equal weights, the part of the overall that these categories decide.
"""

from __future__ import annotations

from typing import Any

from toolpolicy.envs.bfcl.single_data import AST_CATEGORIES, CATEGORIES, CATEGORY_GROUPS, RELEVANCE_CATEGORIES, known_categories, load_v4
from toolpolicy.eval.bfcl import BfclFileError

NON_LIVE_SIMPLE = ("simple_python", "simple_java", "simple_javascript")
NON_LIVE_REST = ("multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")
HALLUCINATION = ("irrelevance", "live_irrelevance")
OVERALL_WEIGHTS = {"non_live": 10, "live": 10, "hallucination": 10, "multi_turn": 30, "agentic": 40}
"""BFCL v4's weights for its overall score."""
__all__ = [  # the categories and load_v4 are single_data's, named here for the eval command's callers
    "AST_CATEGORIES", "CATEGORIES", "CATEGORY_GROUPS", "HALLUCINATION", "LIVE_AST", "NON_LIVE_REST", "NON_LIVE_SIMPLE", "OVERALL_WEIGHTS",
    "RELEVANCE_CATEGORIES", "bfcl_scores", "load_v4", "parse_categories",
]


def parse_categories(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of categories and of BFCL's names for groups of them
    (`CATEGORY_GROUPS`: "non_live", "live", "single_turn", "all"), in order, each once;
    none given: every single-turn category.

    >>> parse_categories("non_live")
    ('simple_python', 'simple_java', 'simple_javascript', 'multiple', 'parallel', 'parallel_multiple', 'irrelevance')
    >>> parse_categories("live_simple, live, irrelevance")[:3]
    ('live_simple', 'live_multiple', 'live_parallel')
    """
    names = [name.strip() for name in (text or "").split(",") if name.strip()] or ["all"]
    try:
        return known_categories(names)
    except ValueError as error:
        raise BfclFileError(str(error)) from None


def bfcl_scores(by_category: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """BFCL's group scores from per-category accuracy and counts; a group with a category not run is None."""

    def accuracy(name: str) -> float | None:
        return by_category[name]["accuracy"] if name in by_category else None

    def mean(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type]

    simple = mean([accuracy(c) for c in NON_LIVE_SIMPLE])
    non_live = mean([simple, *(accuracy(c) for c in NON_LIVE_REST)])
    live = None
    if all(c in by_category for c in LIVE_AST):
        live = sum(by_category[c]["accuracy"] * by_category[c]["n"] for c in LIVE_AST) / sum(by_category[c]["n"] for c in LIVE_AST)
    hallucination = mean([accuracy(c) for c in HALLUCINATION])
    return {
        "non_live_simple": simple,
        "non_live": non_live,
        "live": live,
        "hallucination": hallucination,
        "relevance": accuracy("live_relevance"),
        "single_turn": mean([non_live, live, hallucination]),
    }
