"""SFT data: an environment's imperfect demonstrator, replayed through the real engine,
and the embedded model built from the text of its demonstrations."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolpolicy.build import build_env, episode_limits
from toolpolicy.chat import ChatTemplate
from toolpolicy.config import Config, ConfigError
from toolpolicy.envs import calc, hotel
from toolpolicy.model import char_codec, make_template
from toolpolicy.model.embedded import ModelShape, save_embedded
from toolpolicy.rollout import RolloutEngine, ScriptedBackend, Trajectory

# How each environment's imperfect demonstrator is set from the config.
EXPERT_STYLES: dict[str, Callable[[Config], Any]] = {
    "calc": lambda cfg: calc.ExpertStyle(cfg.expert_tool_on_hard, cfg.expert_tool_on_easy, cfg.expert_malformed),
    "hotel": lambda cfg: hotel.ExpertStyle(cfg.expert_violation, cfg.expert_guess, cfg.expert_slip),
    "bfcl_multi_turn": lambda cfg: None,  # replays BFCL's ground truth exactly: nothing to set
}


def expert_style(cfg: Config) -> Any:
    if cfg.env not in EXPERT_STYLES:
        raise ConfigError(f"environment {cfg.env!r} has no demonstrator for SFT (known: {', '.join(EXPERT_STYLES)})")
    return EXPERT_STYLES[cfg.env](cfg)


def demonstrations(
    cfg: Config,
    n: int,
    template: ChatTemplate,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    seed_tag: str,
) -> list[Trajectory]:
    """Expert episodes replayed through the real engine in the model's chat format: tool
    results come from running the calls, tokens from the template's fragments, the mask
    from the engine."""
    env = build_env(cfg)
    tasks = env.tasks("train", n, seed=cfg.seed)
    rng = random.Random(f"expert/{seed_tag}/{cfg.seed}")
    style = expert_style(cfg)
    scripts = {i: env.expert_turns(task, rng, style) for i, task in enumerate(tasks)}
    backend = ScriptedBackend(scripts, template.render_assistant, encode)
    engine = RolloutEngine(env, template, encode, decode, backend, episode_limits(cfg))
    return engine.run(tasks)


def build_embedded(cfg: Config, out_dir: Path) -> Path:
    """Train the tokenizer on demonstration text and save a fresh tiny Qwen2 to `out_dir`."""
    encode, decode = char_codec()
    template = make_template(cfg.compact_tools_prompt)
    texts = [decode(t.token_ids) for t in demonstrations(cfg, cfg.tokenizer_texts, template, encode, decode, "tokenizer")]
    shape = ModelShape(cfg.vocab_size, cfg.hidden_size, cfg.layers, cfg.heads, cfg.kv_heads, cfg.intermediate_size)
    return save_embedded(out_dir, texts, template, shape, cfg.seed)
