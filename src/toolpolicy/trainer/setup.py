"""What every phase builds first: the environment, the template, the engine, the run folder."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from toolpolicy.envs import Env, make_env
from toolpolicy.envs.calc import ExpertStyle
from toolpolicy.gate import AuditLog, Gate, Policy
from toolpolicy.model import codec, make_template, pad_id, stop_ids
from toolpolicy.model.embedded import ModelShape, save_embedded
from toolpolicy.rollout import Backend, HFBackend, Limits, RolloutEngine, ScriptedBackend, Trajectory, allow_all_policy
from toolpolicy.trainer.config import Config, save_config


def limits(cfg: Config) -> Limits:
    return Limits(max_turns=cfg.max_turns, max_tokens=cfg.max_tokens, max_turn_tokens=cfg.max_turn_tokens)


def expert_style(cfg: Config) -> ExpertStyle:
    return ExpertStyle(cfg.expert_tool_on_hard, cfg.expert_tool_on_easy, cfg.expert_malformed)


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
    env = make_env(cfg.env)
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


def make_gate(cfg: Config, env: Env) -> Gate | None:
    """The gate of `cfg.policy` (allow-all without one), logging to RUN_DIR/audit.jsonl if
    `cfg.audit`; None when neither is set, for the engine's own allow-all gate."""
    if not cfg.policy and not cfg.audit:
        return None
    policy = Policy.load(cfg.policy) if cfg.policy else allow_all_policy()
    audit = AuditLog(Path(cfg.run_dir) / "audit.jsonl", durable=False) if cfg.audit else None
    return Gate(policy, env.tools, audit=audit)


def make_engine(cfg: Config, policy: PolicyModel, generator: torch.Generator) -> RolloutEngine:
    env = make_env(cfg.env)
    template = make_template(cfg.compact_tools_prompt)
    backend = policy.backend(generator, cfg.temperature)
    return RolloutEngine(env, template, policy.encode, policy.decode, backend, limits(cfg), make_gate(cfg, env))
