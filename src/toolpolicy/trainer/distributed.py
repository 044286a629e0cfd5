"""Training across processes: the rank's share of a step and what the ranks exchange.

`torchrun --nproc-per-node N -m toolpolicy train CONFIG` starts N copies of the trainer.
Each rolls out its share of the step's groups (whole groups, so a group's advantages are
computed on all its episodes), then every rank receives every episode: rewards, advantages,
filters and metrics are computed on the whole step, identically on each rank. The update
is data parallel: each rank runs its share of the kept groups, the loss normalised by the
whole step's token and sequence counts, and the gradients are summed across ranks before
the optimizer step, which every rank takes on the same gradient. One rank (0) writes the
metrics and checkpoints; each rank keeps an audit log of its own gate's decisions.

With episode sampling streams (`sampling_streams: episode`) an episode's tokens depend only
on its seed, not on which rank ran it, so N processes give the run one process gives with
the same global batch, to float rounding. Gloo on CPU, NCCL on CUDA. Gradients are summed
explicitly after the micro-batches rather than through DistributedDataParallel's hooks,
because ranks may run different numbers of micro-batches.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the trainer's processes (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """The rank that writes the run's metrics and checkpoints."""
        return self.rank == 0

    @staticmethod
    def requested() -> int:
        """The number of processes torchrun started (WORLD_SIZE), 1 without torchrun."""
        return int(os.environ.get("WORLD_SIZE", "1"))

    @classmethod
    def from_environment(cls, device: torch.device) -> World:
        """The world torchrun describes in RANK / WORLD_SIZE (joined here), or one process."""
        size = cls.requested()
        if size <= 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    def share(self, count: int) -> range:
        """This rank's contiguous share of `count` items (groups); shares differ by at most one."""
        base, extra = divmod(count, self.size)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + (self.rank < extra))

    def gather(self, items: list[T]) -> list[T]:
        """Every rank's `items`, concatenated in rank order (each rank gets the whole list)."""
        if self.size == 1:
            return items
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, items)
        return [item for part in parts for item in part]

    def sum_counts(self, counts: Counter[str]) -> Counter[str]:
        """Every rank's counts, added up (ranks may count different kinds)."""
        return sum(self.gather([counts]), Counter())

    def sum_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Sum the parameters' gradients over ranks, in place (a rank without any gets zeros)."""
        if self.size == 1:
            return
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in parameters])  # one collective, not one per tensor
        dist.all_reduce(flat)
        offset = 0
        for p in parameters:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def reduce_stats(self, stats: dict[str, float], maxima: tuple[str, ...]) -> dict[str, float]:
        """Sum each rank's partial `stats` (they are sums over its tokens, already divided by the
        step's totals), taking the maximum of the keys in `maxima`. Every rank must pass the same keys."""
        if self.size == 1:
            return stats
        keys = sorted(stats)
        summed = torch.tensor([stats[k] if k not in maxima else 0.0 for k in keys], dtype=torch.float64)
        largest = torch.tensor([stats[k] if k in maxima else float("-inf") for k in keys], dtype=torch.float64)
        dist.all_reduce(summed)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return {k: float(largest[i] if k in maxima else summed[i]) for i, k in enumerate(keys)}

    def broadcast_parameters(self, model: torch.nn.Module) -> None:
        """Give every rank rank 0's weights (the ranks loaded the same checkpoint; this makes sure)."""
        if self.size == 1:
            return
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, 0)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def close(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()
