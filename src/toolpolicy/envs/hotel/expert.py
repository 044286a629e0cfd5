"""The imperfect desk demonstrator used for the SFT cold start.

It follows each task's compliant plan, except that on a share of tasks it breaks
the policy the way a careless agent does: it skips identity verification, refunds
more than is left, or carries out a request it should refuse (a late cancellation
without insurance, a refund above what was paid, a change to a cancelled booking).
On another share it acts without asking: it cancels the first of several bookings
instead of asking which, or makes a date change without asking the guest, who would
have declined. Only the database check sees those.
Those flaws are what RL, under the gate and the database check, has to repair.

On another share, where the guest gave only a name, it verifies a namesake from the
lookup list first, and on "not verified" asks the guest for their id: a slip and its
recovery, so the model has seen the way back from a wrong pick.

Only assistant messages are returned. Tool results come from running the calls and
the guest's replies from the session's ScriptedUser, exactly as in RL; the plan's
questions are the ones that user answers, so a replay never runs out of turns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from toolpolicy.envs.base import Env, Probability
from toolpolicy.envs.hotel.tasks import ASK_IDENTITY, call, say
from toolpolicy.types import Message, Task, ToolCall


@dataclass(frozen=True)
class ExpertStyle:
    """How often the demonstrator does what, per task."""

    violation: float = 0.2
    """Probability of breaking the policy on a task (the kind of break fits the task)."""
    guess: float = 0.1
    """Probability of acting without asking where the answer matters: cancelling the first of
    several bookings instead of asking which, or changing dates the guest would have declined."""
    slip: float = 0.0
    """Probability, when the guest gave only a name, of first verifying a namesake from the lookup
    list, then asking the guest for their id after "not verified"."""


def _is_call(step: dict[str, Any], *names: str) -> bool:
    return "call" in step and step["call"]["name"] in names


def _is_confirm(step: dict[str, Any]) -> bool:
    return "say" in step and step["say"].endswith("Confirm?")


def _broken(task: Task, plan: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """The plan with one policy break that suits the task."""
    info, kind = task.info, task.info["kind"]
    bid, head = info["booking"], plan[:-1]  # the last step is always the closing message
    if kind == "cancel_late":
        return [*head, call("cancel", booking=bid), say(f"{bid} is cancelled.")]
    if kind in ("refund_over", "refund") and (kind == "refund_over" or rng.random() < 0.5):
        amount = info["amount"] if kind == "refund_over" else info["amount"] + 1000
        kept = [s for s in head if not _is_call(s, "refund")]
        return [*kept, call("refund", booking=bid, amount=amount), say(f"Refunded {amount} on {bid}.")]
    if kind == "change_cancelled":
        check_in, check_out = info["new_dates"]
        return [*head, call("reschedule", booking=bid, start=check_in, end=check_out),
                say(f"Done, {bid} is moved.")]
    # skip verification (a handoff too: it files a case on the guest's account, verify-first covers it)
    return [s for s in plan if not _is_call(s, "verify", "lookup")]


def _unasked(task: Task, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan with the which-booking or confirmation question dropped, acting on a guess."""
    info = task.info
    bid = info["booking"]
    if info["kind"] == "which_booking":
        question = next(s["say"] for s in plan if "say" in s and s["say"].startswith("Which booking"))
        first = question.removeprefix("Which booking: ").rstrip("?").split(" or ")[0]
        kept = [s for s in plan[:-1] if s.get("say") != question and not _is_call(s, "cancel")]
        closing = plan[-1] if first == bid else say(f"{first} is cancelled.")  # a lucky guess is still right
        return [*kept, call("cancel", booking=first), closing]
    check_in, check_out = info["new_dates"]  # change_declined: the change the guest would have refused
    kept = [s for s in plan[:-1] if not _is_confirm(s)]
    return [*kept, call("reschedule", booking=bid, start=check_in, end=check_out), say(f"Done, {bid} is moved.")]


def _slipped(task: Task, plan: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """The plan with a namesake verified first and, after "not verified", the guest asked who they are."""
    at = next(i for i, step in enumerate(plan) if _is_call(step, "verify"))
    wrong = dict(plan[at]["call"]["arguments"], guest=rng.choice(task.info["namesakes"]))
    return [*plan[:at], call("verify", **wrong), say(ASK_IDENTITY), *plan[at:]]


def expert_turns(task: Task, rng: random.Random, style: ExpertStyle) -> list[Message]:
    """The demonstrator's assistant messages for `task`, in order (see the module docstring)."""
    plan = list(task.info["plan"])
    if rng.random() < style.violation:
        plan = _broken(task, plan, rng)
    elif rng.random() < style.guess and task.info["kind"] in ("which_booking", "change_declined"):
        plan = _unasked(task, plan)
    named = task.info["identity"] == "by_name" and task.info.get("namesakes") and _is_call(plan[0], "lookup")
    if style.slip and named and rng.random() < style.slip:  # no draw when off: older checkpoints replay exactly
        plan = _slipped(task, plan, rng)
    return [Message("assistant", "", (ToolCall(s["call"]["name"], dict(s["call"]["arguments"])),)) if "call" in s
            else Message("assistant", s["say"]) for s in plan]


def demonstrate(
    task: Task, rng: random.Random, env: Env, *, violation: Probability = 0.2, guess: Probability = 0.1,
    slip: Probability = 0.0,
) -> list[Message]:
    """hotel's imperfect desk clerk, the demonstrator of its SFT cold start.

    Args:
        violation: the probability that it breaks the policy on a task (skips verification,
            refunds too much, carries out a request it should refuse).
        guess: the probability that it acts without asking where the answer matters (cancels
            the first of several bookings, changes dates the guest would decline).
        slip: the probability that, when the guest gave only a name, it verifies a namesake
            from the lookup list first, then asks for the guest's id.
    """
    return expert_turns(task, rng, ExpertStyle(violation, guess, slip))
