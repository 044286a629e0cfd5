"""LoRA adapters (peft): attach, load, the base model as the KL reference, merge.

With `lora_rank > 0` only the adapter trains. The frozen base is stored in the compute
dtype, checkpoints hold the adapter alone (adapter_config.json names its base folder),
and the KL reference is the same model with the adapter switched off, so there is no
second copy of the weights. RL from an SFT adapter merges it into its base first (the
merged model is RL's base and its reference) and trains a fresh adapter on top.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class LoraSettings:
    """The config's lora_* fields (their defaults live there)."""

    rank: int
    alpha: int
    dropout: float
    targets: tuple[str, ...]


def is_adapter(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_config(folder: str | Path) -> dict[str, Any]:
    """An adapter checkpoint's adapter_config.json: its base, rank, alpha and target modules."""
    return json.loads((Path(folder) / ADAPTER_CONFIG).read_text())


def adapter_base(folder: str | Path) -> Path:
    """The base model folder an adapter checkpoint was trained on."""
    return Path(adapter_config(folder)["base_model_name_or_path"])


def attach_lora(model: torch.nn.Module, settings: LoraSettings, base: str | Path) -> torch.nn.Module:
    """`model` frozen, with a fresh trainable LoRA adapter whose config names `base`."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.targets),
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(Path(base).resolve()),
    )
    return get_peft_model(model, config)


def load_adapter(base_model: torch.nn.Module, folder: str | Path) -> torch.nn.Module:
    """The trainable adapter saved in `folder`, on `base_model`."""
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model, str(folder), is_trainable=True)


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """A plain transformers model with the adapter folded into its weights."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def merged_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights `merged(model)` would have, under its base model's names, without
    changing `model`: each adapted layer's weight plus its LoRA delta (B A scaled by
    alpha / r). A plain model's own state dict."""
    if not hasattr(model, "get_base_model"):
        return model.state_dict()
    core = model.get_base_model()
    adapter = model.active_adapter
    deltas = {
        f"{name}.weight": module.get_delta_weight(adapter)
        for name, module in core.named_modules()
        if hasattr(module, "base_layer") and adapter in getattr(module, "lora_A", {})
    }
    out = {}
    with torch.no_grad():
        for name, tensor in core.state_dict().items():
            if ".lora_" in name:
                continue
            name = name.replace(".base_layer.", ".")
            out[name] = (tensor + deltas[name].float()).to(tensor.dtype) if name in deltas else tensor  # one rounding
    return out


def reference_mode(model: torch.nn.Module) -> Any:
    """A context in which `model` is its KL reference: the adapter off (a LoRA model)."""
    return model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()


def store_frozen_in(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Keep the frozen base weights in `dtype` (half the memory in bfloat16); the
    trainable adapter stays float32."""
    for parameter in model.parameters():
        if not parameter.requires_grad:
            parameter.data = parameter.data.to(dtype)
