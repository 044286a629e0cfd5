"""The record of one rollout at token level: the boundary between rollout and trainer."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolpolicy.types import Episode


@dataclass
class Trajectory:
    """Token ids exactly as sampled or appended, with the mask the loss uses.

    token_ids: prompt + every assistant turn + every observation, in order.   # [L]
    loss_mask: 1 on tokens the policy sampled, 0 on prompt, tool output,
               user turns and gate messages (docs/architecture.md, contract 2).               # [L]
    logprobs:  the sampling log-probability of each sampled token, 0 elsewhere. # [L]
    turn_spans: [start, end) of each assistant turn inside token_ids.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    episode: Episode
    turn_spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def response_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def append(self, ids: list[int], sampled: bool, logprobs: list[float] | None = None) -> None:
        """Append a fragment: sampled by the policy (mask 1) or forced (mask 0)."""
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        if sampled:
            self.turn_spans.append((start, len(self.token_ids)))
