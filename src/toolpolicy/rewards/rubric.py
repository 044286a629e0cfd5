"""A Rubric: named reward functions with weights, summed into one scalar reward.

After verifiers' Rubric: weight-0 terms are metrics, computed and reported but not in the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from toolpolicy.rewards.functions import REWARD_FUNCTIONS, RewardFunction
from toolpolicy.types import Episode


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
        """Build from {function name: weight}, names looked up in REWARD_FUNCTIONS (ValueError if unknown)."""
        unknown = [name for name in weights if name not in REWARD_FUNCTIONS]
        if unknown:
            raise ValueError(f"unknown reward function(s) {unknown}; valid names: {sorted(REWARD_FUNCTIONS)}")
        return Rubric(tuple(RubricTerm(name, REWARD_FUNCTIONS[name], float(w)) for name, w in weights.items()))

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
