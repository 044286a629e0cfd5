"""Where a policy runs and in what precision: device, compute dtype, gradient checkpointing.

One code path for every device. The model is moved to the device once; its forward is
wrapped in autocast once (bfloat16 or float16 compute, float32 master weights), so the
sampler and the trainer run the same kernels in the same precision and no loop ever
asks which device it is on. Batches follow the model's device where they are built.
`dtype: auto` is bfloat16 where the hardware computes in it (`auto_dtype`), else float32.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs with bfloat16 arithmetic (AVX512-BF16, AMX); without them
a CPU emulates bfloat16 matrix products, many times slower than float32."""


@dataclass(frozen=True)
class Placement:
    """The config's device, dtype and gradient_checkpointing fields."""

    device: str = "auto"
    """auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."""
    dtype: Dtype | Literal["auto"] = "float32"
    """Compute precision of every forward pass; trainable weights stay float32. auto: see `auto_dtype`."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""


class DeviceUnavailable(ValueError):
    """The configured device is not on this machine; the message says what to set instead."""


def resolve_device(name: str) -> torch.device:
    """The torch device `name` asks for; auto picks the first accelerator there is."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"device {name!r}: this machine has no CUDA device; use device: auto or cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailable(f"device {name!r}: MPS is not available here; use device: auto or cpu")
    return device


def auto_dtype(device_type: str, cpu_flags: Collection[str], cuda_bf16: bool = False) -> Dtype:
    """The compute dtype `auto` means: bfloat16 on a CPU with bfloat16 instructions (one of
    BF16_CPU_FLAGS) or a CUDA GPU that supports it (`cuda_bf16`), else float32 (MPS included)."""
    if device_type == "cpu":
        return "bfloat16" if any(flag in cpu_flags for flag in BF16_CPU_FLAGS) else "float32"
    if device_type == "cuda":
        return "bfloat16" if cuda_bf16 else "float32"
    return "float32"


def cpu_model_and_flags(cpuinfo: str) -> tuple[str, frozenset[str]]:
    """The first processor's model name and flags in the text of /proc/cpuinfo ("", {} when absent)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields.get("model name", ""), frozenset(fields.get("flags", "").split())


def this_cpu() -> tuple[str, frozenset[str]]:
    """This machine's CPU model and flags (Linux); elsewhere the platform's processor name and no flags."""
    try:
        return cpu_model_and_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        import platform

        return platform.processor(), frozenset()


def resolve_dtype(name: str, device: torch.device) -> Dtype:
    """The config's dtype with `auto` decided for `device` on this machine."""
    if name != "auto":
        return name  # type: ignore[return-value]
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return auto_dtype(device.type, this_cpu()[1] if device.type == "cpu" else (), cuda_bf16)


def place(model: torch.nn.Module, placement: Placement) -> torch.nn.Module:
    """Move `model` to its device and run its forward in the compute dtype (autocast)."""
    device = resolve_device(placement.device)
    model.to(device)
    in_compute_dtype(model, DTYPES[resolve_dtype(placement.dtype, device)])
    if placement.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 renamed it
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model


class InAutocast:
    """A module's forward run under autocast, set as its `forward`. Unlike torch.autocast used
    as a decorator (a closure over the bound method, which `copy.deepcopy` shares), it holds
    the bound method as an attribute, so a deep copy of the module runs its own weights:
    deepcopy rebinds the method to the copied module. `__wrapped__` lets `inspect.signature`
    read the forward's own parameters."""

    def __init__(self, forward: Any, device_type: str, dtype: torch.dtype) -> None:
        self.__wrapped__ = forward
        self.device_type = device_type
        self.dtype = dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=self.device_type, dtype=self.dtype):
            return self.__wrapped__(*args, **kwargs)


def in_compute_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Run `model`'s entry points (`entry_points`) under autocast to `dtype`, those not yet.
    The trainer calls the decoder and the output head directly (logits a chunk at a time):
    they run in the same precision as the whole model's forward."""
    if dtype == torch.float32:
        return
    device_type = device_of(model).type
    for part in entry_points(model):
        if not isinstance(part.forward, InAutocast):
            part.forward = InAutocast(part.forward, device_type, dtype)


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype `model`'s forward computes in: its autocast's, else its first weight's."""
    return model.forward.dtype if isinstance(model.forward, InAutocast) else next(model.parameters()).dtype


def linear_weights_in(model: torch.nn.Module, dtype: torch.dtype) -> int:
    """For a model that only samples: store each linear layer's weight and bias in the compute
    dtype, the very values autocast would cast them to on every forward, so the products are
    the same without casting every weight at every decoded token. An output head tied to the
    input embeddings gets a weight of its own in `dtype` (the embedding lookup keeps reading
    the shared float32 one uncast): for SmolLM2-135M the head is 28M of the 135M parameters, and
    casting it took a third of a bfloat16 decode step. Returns the number of parameters stored
    in `dtype`."""
    if dtype == torch.float32:
        return 0
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    shared = {id(p) for p in embeddings.parameters()} if embeddings is not None else set()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    stored = 0
    if head is not None and id(head.weight) in shared and head.weight.dtype == torch.float32:
        head.weight = torch.nn.Parameter(head.weight.detach().to(dtype), requires_grad=False)
        stored += head.weight.numel()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            for parameter in (module.weight, module.bias):
                if parameter is not None and id(parameter) not in shared and parameter.dtype == torch.float32:
                    parameter.requires_grad_(False)
                    parameter.data = parameter.data.to(dtype)
                    stored += parameter.numel()
    return stored


def entry_points(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose forward is called from outside: the model, its decoder stack
    (`base_model`) and its output head, each once."""
    parts = [model, getattr(model, "base_model", model)]
    if hasattr(model, "get_output_embeddings") and model.get_output_embeddings() is not None:
        parts.append(model.get_output_embeddings())
    return list({id(part): part for part in parts}.values())


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: allocated on a CUDA device, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this process holds of `tensor`: the whole of it, or its shard of a sharded one (DTensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def held_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The model's parameters as this process keeps them: under FSDP2 each unit's shards
    (DTensors), also while the unit is gathered for the sampler
    (`trainer/distributed.py:Sharded.refresh`); else the parameters themselves."""
    units = sharded_units(model)
    if not units:
        return list(model.parameters())
    return [param.sharded_param for _, group in units for param in group.fsdp_params]


def sharded_units(model: torch.nn.Module) -> list[tuple[torch.nn.Module, Any]]:
    """`model`'s FSDP2 units that hold parameters, each with its parameter group (its shards,
    and `is_unsharded` while gathered); none when the model is not sharded."""
    from torch.distributed.fsdp import FSDPModule

    units = [(unit, unit._get_fsdp_state()._fsdp_param_group) for unit in model.modules() if isinstance(unit, FSDPModule)]
    return [(unit, group) for unit, group in units if group is not None]


def memory_metrics(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """What a training step holds in this process: peak memory, optimizer state, the model's
    state (parameters, gradients and optimizer state: this process's shards under sharding)
    and the trainable parameters (the whole model's count)."""
    state = sum(local_bytes(t) for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    weights = sum(local_bytes(p) + (local_bytes(p.grad) if p.grad is not None else 0) for p in held_parameters(model))
    return {
        "memory/peak_mb": peak_memory_mb(device_of(model)),
        "memory/optimizer_mb": state / 2**20,
        "memory/model_state_mb": (weights + state) / 2**20,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
