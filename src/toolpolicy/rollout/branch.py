"""Episodes that start inside another one: a branch continues an episode's first turns.

Tree rollouts (entropy-guided branching: ARPO, arXiv 2507.19849; TreeRL) and
error-recovery fission (Fission-GRPO) sample several continuations of one prefix of an
episode: its prompt, its first `turns` assistant turns and the observations after them.
The continuations differ only after the prefix, so a group of them compares what the
policy does from that point on.

A branch's token ids start with the prefix's, exactly as sampled (contract 1); the prefix
is the branch's prompt (`prompt_len`): nothing in it is trained again, and the trainer runs
it once per group. Its turns, events and messages are the prefix's, so turn numbers,
rewards and the turn budget count the whole episode.

The environment's state at the branch point is rebuilt by replaying: a fresh session runs
the prefix's admitted calls again, in order, through the same policy (with a ledger of its
own and no audit log: the calls were decided and logged when the parent ran them), and the
simulated user hears the prefix's answers again. Every call must give the result the parent
saw; a tool that answers differently (time, randomness, an outside service) makes the
branch an infrastructure error, never a silently different episode.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from toolpolicy.envs.base import Session
from toolpolicy.gate import Gate, Ledger, admit, settle
from toolpolicy.rollout.trajectory import Trajectory
from toolpolicy.types import Episode, Message


@dataclass(frozen=True)
class Branch:
    """Continue `trajectory` after its first `turns` assistant turns (and their observations)."""

    trajectory: Trajectory
    turns: int

    def __post_init__(self) -> None:
        if not 0 < self.turns < len(self.trajectory.turn_spans):
            raise ValueError(
                f"a branch continues after 1 to {len(self.trajectory.turn_spans) - 1} turns of its episode "
                f"(the turn after them must exist), not {self.turns}"
            )

    @property
    def cut(self) -> int:
        """Tokens of the prefix: up to where the parent's next turn starts."""
        return self.trajectory.turn_spans[self.turns][0]

    def messages(self) -> list[Message]:
        """The parent's messages before its (turns + 1)-th assistant message."""
        seen = 0
        for k, message in enumerate(self.trajectory.episode.messages):
            if message.role == "assistant":
                if seen == self.turns:
                    return list(self.trajectory.episode.messages[:k])
                seen += 1
        raise ValueError(f"the episode has fewer than {self.turns + 1} assistant messages")

    def start(self) -> Trajectory:
        """The branch before its first own turn: the prefix, nothing of it trained."""
        parent = self.trajectory
        cut = self.cut
        episode = Episode(parent.episode.task, self.messages(), [e for e in parent.episode.events if e.turn < self.turns])
        return Trajectory(
            list(parent.token_ids[:cut]), [0] * cut, list(parent.logprobs[:cut]), cut, episode, list(parent.turn_spans[: self.turns]),
            [(position, image) for position, image in parent.images if position < cut],
        )

    @property
    def spent(self) -> int:
        """Tokens the prefix spent of the episode's budget (after the parent's own prompt)."""
        return self.cut - self.trajectory.prompt_len


def quiet(gate: Gate) -> Gate:
    """`gate` without its audit log: the same policy and tools, for replaying decided calls."""
    replaying = copy.copy(gate)
    replaying.audit = None
    return replaying


def replay_prefix(session: Session, gate: Gate, ledger: Ledger, messages: list[Message]) -> str | None:
    """Bring a fresh `session` and `ledger` to where `messages` (a branch's prefix) left them:
    each assistant turn's calls go through `gate` (give it `quiet(gate)`) and the admitted
    ones run; an answer that a user message follows gets the session's reply again.
    Returns None, or what differs from the recorded episode (then the branch cannot be
    continued faithfully)."""
    for k, message in enumerate(messages):
        if message.role != "assistant":
            continue
        after = messages[k + 1 :]
        if message.tool_calls:
            recorded = [m for m in _observations(after) if m.name != "error"]  # one per call, in order
            for call, seen in zip(message.tool_calls, recorded + [None] * len(message.tool_calls)):
                admission = admit(gate, ledger, call)
                if not admission.runs:
                    continue
                result = session.run_admitted(call, admission.decision)
                settle(ledger, call, result.ok, result.facts)
                if seen is not None and (gate.redact(result.content), result.images) != (seen.content, seen.images):
                    return f"branch: tool {call.name} gave another result when its call was replayed (it is not deterministic)"
        elif after and after[0].role == "user":
            session.on_answer(messages[: k + 1])
    return None


def _observations(messages: list[Message]) -> list[Message]:
    """The tool messages at the start of `messages`, which answer the turn before them: the
    parse errors (named "error") first, then one per call in the call's order (`observe`)."""
    out = []
    for message in messages:
        if message.role != "tool":
            break
        out.append(message)
    return out
