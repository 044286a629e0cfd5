"""The record of one rollout at token level: the boundary between rollout and trainer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from toolpolicy.types import Episode, Image


@dataclass
class Trajectory:
    """Token ids exactly as sampled or appended, with the mask the loss uses.

    token_ids: prompt + every assistant turn + every observation, in order.   # [L]
    loss_mask: 1 on tokens the policy sampled, 0 on prompt, tool output,
               user turns and gate messages (docs/architecture.md, contract 2).               # [L]
    logprobs:  the sampling log-probability of each sampled token, 0 elsewhere. # [L]
    turn_spans: [start, end) of each assistant turn inside token_ids.
    images:    each picture the prompt and observations show, with the position of its
               first vision placeholder in token_ids (chat/images.py), in order.
    """

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_len: int
    episode: Episode
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    images: list[tuple[int, Image]] = field(default_factory=list)

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def response_len(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def append(
        self, ids: list[int], sampled: bool, logprobs: list[float] | None = None, images: Sequence[tuple[int, Image]] = ()
    ) -> None:
        """Append a fragment: sampled by the policy (mask 1) or forced (mask 0), with the
        pictures it shows (their positions inside the fragment)."""
        start = len(self.token_ids)
        self.images.extend((start + position, image) for position, image in images)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        if sampled:
            self.turn_spans.append((start, len(self.token_ids)))
