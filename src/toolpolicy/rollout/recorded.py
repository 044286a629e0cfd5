"""A recorded conversation (SFT data) as a Trajectory, framed the way the engine frames a rollout.

The engine tokenizes a rollout fragment by fragment: the prompt, each assistant turn
as the model writes it, each run of tool or user messages that follows. A recorded
conversation is cut at the same places, each piece goes through the same template
call and the same `encode`, and the episode's budgets (`EpisodeLimits`) cut it where they
would cut a rollout. So a dialogue the engine produced and one read back from a file
give the same token ids, and the same loss mask: 1 on assistant turns, 0 on the
prompt, tool results and user turns (docs/architecture.md, contracts 1 and 2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from toolpolicy.chat import ChatTemplate
from toolpolicy.rollout.engine import EpisodeLimits, truncate
from toolpolicy.rollout.trajectory import Trajectory
from toolpolicy.types import Episode, Message, Task, ToolSpec


def recorded_trajectory(
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    template: ChatTemplate,
    encode: Callable[[str], list[int]],
    limits: EpisodeLimits,
    task: Task | None = None,
) -> Trajectory:
    """The Trajectory of a conversation: everything before the first assistant message is the
    prompt; each assistant message a trained fragment, the messages up to the next one a masked
    observation. Where a rollout would have been cut (max_turns, max_tokens, max_turn_tokens),
    the conversation is cut too and its episode marked truncated. Log-probabilities are 0."""
    first = next(i for i, m in enumerate(messages) if m.role == "assistant")
    prompt = encode(template.render_prompt(messages[:first], tools))
    episode = Episode(task or Task("recorded", "", ""), list(messages))
    trajectory = Trajectory(list(prompt), [0] * len(prompt), [0.0] * len(prompt), len(prompt), episode)
    at = first
    for turn in range(limits.max_turns):
        assistant = messages[at]
        ids = encode(template.render_assistant(assistant))
        budget = min(limits.max_turn_tokens, limits.max_tokens - trajectory.response_len)
        trajectory.append(ids[:budget], sampled=True)
        if len(ids) > budget:
            truncate(episode, turn, "max_turn_tokens" if budget else "max_tokens")
            return trajectory
        following = next((i for i in range(at + 1, len(messages)) if messages[i].role == "assistant"), len(messages))
        observation = messages[at + 1 : following]
        if not observation:
            return trajectory
        fragment = encode(template.render_observation(observation, after=assistant))
        if trajectory.response_len + len(fragment) >= limits.max_tokens:
            truncate(episode, turn, "max_tokens")
            return trajectory
        trajectory.append(fragment, sampled=False)
        if following == len(messages):
            return trajectory
        at = following
    truncate(episode, limits.max_turns, "max_turns")
    return trajectory
