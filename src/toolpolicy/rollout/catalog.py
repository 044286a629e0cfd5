"""The backends a config can name (section `backend`), one row each: its settings section, the
class that samples (which declares its `Capabilities`) and the function that builds it.

The trainer and the config checks read a backend's capabilities through `capabilities_of`,
never its name; adding a backend is its settings section in toolpolicy.config, its class in
its own module, and one row here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

import torch

from toolpolicy.config import BackendSettings, ConfigError, HfSection, ModelSection, ServerSection, VllmSection
from toolpolicy.model import PolicyModel
from toolpolicy.model.placement import resolve_dtype, resolve_device
from toolpolicy.rollout.backends import Backend, Capabilities, FoldedHFBackend, HFBackend
from toolpolicy.rollout.vllm_engine import VLLMBackend, VLLMSettings, VLLMUnavailable, adapter_rank, checkpoint_of
from toolpolicy.rollout.vllm_server import EndpointBackend, RolloutServerError

Build = Callable[[BackendSettings, ModelSection, int, PolicyModel, torch.Generator, float], Backend]


@dataclass(frozen=True)
class BackendKind:
    """One row: the class that samples for a section (its `capabilities`) and its constructor."""

    sampler: Callable[[Any], type]
    build: Build


def hf_sampler(section: HfSection) -> type[HFBackend]:
    """The model itself samples, or with `fold` a copy of it made for sampling."""
    return FoldedHFBackend if section.fold else HFBackend


def build_hf(section: HfSection, model: ModelSection, threads: int, policy: PolicyModel, generator: torch.Generator, temperature: float) -> Backend:
    """Sampling from `policy.model` itself (or with `fold`, from a copy made for sampling) with
    `generator`, its KV cache within `cache_gib`."""
    return hf_sampler(section)(
        policy.model, policy.stop_ids, policy.pad_id, generator, temperature, cache_bytes=int(section.cache_gib * 2**30),
        vision=policy.vision,
    )


def build_vllm(section: VllmSection, model: ModelSection, threads: int, policy: PolicyModel, generator: torch.Generator, temperature: float) -> Backend:
    """An engine of its own on the folder `policy` was loaded from (a LoRA policy: its base,
    given the adapter folded in), seeded with the generator's seed, synced once to the
    policy's current weights."""
    dtype = resolve_dtype(model.dtype, resolve_device(model.device))
    settings = VLLMSettings(dtype, section.kv_cache_gib, section.block_size, section.threads or threads or 1, generator.initial_seed(), section.lora_sync)
    try:
        sampler = VLLMBackend(checkpoint_of(policy.model), policy.stop_ids, temperature, settings, adapter_rank(policy.model))
    except VLLMUnavailable as error:
        raise ConfigError(f"field 'backend.name': {error}") from None
    sampler.sync(policy.model)
    return sampler


def build_server(section: ServerSection, model: ModelSection, threads: int, policy: PolicyModel, generator: torch.Generator, temperature: float) -> Backend:
    """A rollout server at `section.url`, synced once to the policy's current weights."""
    try:
        sampler = EndpointBackend(section.url, policy.stop_ids, temperature, os.environ.get(section.api_key_env))
        sampler.sync(policy.model)
    except RolloutServerError as error:
        raise ConfigError(f"field 'backend.url': {error}") from None
    return sampler


BACKENDS: dict[type[BackendSettings], BackendKind] = {
    HfSection: BackendKind(hf_sampler, build_hf),
    VllmSection: BackendKind(lambda section: VLLMBackend, build_vllm),
    ServerSection: BackendKind(lambda section: EndpointBackend, build_server),
}
"""Every backend section of the config, with what samples for it."""


def capabilities_of(section: BackendSettings) -> Capabilities:
    """What the configured backend can do."""
    return BACKENDS[type(section)].sampler(section).capabilities


def build_backend(
    section: BackendSettings, model: ModelSection, threads: int, policy: PolicyModel, generator: torch.Generator, temperature: float,
) -> Backend:
    """The configured backend, sampling the policy's turns at `temperature`."""
    return BACKENDS[type(section)].build(section, model, threads, policy, generator, temperature)
