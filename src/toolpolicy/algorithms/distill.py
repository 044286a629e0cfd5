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
"""

from __future__ import annotations

import torch
from torch import Tensor


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
