"""On-policy distillation: a teacher scores the student's own samples, token by token.

The student samples as in RL; a teacher with the same vocabulary gives the log-probability
of each sampled token. The per-token advantage

    A_t = coef * (log p_teacher(x_t | x_<t) - log p_student(x_t | x_<t))

with no discount over later tokens makes the policy gradient that of the reverse KL
KL(student || teacher) summed over the sampled positions, estimated on the student's own
samples (GKD with lambda = 1 and the reverse divergence, Agarwal et al. 2024,
arXiv 2306.13649; "on-policy distillation", Lu and Thinking Machines 2025). It can stand
alone or be added to a task advantage. Both sets of log-probs are at the sampling
temperature.

The full-distribution form (`algorithm.teacher_loss: full`) adds to the loss, at each sampled
position, the exact reverse KL over the whole vocabulary,

    KL_t = sum_v p_student(v | x_<t) (log p_student(v | x_<t) - log p_teacher(v | x_<t)),

whose gradient carries the teacher's opinion of every token the student might have written
there, not only of the one it wrote: GKD's on-policy objective with the reverse divergence,
with no sampling noise at the position itself. `algorithm.teacher_loss: forward` puts the
forward divergence there instead,

    KL_t = sum_v p_teacher(v | x_<t) (log p_teacher(v | x_<t) - log p_student(v | x_<t)),

the cross-entropy to the teacher's distribution up to its entropy, on the student's own
prefixes (GKD's on-policy objective with the forward divergence): mass-covering where the
reverse form is mode-seeking, and its gradient on the logits, p_student - p_teacher, does not
fade where the student gives the teacher's tokens little probability.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from toolpolicy.algorithms.losses import at_temperature, checkpointed_chunks


def distillation_advantages(student_logprobs: Tensor, teacher_logprobs: Tensor, loss_mask: Tensor, coef: float) -> Tensor:
    """Per-token advantage coef * (log p_teacher - log p_student) on sampled tokens, 0 elsewhere.   [B, T]

    >>> import torch
    >>> student = torch.tensor([[-1.0, -2.0, 0.0]])
    >>> teacher = torch.tensor([[-0.5, -3.0, -9.0]])
    >>> distillation_advantages(student, teacher, torch.tensor([[1.0, 1.0, 0.0]]), 2.0).tolist()
    [[1.0, -2.0, 0.0]]
    """
    return torch.where(loss_mask.bool(), coef * (teacher_logprobs - student_logprobs), 0.0)


def reverse_kl_per_token(student_logprobs: Tensor, teacher_logprobs: Tensor, loss_mask: Tensor) -> float:
    """The sampled tokens' mean of log p_student - log p_teacher: an unbiased estimate of the
    per-token reverse KL(student || teacher) on the student's own samples (k1).

    >>> import torch
    >>> reverse_kl_per_token(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-0.5, -3.0]]), torch.ones(1, 2))
    0.25
    """
    return float(((student_logprobs - teacher_logprobs) * loss_mask).sum() / loss_mask.sum().clamp(min=1))


def reverse_kl_from_logits(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """KL(student || teacher) over the vocabulary at each position, in float32.   [N, V], [N, V] -> [N]

    A token the student cannot write (logit -inf, p = 0) adds 0, whatever the teacher says.

    >>> import math, torch
    >>> student = torch.tensor([[0.0, 0.0], [0.0, float("-inf")]])
    >>> teacher = torch.tensor([[0.0, math.log(3.0)], [0.0, 5.0]])
    >>> [round(v, 4) for v in reverse_kl_from_logits(student, teacher).tolist()]  # 0.5 log 2 + 0.5 log(2/3); log(1 + e^5)
    [0.1438, 5.0067]
    """
    student = torch.log_softmax(student_logits.float(), dim=-1)  # [N, V]
    teacher = torch.log_softmax(teacher_logits.float(), dim=-1)  # [N, V]
    return torch.where(student.isneginf(), 0.0, student.exp() * (student - teacher)).sum(dim=-1)  # [N]


def forward_kl_from_logits(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """KL(teacher || student) over the vocabulary at each position, in float32.   [N, V], [N, V] -> [N]

    A token the teacher cannot write (logit -inf, p = 0) adds 0, whatever the student says.

    >>> import math, torch
    >>> student = torch.tensor([[0.0, math.log(3.0)], [0.0, 5.0]])
    >>> teacher = torch.tensor([[0.0, 0.0], [0.0, float("-inf")]])
    >>> [round(v, 4) for v in forward_kl_from_logits(student, teacher).tolist()]  # 0.5 log 2 + 0.5 log(2/3); log(1 + e^5)
    [0.1438, 5.0067]
    """
    return reverse_kl_from_logits(teacher_logits, student_logits)


Divergence = Callable[[Tensor, Tensor], Tensor]
"""The divergence of (student logits, teacher logits) at each position.   [N, V], [N, V] -> [N]"""
DIVERGENCES: dict[str, tuple[Divergence, str]] = {
    "full": (reverse_kl_from_logits, "distill/reverse_kl"),
    "forward": (forward_kl_from_logits, "distill/forward_kl"),
}
"""algorithm.teacher_loss -> the divergence over the vocabulary it puts in the loss, and the metric that logs it."""
Head = Callable[[Tensor], Tensor]


def chunked_divergence(
    states: Tensor, head: Head, teacher_states: Tensor, teacher_head: Head, chunk: int, temperature: float = 1.0,
    divergence: Divergence = reverse_kl_from_logits,
) -> Tensor:
    """`divergence` of head(states) and teacher_head(teacher_states) at the sampling
    temperature, `chunk` positions at a time (as `chunked_token_logprobs`: no more than `chunk`
    rows of [V] logits at once, each chunk recomputed in the backward pass). The gradient
    reaches the student's `states` and `head` alone.   [N, H], [N, H'] -> [N]
    """

    def piece(h: Tensor, th: Tensor) -> Tensor:
        with torch.no_grad():
            teacher = at_temperature(teacher_head(th).float(), temperature)  # [c, V]
        return divergence(at_temperature(head(h).float(), temperature), teacher)  # [c]

    values = checkpointed_chunks(piece, chunk, states, teacher_states)
    return torch.cat(values) if values else states.new_zeros(0, dtype=torch.float32)
