"""Training across processes: the rank's share of a step and what the ranks exchange.

`torchrun --nproc-per-node N -m toolpolicy train CONFIG` starts N copies of the trainer.
Each rolls out its share of the step's groups (whole groups, so a group's advantages are
computed on all its episodes), then every rank receives every episode: rewards, advantages,
filters and metrics are computed on the whole step, identically on each rank. Each rank
then runs its share of the kept groups, the loss normalised by the whole step's token and
sequence counts, so that the gradients summed over ranks are the gradient one process takes.
One rank (0) writes the metrics and checkpoints; each rank keeps an audit log of its own
gate's decisions.

How the ranks hold the model is `model.sharing`, chosen once (SHARINGS):

- replicate (`Replicated`, data parallel): every rank holds the whole model, its gradients
  and AdamW's moments. Gradients are summed explicitly after the micro-batches
  (`World.sum_gradients`) rather than through DistributedDataParallel's hooks, because ranks
  may run different numbers of micro-batches.
- shard (`Sharded`, PyTorch's FSDP2 `fully_shard`, per transformer block and then the whole
  model): every rank holds 1/N of each parameter, gradient and moment; each forward and
  backward pass of a block gathers its weights and scatters its summed gradients, so every
  forward and backward is a collective. Every rank therefore runs the same number of
  passes per optimizer step: a rank with fewer micro-batches pads with one-row passes whose
  loss is multiplied by 0 (`Sharded.lockstep`, `trainer/batch.py:padding_passes`). The
  gradient reduction is a sum (FSDP2's default mean is turned off), and norms for clipping
  are taken over the shards (`clip_gradients`). A block's gathered weights are freed after
  its forward pass and gathered again for its backward, or with `model.shard_reshard: false`
  kept from one to the other. The sampler and the checkpoints' model folder need whole
  weights: after each update every unit is gathered once (`Sharded.refresh`) and a plain
  module whose parameters are those gathered tensors samples and is saved, so no second copy
  of the weights exists; the next training pass uses them without gathering again and frees
  them. Optimizer state is saved and loaded in shards (torch.distributed.checkpoint).

With episode sampling streams (`sampling_streams: episode`) an episode's tokens depend only
on its seed, not on which rank ran it, so N processes give the run one process gives with
the same global batch, to float rounding. Gloo on CPU, NCCL on CUDA.
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from toolpolicy.config import ModelSection
from toolpolicy.model.placement import sharded_units
from toolpolicy.trainer.batch import Lockstep, own_count

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

    def most(self, count: int) -> int:
        """The largest `count` any rank has."""
        if self.size == 1:
            return count
        largest = torch.tensor([count])
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return int(largest)

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def close(self) -> None:
        if self.size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradients' global norm to `max_norm` and return the norm before clipping. Over
    sharded gradients (DTensors) torch takes each rank's partial sums of squares and adds them
    across ranks, so the norm is the whole model's, as one process computes it."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


@dataclass(frozen=True)
class Replicated:
    """`model.sharing: replicate`: every rank holds the whole model; gradients are summed after
    the micro-batches; the trained model itself samples and is saved."""

    def place(self, model: torch.nn.Module, world: World) -> torch.nn.Module:
        """Give every rank rank 0's weights; return the model that samples and is saved: `model`."""
        world.broadcast_parameters(model)
        return model

    def place_frozen(self, model: torch.nn.Module, world: World) -> None:
        """A model that only computes (the KL reference): each rank loaded the same one."""

    def logprobs(self, logprobs: Callable[..., Any]) -> Callable[..., Any]:
        return logprobs

    def lockstep(self, world: World) -> Lockstep:
        """Each rank runs its own micro-batches, however many."""
        return own_count

    def reduce_gradients(self, parameters: list[torch.nn.Parameter], world: World) -> None:
        world.sum_gradients(parameters)

    def refresh(self, model: torch.nn.Module, whole: torch.nn.Module) -> None:
        """Nothing to gather: `whole` is `model`."""

    def shards(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Shards | None:
        """None: rank 0's trainer_state.pt holds the optimizer state, the same on every rank."""
        return None


SHARDS = "optimizer_shards"
"""A sharded run's checkpoint folder for its optimizer state (torch.distributed.checkpoint, one file per rank)."""


@dataclass(frozen=True)
class Shards:
    """What each rank of a sharded run writes to a checkpoint and reads back itself: its shards
    of the optimizer state, in folder/SHARDS. Both are collectives. The weights need none: the
    checkpoint's model folder holds them whole, and loading it then sharding gives each rank
    its shards exactly."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def save(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        with as_shards(self.model):
            dcp.save({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}, checkpoint_id=folder / SHARDS)

    def load(self, folder: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        with as_shards(self.model):
            state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}  # the layout to read into
            dcp.load(state, checkpoint_id=folder / SHARDS)
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])


@contextmanager
def as_shards(model: torch.nn.Module) -> Iterator[None]:
    """`model`'s parameters as its shards inside the block (the optimizer's state is named
    after them), every unit gathered before it gathered again after (the sampler's weights,
    `Sharded.refresh`)."""
    gathered = [unit for unit, group in sharded_units(model) if group.is_unsharded]
    for unit in gathered:
        unit.reshard()
    yield
    for unit in gathered:
        unit.unshard()


ROOT_FORWARD = "toolpolicy_forward"
"""The method of a sharded model through which the trainer runs it (see `Sharded.logprobs`)."""


@dataclass(frozen=True)
class Sharded:
    """`model.sharing: shard`: FSDP2 on each transformer block, then on the whole model (the
    embeddings, final norm and output head), every rank holding 1/N of each tensor.
    `offload`: the shards live in CPU memory and are copied to the device a block at a time.
    `reshard`: a block's gathered weights are freed after its forward pass (else kept to its
    backward; `model.shard_reshard`)."""

    offload: bool = False
    reshard: bool = True

    def place(self, model: torch.nn.Module, world: World) -> torch.nn.Module:
        """Shard `model` in place; return the plain module that samples and is saved: `model`'s
        structure, holding no weights until `refresh` gives it the gathered ones."""
        whole = skeleton(model)
        self._shard(model, self.reshard)
        return whole

    def place_frozen(self, model: torch.nn.Module, world: World) -> None:
        """Shard a model that does not train (the KL reference): its blocks free their gathered
        weights after each forward pass, since no backward pass comes to free them."""
        self._shard(model, True)

    def _shard(self, model: torch.nn.Module, reshard: bool) -> None:
        """Shard `model` in place, each block as its own unit, and make its gradient reduction a sum."""
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy, fully_shard, register_fsdp_forward_method

        policy = CPUOffloadPolicy() if self.offload else OffloadPolicy()
        for block in transformer_blocks(model):
            fully_shard(block, offload_policy=policy, reshard_after_forward=reshard)
        fully_shard(model, offload_policy=policy)
        for unit in model.modules():
            if isinstance(unit, FSDPModule):
                unit.set_gradient_divide_factor(1.0)  # the loss is already normalised by the whole step's counts
                unit.set_force_sum_reduction_for_comms(True)  # a plain sum: gloo has no pre-multiplied one
        # The trainer calls the decoder and the output head directly, never the model's forward,
        # so the whole-model unit's gather and gradient hooks are run around the call instead.
        setattr(model, ROOT_FORWARD, _call.__get__(model))
        register_fsdp_forward_method(model, ROOT_FORWARD)

    def logprobs(self, logprobs: Callable[..., Any]) -> Callable[..., Any]:
        """`logprobs(model, batch, ...)` run inside the sharded model's own forward hooks."""

        def through_root(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            return getattr(model, ROOT_FORWARD)(logprobs, model, *args, **kwargs)

        return through_root

    def lockstep(self, world: World) -> Lockstep:
        """Each rank runs as many passes as the rank with the most micro-batches (its own, then
        padding), since each forward and backward pass is a collective."""
        return world.most

    def reduce_gradients(self, parameters: list[torch.nn.Parameter], world: World) -> None:
        """Nothing left to do: the backward pass scattered each block's summed gradient."""

    def refresh(self, model: torch.nn.Module, whole: torch.nn.Module) -> None:
        """Gather every sharded unit (one collective each; a no-op for a unit still gathered)
        and make `whole`'s parameters the gathered tensors themselves: the sampler and the
        checkpoints read the updated weights with no copy made. They stay gathered until the
        next training pass, which uses them as they are and frees each unit after its forward
        pass (after its backward with `shard_reshard: false`); `whole` is only read before that.
        The trainer lists the parameters it optimizes while the model is sharded (a gathered
        unit's parameters are its plain tensors, not the shards the optimizer steps on)."""
        for unit, _ in sharded_units(model):
            unit.unshard()
        for name, _ in whole.named_parameters(remove_duplicate=False):
            owner, _, field = name.rpartition(".")
            setattr(whole.get_submodule(owner), field, model.get_parameter(name))  # the gathered tensor, not a DTensor shard

    def shards(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Shards:
        return Shards(model, optimizer)


def skeleton(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose parameters hold no memory (on the meta device, tied ones still
    tied; buffers copied), to be given real parameters afterwards."""
    memo: dict[int, Any] = {id(p): torch.nn.Parameter(p.detach().to("meta"), requires_grad=False) for p in model.parameters()}
    return copy.deepcopy(model, memo)


def _call(model: torch.nn.Module, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated decoder layers of a Hugging Face causal LM (a peft model's too): the
    modules named in its `_no_split_modules`, the classes transformers keeps whole."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(core, "_no_split_modules", None) or ())
    blocks = [m for m in core.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(core).__name__} names no transformer block class (_no_split_modules) to shard by")
    return blocks


SHARINGS: dict[str, Callable[[ModelSection], Replicated | Sharded]] = {
    "replicate": lambda model: Replicated(),
    "shard": lambda model: Sharded(model.shard_offload, model.shard_reshard),
}


def sharing_of(model: ModelSection, world: World) -> Replicated | Sharded:
    """How this run's processes hold the model: `model.sharing` under torchrun; one process has
    nothing to share, so it replicates whatever the config says."""
    return SHARINGS[model.sharing if world.size > 1 else "replicate"](model)
