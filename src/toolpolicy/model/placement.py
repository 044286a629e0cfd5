"""Where a policy runs and in what precision: device, compute dtype, gradient checkpointing.

One code path for every device. The model is moved to the device once; its forward is
wrapped in autocast once (bfloat16 or float16 compute, float32 master weights), so the
sampler and the trainer run the same kernels in the same precision and no loop ever
asks which device it is on. Batches follow the model's device where they are built.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Literal

import torch

Dtype = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Placement:
    """The config's device, dtype and gradient_checkpointing fields."""

    device: str = "auto"
    """auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps."""
    dtype: Dtype = "float32"
    """Compute precision of every forward pass; trainable weights stay float32."""
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


def place(model: torch.nn.Module, placement: Placement) -> torch.nn.Module:
    """Move `model` to its device and run its forward in the compute dtype (autocast)."""
    device = resolve_device(placement.device)
    model.to(device)
    dtype = DTYPES[placement.dtype]
    if dtype != torch.float32:
        model.forward = torch.autocast(device_type=device.type, dtype=dtype)(model.forward)
    if placement.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5 renamed it
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory so far: allocated on a CUDA device, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def memory_metrics(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """What a training step holds: peak memory, trainable parameters, optimizer state."""
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    return {
        "memory/peak_mb": peak_memory_mb(device_of(model)),
        "memory/optimizer_mb": state / 2**20,
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
