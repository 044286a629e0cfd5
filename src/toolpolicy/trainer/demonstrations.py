"""SFT data: an environment's imperfect demonstrator, replayed through the real engine, or
conversations from a file (`sft_data`), and the embedded model built from their text."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from toolpolicy.build import build_env, episode_limits
from toolpolicy.envs import Env
from toolpolicy.envs.base import offers_reading_pictures
from toolpolicy.chat import ChatTemplate
from toolpolicy.config import Config, ConfigError
from toolpolicy.model import char_codec, make_template
from toolpolicy.chat.images import ImageSpan
from toolpolicy.model.embedded import ModelShape, save_embedded
from toolpolicy.model.reading import warm_up_reading
from toolpolicy.model.vision import VisionShape
from toolpolicy.rollout import RolloutEngine, ScriptedBackend, Trajectory
from toolpolicy.types import Message, Task
from toolpolicy.checks import demonstrator_for, demonstrator_options
from toolpolicy.trainer.sft_data import data_examples


def demonstrator_scripts(cfg: Config, env: Env, tasks: list[Task], seed_tag: str) -> list[list[Message]]:
    """The demonstrator's assistant messages for each task of `env`, from one random stream per `seed_tag`."""
    rng = random.Random(f"expert/{seed_tag}/{cfg.run.seed}")
    demonstrate, options = demonstrator_for(cfg.demonstrator, cfg.env), demonstrator_options(cfg.demonstrator, cfg.env)
    return [demonstrate(task, rng, env, **options) for task in tasks]


def demonstrator_dialogue(trajectory: Trajectory, script: list[Message]) -> list[Message]:
    """A demonstration as the dialogue to export: the demonstrator's own assistant messages
    (`script`, whole also where the engine cut a turn at a budget) with the observations the
    engine produced between them. Rendered as SFT data it gives the trajectory's tokens."""
    turns = iter(script)
    return [next(turns) if m.role == "assistant" else m for m in trajectory.episode.messages]


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
    env = build_env(cfg.env)
    tasks = env.tasks("train", n, seed=cfg.run.seed)
    scripts = dict(enumerate(demonstrator_scripts(cfg, env, tasks, seed_tag)))
    backend = ScriptedBackend(scripts, template.render_assistant, encode)
    engine = RolloutEngine(env, template, encode, decode, backend, episode_limits(cfg.rollout))
    return engine.run(tasks)


def sft_examples(
    cfg: Config, n: int, template: ChatTemplate, encode: Callable[[str], list[int]], decode: Callable[[list[int]], str],
    seed_tag: str,
) -> list[Trajectory]:
    """What SFT trains on: the conversations of `sft.data` when it is set (all of them,
    `n` unused), else `n` demonstrations."""
    if cfg.sft.data:
        return data_examples(cfg.sft.data, template, encode, episode_limits(cfg.rollout), build_env(cfg.env))
    return demonstrations(cfg, n, template, encode, decode, seed_tag)


def within_prompt_budget(examples: list[Trajectory], most: int | None) -> list[Trajectory]:
    """The examples whose prompt is at most `most` tokens (all of them for None); an error
    when none is, since SFT would have nothing to train on."""
    if most is None:
        return examples
    kept = [t for t in examples if t.prompt_len <= most]
    if not kept:
        shortest = min((t.prompt_len for t in examples), default=0)
        raise ConfigError(f"field 'env.max_prompt_tokens': no SFT example has a prompt of at most {most} tokens (the shortest has {shortest}); raise it or leave it unset")
    print(f"SFT keeps {len(kept)} of {len(examples)} examples, those whose prompt is at most {most} tokens (env.max_prompt_tokens)")
    return kept


def build_embedded(cfg: Config, out_dir: Path) -> Path:
    """Train the tokenizer on the SFT text (demonstrations, or the first `embedded.tokenizer_texts`
    conversations of sft.data) and save a fresh tiny Qwen2 of the `embedded` section's shape to `out_dir`."""
    encode, decode = char_codec()
    tiny = cfg.embedded
    vision = None
    if tiny.image_size:
        if tiny.image_size % tiny.patch:
            raise ConfigError(f"field 'embedded.patch': {tiny.patch} does not divide embedded.image_size {tiny.image_size}")
        vision = VisionShape(tiny.image_size, tiny.patch, tiny.vision_hidden_size, tiny.vision_layers)
    template = make_template(tiny.compact_tools_prompt)
    if vision is not None:  # the demonstrations' pictures as the model will read them
        template = replace(template, image_span=ImageSpan(lambda image: (vision.image_size // vision.patch) ** 2))
    examples = sft_examples(cfg, tiny.tokenizer_texts, template, encode, decode, "tokenizer")[: tiny.tokenizer_texts]
    texts = [decode(t.token_ids) for t in examples]
    shape = ModelShape(tiny.vocab_size, tiny.hidden_size, tiny.layers, tiny.heads, tiny.kv_heads, tiny.intermediate_size)
    return save_embedded(out_dir, texts, template, shape, cfg.run.seed, vision, reading_warm_up(cfg) if vision is not None else None)


def reading_warm_up(cfg: Config) -> Callable[[torch.nn.Module], None] | None:
    """The embedded VLM's reading warm-up on the environment's reading pictures
    (`embedded.reading_steps`; model/reading.py), or None when it takes no steps."""
    tiny = cfg.embedded
    if not tiny.reading_steps:
        return None
    env = build_env(cfg.env)
    if not offers_reading_pictures(env):
        raise ConfigError(f"field 'embedded.reading_steps': env {cfg.env.name!r} offers no reading pictures (reading_pictures); set it to 0")

    def warm_up(model: torch.nn.Module) -> None:
        readings = env.reading_pictures(tiny.reading_pictures, cfg.run.seed)
        score = warm_up_reading(model, readings, tiny.reading_steps, cfg.run.seed)
        text = "" if math.isnan(score.text_accuracy) else f", text read {score.text_accuracy:.1%}"
        print(
            f"reading warm-up: {score.steps} steps on {score.pictures} pictures ({score.labels} labels), "
            f"held-out patch accuracy {score.patch_accuracy:.1%}{text}, {score.seconds:.0f} s"
        )

    return warm_up
