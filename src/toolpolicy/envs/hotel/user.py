"""The simulated guest: a `User` answers the desk's last message, or ends the conversation.

`ScriptedUser` follows the task's scenario with a few fixed rules, so the same
assistant text always gets the same reply and expert demonstrations replay exactly.
It only answers questions (a message ending in "?"); anything else ends the
conversation, which is how a finished request or a refusal closes the episode.
An LLM-backed user (an OpenAI-compatible endpoint given the scenario) plugs in
through the same protocol: pass `user=...` to HotelEnv.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from toolpolicy.types import Message, Task


class User(Protocol):
    """One guest for one episode."""

    def reply(self, messages: list[Message]) -> str | None:
        """The guest's answer to the conversation so far (the last message is the desk's), or None to end."""
        ...


UserFactory = Callable[[Task], User]

IDENTITY_WORDS = ("birth", "guest id", "last name", "verify", "identity", "who are you")
WHICH_WORDS = ("which",)
CONFIRM_WORDS = ("confirm", "shall i", "should i", "proceed", "go ahead", "ok?")


class ScriptedUser:
    """Answers identity, which-booking and confirmation questions from the task's scenario.

    Args:
        task: a hotel task; its info gives the identity, the booking meant and whether to confirm.
        max_replies: replies before the guest gives up, so a desk that keeps asking cannot loop.
    """

    def __init__(self, task: Task, max_replies: int = 3) -> None:
        self.info = task.info
        self.left = max_replies

    def reply(self, messages: list[Message]) -> str | None:
        text = messages[-1].content.strip().lower() if messages and messages[-1].role == "assistant" else ""
        if not text.endswith("?") or self.left <= 0:
            return None
        self.left -= 1
        info = self.info
        if any(word in text for word in IDENTITY_WORDS):
            return f"{info['guest']}, {info['last_name']}, {info['birth_year']}."
        if any(word in text for word in WHICH_WORDS):
            return f"{info['booking']}."
        if any(word in text for word in CONFIRM_WORDS):
            return "Yes." if info.get("confirm", True) else "No, keep it as is."
        return None


def scripted_user(task: Task) -> User:
    return ScriptedUser(task)


def scenario_text(task: Task) -> str:
    """The guest's brief, for an LLM-backed user: who they are, what they want, how to answer.

    The scripted user's rules in words, so both kinds of guest play the same scenario."""
    info = task.info
    confirm = "yes" if info.get("confirm", True) else "no"
    return (
        f"You are hotel guest {info['first_name']} {info['last_name']}, guest id {info['guest']}, born "
        f"{info['birth_year']}. You asked the desk: {task.prompt!r} If asked who you are, give guest id, last "
        f"name and birth year. If asked which booking, it is {info['booking']}. If asked to confirm a change, "
        f"answer {confirm}. Reply in one short sentence. When nothing is asked, end the conversation."
    )
