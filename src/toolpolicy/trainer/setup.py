"""What every phase builds first: the environment, the template, the engine, the run folder."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import torch

from toolpolicy.envs import Env, make_env
from toolpolicy.envs import calc, hotel
from toolpolicy.gate import AuditLog, Gate, Policy
from toolpolicy.model import codec, make_template, pad_id, stop_ids
from toolpolicy.model.embedded import ModelShape, save_embedded
from toolpolicy.rollout import Backend, HFBackend, Limits, RolloutEngine, ScriptedBackend, Trajectory, allow_all_policy
from toolpolicy.rollout.chat_endpoint import ChatClient, Endpoint, EndpointUser
from toolpolicy.trainer.config import Config, ConfigError, save_config


def limits(cfg: Config) -> Limits:
    return Limits(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens, max_turn_tokens=cfg.max_turn_tokens)


# How each environment's imperfect demonstrator is set from the config.
EXPERT_STYLES: dict[str, Callable[[Config], Any]] = {
    "calc": lambda cfg: calc.ExpertStyle(cfg.expert_tool_on_hard, cfg.expert_tool_on_easy, cfg.expert_malformed),
    "hotel": lambda cfg: hotel.ExpertStyle(cfg.expert_violation, cfg.expert_guess, cfg.expert_slip),
}


def build_env(cfg: Config) -> Env:
    """The environment `cfg.env`; hotel's guest is played by the served model at
    `user_endpoint_url` when one is set, else by the scripted user."""
    if cfg.env == "hotel" and cfg.user_endpoint_url:
        endpoint = Endpoint(
            cfg.user_endpoint_url, cfg.user_endpoint_model, cfg.endpoint_api_key_env, temperature=cfg.temperature
        )
        client = ChatClient(endpoint)
        return hotel.HotelEnv(user=lambda task: EndpointUser(client, hotel.scenario_text(task)))
    return make_env(cfg.env)


def expert_style(cfg: Config) -> Any:
    if cfg.env not in EXPERT_STYLES:
        raise ConfigError(f"environment {cfg.env!r} has no demonstrator for SFT (known: {', '.join(EXPERT_STYLES)})")
    return EXPERT_STYLES[cfg.env](cfg)


def prepare_run_dir(cfg: Config) -> Path:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return run_dir


def demonstrations(cfg: Config, n: int, encode, decode, seed_tag: str) -> list[Trajectory]:
    """Expert episodes replayed through the real engine: tool results come from running
    the calls, tokens from the template's fragments, the mask from the engine."""
    env = build_env(cfg)
    template = make_template(cfg.compact_tools_prompt)
    tasks = env.tasks("train", n, seed=cfg.seed)
    rng = random.Random(f"expert/{seed_tag}/{cfg.seed}")
    style = expert_style(cfg)
    scripts = {i: env.expert_turns(task, rng, style) for i, task in enumerate(tasks)}
    backend = ScriptedBackend(scripts, template.render_assistant, encode)
    engine = RolloutEngine(env, template, encode, decode, backend, limits(cfg))
    return engine.run(tasks)


def char_codec():
    """Characters as ids: replaying demonstrations with it yields their exact text."""
    return (lambda text: [ord(c) for c in text]), (lambda ids: "".join(map(chr, ids)))


def build_embedded(cfg: Config, out_dir: Path) -> Path:
    """Train the tokenizer on demonstration text and save a fresh tiny Qwen2 to `out_dir`."""
    encode, decode = char_codec()
    texts = [decode(t.token_ids) for t in demonstrations(cfg, cfg.tokenizer_texts, encode, decode, "tokenizer")]
    shape = ModelShape(cfg.vocab_size, cfg.hidden_size, cfg.layers, cfg.heads, cfg.kv_heads, cfg.intermediate_size)
    return save_embedded(out_dir, texts, make_template(cfg.compact_tools_prompt), shape, cfg.seed)


@dataclass
class PolicyModel:
    """A model with what the engine needs around it."""

    model: torch.nn.Module
    tokenizer: object
    encode: object
    decode: object

    @property
    def pad_id(self) -> int:
        return pad_id(self.tokenizer)

    def backend(self, generator: torch.Generator, temperature: float) -> Backend:
        return HFBackend(self.model, stop_ids(self.tokenizer), self.pad_id, generator, temperature)


def wrap_policy(model, tokenizer) -> PolicyModel:
    encode, decode = codec(tokenizer)
    return PolicyModel(model, tokenizer, encode, decode)


def policy_path(cfg: Config, env: Env) -> str:
    """The policy file the gate enforces: `cfg.policy`, else the environment's own, else none ("")."""
    return cfg.policy or str(getattr(env, "policy_file", ""))


def make_gate(cfg: Config, env: Env, enforce: bool = True) -> Gate | None:
    """The gate of `cfg.policy`, or of the environment's own policy file (`env.policy_file`,
    e.g. hotel's), or allow-all; logging to RUN_DIR/audit.jsonl if `cfg.audit`. None when
    there is neither a policy nor an audit log, for the engine's own allow-all gate.
    enforce=False is shadow mode: violations are counted, not prevented."""
    path = policy_path(cfg, env)
    if not path and not cfg.audit:
        return None
    policy = Policy.load(path) if path else allow_all_policy()
    audit = AuditLog(Path(cfg.run_dir) / "audit.jsonl", durable=False) if cfg.audit else None
    return Gate(policy, env.tools, audit=audit, enforce=enforce)


def make_engine(cfg: Config, policy: PolicyModel, generator: torch.Generator, enforce: bool = True) -> RolloutEngine:
    env = build_env(cfg)
    template = make_template(cfg.compact_tools_prompt)
    backend = policy.backend(generator, cfg.temperature)
    gate = make_gate(cfg, env, enforce)
    return RolloutEngine(env, template, policy.encode, policy.decode, backend, limits(cfg), gate)
