"""A Rubric: named reward functions with weights, summed into one scalar reward.

After verifiers' Rubric: weight-0 terms are metrics, computed and reported but not in the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from toolpolicy.registry import REWARD, resolve_callable, short_name
from toolpolicy.rewards.functions import REWARD_FUNCTIONS, RewardFunction
from toolpolicy.types import Episode


def reward_function(name: str) -> RewardFunction:
    """The reward function `name`: a built-in (REWARD_FUNCTIONS), an installed package's
    entry point (group `toolpolicy.rewards`) or an import path `module:function`. Any
    callable from Episode to a number will do. ExtensionError (a ValueError) says what was tried."""
    return resolve_callable(REWARD, name, REWARD_FUNCTIONS)  # type: ignore[return-value]


class RubricTerm(NamedTuple):
    """One reward function, its name in reports, and its weight in the total."""

    name: str
    fn: RewardFunction
    weight: float


@dataclass(frozen=True)
class Score:
    """An episode's scalar reward and every term's unweighted value, weight-0 metrics included."""

    total: float
    components: dict[str, float]


@dataclass(frozen=True)
class Rubric:
    """An ordered list of (name, fn, weight); total = sum(weight * fn(episode)).

    >>> from toolpolicy.types import Episode, Message, Task
    >>> rubric = Rubric.from_weights({"correct_answer": 1.0, "answer_format": 0.0})
    >>> ep = Episode(Task("t1", "2+2?", "4"), [Message("user", "2+2?"), Message("assistant", "Answer: 4")])
    >>> rubric.score(ep)
    Score(total=1.0, components={'correct_answer': 1.0, 'answer_format': 1.0})
    """

    terms: tuple[RubricTerm, ...]

    @staticmethod
    def from_weights(weights: dict[str, float]) -> Rubric:
        """Build from {function name: weight}, each name resolved by `reward_function`
        (ValueError if it resolves to nothing). A term is named as reports show it: a
        registered name as it is, an import path by its function's name (`short_name`)."""
        terms = tuple(RubricTerm(short_name(name), reward_function(name), float(w)) for name, w in weights.items())
        names = [term.name for term in terms]
        clashing = sorted({name for name in names if names.count(name) > 1})
        if clashing:
            raise ValueError(f"two reward functions would both be reported as {clashing}: rename one")
        return Rubric(terms)

    def with_term(self, name: str, fn: RewardFunction, weight: float) -> Rubric:
        """This Rubric with one more term (a reward function built from settings, such as
        DAPO's overlong penalty); ValueError if the name is taken."""
        if any(term.name == name for term in self.terms):
            raise ValueError(f"the Rubric already has a term {name!r}")
        return Rubric((*self.terms, RubricTerm(name, fn, float(weight))))

    def score(self, episode: Episode) -> Score:
        """Run every term on the episode; weight-0 terms appear in components only."""
        components = {term.name: float(term.fn(episode)) for term in self.terms}
        total = sum(term.weight * components[term.name] for term in self.terms if term.weight != 0.0)
        return Score(total=float(total), components=components)


def term_means(scores: list[Score]) -> dict[str, float]:
    """Each Rubric term's mean over the episodes, by the name reports show it (weight-0 metrics
    and custom reward functions included).

    >>> term_means([Score(1.0, {"correct_answer": 1.0}), Score(0.0, {"correct_answer": 0.0})])
    {'correct_answer': 0.5}
    """
    names = scores[0].components if scores else {}
    return {name: sum(s.components[name] for s in scores) / len(scores) for name in names}
