"""What every command builds from a config: the run folder, the environment, its gate, the Rubric and the engine.

Each function takes the Config and returns one part, so the trainer, evaluation and
the demo assemble the same parts the same way; the parts themselves (envs/, gate/,
rollout/) know nothing of the Config.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from toolpolicy.config import Config, ConfigError, save_config
from toolpolicy.envs import Env, hotel, make_env, user_factory
from toolpolicy.gate import AuditLog, Gate, Policy
from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.model.adapters import LoraSettings, attach_lora, is_adapter, merged, store_frozen_in
from toolpolicy.model.gguf import local_checkpoint
from toolpolicy.model.placement import DTYPES, Placement, linear_weights_in, resolve_device, resolve_dtype
from toolpolicy.rewards import Rubric, overlong
from toolpolicy.rollout import Backend, HFBackend, Limits, RolloutEngine, allow_all_policy
from toolpolicy.rollout.chat_endpoint import ChatClient, Endpoint, EndpointUser
from toolpolicy.rollout.vllm_engine import VLLMBackend, VLLMSettings, VLLMUnavailable, adapter_rank, checkpoint_of
from toolpolicy.rollout.vllm_server import EndpointBackend, RolloutServerError


def prepare_run_dir(cfg: Config) -> Path:
    """Create the run folder, write the resolved config into it and set torch's threads."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return run_dir


def episode_limits(cfg: Config) -> Limits:
    return Limits(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens, max_turn_tokens=cfg.max_turn_tokens)


def build_env(cfg: Config) -> Env:
    """The environment `cfg.env`, with the user simulator `cfg.user` when one is named;
    hotel's guest is played by the served model at `user_endpoint_url` when one is set,
    else by the scripted user."""
    if cfg.env == "hotel" and cfg.user_endpoint_url:
        endpoint = Endpoint(
            cfg.user_endpoint_url, cfg.user_endpoint_model, cfg.endpoint_api_key_env, temperature=cfg.user_temperature
        )
        client = ChatClient(endpoint)
        return hotel.HotelEnv(user=lambda task: EndpointUser(client, hotel.scenario_text(task)))
    if cfg.env == "agentdojo":
        return make_env(cfg.env, suite=cfg.suite, attack=cfg.attack)
    if cfg.env == "bfcl":
        chosen = {"categories": tuple(cfg.bfcl_categories)} if cfg.bfcl_categories else {}
        return make_env(cfg.env, composed=cfg.bfcl_composed, **chosen)
    if cfg.user:
        return make_env(cfg.env, user=user_factory(cfg.user))
    return make_env(cfg.env)


def policy_path(cfg: Config, env: Env) -> str:
    """The policy file the gate enforces: `cfg.policy`, else the environment's own, else none ("")."""
    return cfg.policy or str(getattr(env, "policy_file", ""))


def build_gate(cfg: Config, env: Env, enforce: bool = True, audit_file: str = "audit.jsonl") -> Gate | None:
    """The gate of `cfg.policy`, or of the environment's own policy file (`env.policy_file`,
    e.g. hotel's), or allow-all; logging to RUN_DIR/`audit_file` if `cfg.audit`. None when
    there is neither a policy nor an audit log, for the engine's own allow-all gate.
    enforce=False is shadow mode: violations are counted, not prevented."""
    path = policy_path(cfg, env)
    if not path and not cfg.audit:
        return None
    policy = Policy.load(path) if path else allow_all_policy()
    audit = AuditLog(Path(cfg.run_dir) / audit_file, durable=False) if cfg.audit else None
    return Gate(policy, env.tools, audit=audit, enforce=enforce)


def build_rubric(cfg: Config, default_rewards: dict[str, float]) -> Rubric:
    """The config's reward weights (or the environment's `default_rewards`), plus DAPO's
    overlong penalty as the term `overlong` when `overlong_penalty` is set: the one Rubric
    that training optimises and evaluation reports."""
    rubric = Rubric.from_weights(cfg.rewards or default_rewards)
    if cfg.overlong_penalty == 0:
        return rubric
    length = cfg.overlong_length or cfg.max_tokens
    return rubric.with_term("overlong", overlong(length, int(cfg.overlong_buffer * length)), cfg.overlong_penalty)


def chat_choice(cfg: Config) -> ChatChoice:
    """How the policy's chat format is read: the config's chat_* fields."""
    return ChatChoice(cfg.chat_format, cfg.chat_template, cfg.chat_template_kwargs, cfg.chat_tools)


def placement(cfg: Config) -> Placement:
    """The config's device, precision (`dtype: auto` decided for that device) and checkpointing."""
    return Placement(cfg.device, resolve_dtype(cfg.dtype, resolve_device(cfg.device)), cfg.gradient_checkpointing)


def load_policy_model(cfg: Config, path: str | Path) -> PolicyModel:
    """The checkpoint at `path` in the chat format, on the device and in the precision the
    config asks for (a device the machine lacks is DeviceUnavailable)."""
    return PolicyModel.load(path, chat_choice(cfg), placement(cfg))


def inference_policy(cfg: Config, path: str | Path) -> PolicyModel:
    """The checkpoint at `path` for sampling only (evaluation): as `load_policy_model`, a LoRA
    adapter folded into its base (one product a projection instead of three; a vLLM engine
    then takes the folded weights), the linear weights stored in the compute dtype
    (`linear_weights_in`)."""
    policy = load_policy_model(cfg, path)
    policy.model = merged(policy.model)
    policy.model.requires_grad_(False)
    linear_weights_in(policy.model, DTYPES[placement(cfg).dtype])
    return policy


def trainable_policy(cfg: Config, path: str | Path, phase_dir: Path, resuming: bool) -> PolicyModel:
    """The policy a training phase updates. Without LoRA: the checkpoint at `path`. With
    LoRA: a resumed adapter as saved; else a fresh adapter on `path`, where an adapter
    `path` (RL from LoRA SFT) is first merged into its base and saved as PHASE_DIR/base,
    the new adapter's base and its KL reference. The frozen base is kept in `dtype`."""
    policy = load_policy_model(cfg, path)
    if not cfg.lora_rank or resuming:
        return policy
    base = local_checkpoint(path)  # the adapter names a folder, never a GGUF file
    if is_adapter(path):
        base = phase_dir / "base"
        merged(policy.model).save_pretrained(base)
        policy.tokenizer.save_pretrained(base)
        policy = load_policy_model(cfg, base)
    settings = LoraSettings(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, tuple(cfg.lora_target_modules))
    policy.model = attach_lora(policy.model, settings, base)
    store_frozen_in(policy.model, DTYPES[placement(cfg).dtype])
    return policy


def hf_backend(cfg: Config, policy: PolicyModel, generator: torch.Generator, temperature: float) -> HFBackend:
    """Sampling from the local model at `temperature`, with its stop and pad ids, its KV cache within `sampler_cache_gib`."""
    return HFBackend(policy.model, policy.stop_ids, policy.pad_id, generator, temperature, cache_bytes=int(cfg.sampler_cache_gib * 2**30))


def vllm_backend(cfg: Config, policy: PolicyModel, seed: int, temperature: float) -> VLLMBackend:
    """A vLLM engine on the folder `policy` was loaded from (a LoRA policy: its base, given
    the adapter folded in, or serving it with vllm_lora_sync: adapter), synced once to the policy's current weights, which may have moved since."""
    settings = VLLMSettings(placement(cfg).dtype, cfg.vllm_kv_cache_gib, cfg.vllm_block_size, cfg.vllm_threads or cfg.threads or 1, seed, cfg.vllm_lora_sync)
    try:
        backend = VLLMBackend(checkpoint_of(policy.model), policy.stop_ids, temperature, settings, adapter_rank(policy.model))
    except VLLMUnavailable as error:
        raise ConfigError(f"field 'backend': {error}") from None
    backend.sync(policy.model)
    return backend


def endpoint_backend(cfg: Config, policy: PolicyModel, temperature: float) -> EndpointBackend:
    """The rollout server at `cfg.rollout_url`, synced once to the policy's current weights."""
    try:
        backend = EndpointBackend(cfg.rollout_url, policy.stop_ids, temperature, os.environ.get(cfg.rollout_api_key_env))
        backend.sync(policy.model)
    except RolloutServerError as error:
        raise ConfigError(f"field 'rollout_url': {error}") from None
    return backend


def build_backend(cfg: Config, policy: PolicyModel, generator: torch.Generator, temperature: float) -> Backend:
    """The config's backend: hf samples from `policy.model` itself with `generator`; vllm from
    an engine of its own, seeded with the generator's seed; endpoint from a rollout server."""
    if cfg.backend == "vllm":
        return vllm_backend(cfg, policy, generator.initial_seed(), temperature)
    if cfg.backend == "endpoint":
        return endpoint_backend(cfg, policy, temperature)
    return hf_backend(cfg, policy, generator, temperature)


def build_engine(
    cfg: Config, policy: PolicyModel, generator: torch.Generator, temperature: float, enforce: bool = True,
    audit_file: str = "audit.jsonl",
) -> RolloutEngine:
    """The rollout engine of `cfg.env` sampling from `policy` at `temperature` (RL's
    `temperature` or evaluation's `eval_temperature`), through the config's gate and backend
    (its audit log RUN_DIR/`audit_file`: one per process)."""
    env = build_env(cfg)
    backend = build_backend(cfg, policy, generator, temperature)
    gate = build_gate(cfg, env, enforce, audit_file)
    return RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, episode_limits(cfg), gate, cfg.tool_workers)
