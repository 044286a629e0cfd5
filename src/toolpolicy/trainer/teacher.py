"""On-policy distillation in the trainer: a teacher model scores each step's sampled tokens.

`Teacher` runs a frozen checkpoint with the policy's vocabulary over the episodes that
train; `DistilledCredit` adds its per-token signal (toolpolicy.algorithms.distill) to the
credit the config chose, or uses it alone (`algorithm.teacher_alone`). Every group carries
the teacher's signal, so dynamic sampling keeps them all.

With `algorithm.teacher_loss: full` the teacher speaks in the loss instead: `FullTeacher`
runs beside the policy's own forward in the update and gives the exact reverse KL over the
vocabulary at every trained position (`forward`: the forward KL), which `Distill` weighs
into each micro-batch's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from toolpolicy.algorithms import chunked_token_logprobs, expand_group_mask
from toolpolicy.algorithms.distill import (
    Divergence,
    chunked_divergence,
    distillation_advantages,
    reverse_kl_from_logits,
    reverse_kl_per_token,
)
from toolpolicy.config import ConfigError
from toolpolicy.model import PolicyModel
from toolpolicy.model.vision import VisionInput
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.batch import Recompute, TokenBatch, collate, logit_chunk, micro_batches, placed, placed_logprobs, trained_states
from toolpolicy.trainer.credit import Credit


def same_vocabulary(student: PolicyModel, teacher: PolicyModel, teacher_path: str) -> None:
    """ConfigError unless the teacher's tokenizer maps every token to the student's id: the
    teacher scores the student's token ids as they are."""
    if student.tokenizer.get_vocab() != teacher.tokenizer.get_vocab():
        raise ConfigError(
            f"field 'algorithm.teacher': {teacher_path} has another vocabulary than the policy "
            f"({len(teacher.tokenizer.get_vocab())} and {len(student.tokenizer.get_vocab())} tokens, or the same "
            "tokens under other ids); on-policy distillation needs the teacher to score the student's own token ids"
        )


@dataclass
class Teacher:
    """A frozen model that gives the log-probability of every sampled token."""

    model: torch.nn.Module
    recompute: Recompute
    pad_id: int
    temperature: float
    micro_batch_size: int
    micro_batch_tokens: int | None
    vision: VisionInput | None = None
    """How the teacher reads the episodes' pictures (a vision-language teacher's)."""
    reverse_kl: float = field(default=0.0, init=False)
    """The last scored episodes' reverse KL(student || teacher) per sampled token."""
    tokens: int = field(default=0, init=False)
    """Token positions the teacher's forward ran on the last scored episodes."""

    def logprobs(self, batch: TokenBatch) -> Tensor:
        """[B, L-1] (L: the longest), the teacher's log-prob of each sampled token of `batch`, 0 elsewhere."""
        out = torch.zeros(batch.targets.shape)
        self.tokens = 0
        self.model.eval()
        with torch.no_grad():
            for rows, piece in micro_batches(batch, self.micro_batch_size, self.micro_batch_tokens):
                values, _ = self.recompute.logprobs(self.model, piece, self.temperature)  # [b, l]
                out[rows, : values.shape[1]] = values.float().cpu()
                self.tokens += self.recompute.tokens(piece)
        self.reverse_kl = reverse_kl_per_token(batch.old_logprobs, out, batch.loss_mask)
        return out


@dataclass(frozen=True)
class FullTeacher:
    """A frozen model with the policy's vocabulary whose whole next-token distribution the
    policy is pulled toward at each position it trains (algorithm.teacher_loss: full or forward)."""

    model: torch.nn.Module
    divergence: Divergence = reverse_kl_from_logits
    """Over the vocabulary at each position: reverse KL(student || teacher) (full) or forward (forward)."""

    def logprobs_and_kl(
        self, student: torch.nn.Module, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """`forward_logprobs` of `student` (log-probs of the sampled tokens, the entropy), and the
        reverse KL(student || teacher) over the vocabulary at each trained position, with its
        gradient: one forward of each model, [B, L-1] each, 0 where nothing trains."""
        batch = batch.to(next(student.parameters()).device)
        trained = batch.loss_mask.bool()  # [B, L-1]
        states, head = trained_states(student, batch)  # [N, H]
        chunk = logit_chunk(student)
        logprobs, entropy = chunked_token_logprobs(states, head, batch.targets[trained], chunk, temperature, with_entropy)  # [N]
        with torch.no_grad():
            teacher_states, teacher_head = trained_states(self.model, batch)  # [N, H']
        kl = chunked_divergence(states, head, teacher_states, teacher_head, chunk, temperature, self.divergence)  # [N]
        return *placed_logprobs((logprobs, entropy), trained), placed(kl, trained)


class Distill(NamedTuple):
    """What `policy_update` adds to each micro-batch's loss under algorithm.teacher_loss full
    (or forward): coef x the divergence to the teacher summed over the trained positions, over the step's
    trained tokens (the token mean, as the policy loss's)."""

    logprobs: Callable[..., tuple[Tensor, Tensor | None, Tensor]]
    """FullTeacher.logprobs_and_kl, run as the trainer runs the policy's forward (through its shards)."""
    coef: float
    metric: str
    """The name the step's mean divergence per trained token is logged under (DIVERGENCES)."""


@dataclass(frozen=True)
class DistilledCredit:
    """The config's credit plus the teacher's per-token advantage (or that alone)."""

    base: Credit
    teacher: Teacher | None
    """None: the teacher's full distribution is in the loss (`Distill`), not in the advantages."""
    coef: float
    alone: bool

    def signal(self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int) -> Tensor:
        return torch.ones(len(trajectories) // group_size, dtype=torch.bool)  # [G]: the teacher speaks on every group

    def advantages(
        self, trajectories: list[Trajectory], rewards: Tensor, weights: Tensor, group_size: int, groups: Tensor
    ) -> Tensor:
        width = max(len(t.token_ids) for t in trajectories) - 1
        out = torch.zeros(len(trajectories), width)  # [B, L-1]
        if not self.alone:
            task = self.base.advantages(trajectories, rewards, weights, group_size, groups)  # [B] or [B, L-1]
            out += task[:, None] if task.dim() == 1 else task
        rows = torch.nonzero(expand_group_mask(groups, group_size)).flatten().tolist()
        if rows and self.teacher is not None:
            scored = [trajectories[i] for i in rows]
            batch = collate(scored, self.teacher.pad_id, self.teacher.vision)
            teacher = self.teacher.logprobs(batch)  # [R, l]
            signal = distillation_advantages(batch.old_logprobs, teacher, batch.loss_mask, self.coef)
            out[rows, : signal.shape[1]] += signal
        return out
