"""Demonstrators: what writes the assistant turns of SFT's generated dialogues.

A demonstrator is any callable `(task, rng, cfg) -> list[Message]`: the assistant
messages of one dialogue, in order, drawing its randomness from `rng` and any settings
from the Config. Tool results and user replies are not its business: the rollout engine
produces them by running the calls, exactly as in RL. `cfg.demonstrator` names one by
import path or entry point (group `toolpolicy.demonstrators`); empty uses the built-in
of the environment's name. This module imports no torch, so the config can check the
name on load.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import cache
from typing import Any

from toolpolicy.config import Config, ConfigError
from toolpolicy.envs import calc, hotel
from toolpolicy.registry import DEMONSTRATOR, ExtensionError, is_import_path, resolve_callable
from toolpolicy.types import Message, Task

Demonstrator = Callable[[Task, random.Random, Config], list[Message]]


def calc_demonstrator(task: Task, rng: random.Random, cfg: Config) -> list[Message]:
    """calc's imperfect expert, as the expert_* fields set it."""
    style = calc.ExpertStyle(cfg.expert_tool_on_hard, cfg.expert_tool_on_easy, cfg.expert_malformed)
    return calc.expert_turns(task, rng, style)


def hotel_demonstrator(task: Task, rng: random.Random, cfg: Config) -> list[Message]:
    """hotel's imperfect desk clerk, as the expert_* fields set it."""
    style = hotel.ExpertStyle(cfg.expert_violation, cfg.expert_guess, cfg.expert_slip)
    return hotel.expert_turns(task, rng, style)


def bfcl_multi_turn_demonstrator(task: Task, rng: random.Random, cfg: Config) -> list[Message]:
    """BFCL's ground truth, replayed exactly (its entries hold no imperfect answers to draw from)."""
    return _bfcl_env().expert_turns(task, rng)


@cache
def _bfcl_env() -> Any:
    from toolpolicy.envs.bfcl import BfclMultiTurnEnv  # here: it reads the bfcl-eval package's data

    return BfclMultiTurnEnv()


DEMONSTRATORS: dict[str, Demonstrator] = {
    "calc": calc_demonstrator, "hotel": hotel_demonstrator, "bfcl_multi_turn": bfcl_multi_turn_demonstrator,
}
"""The built-in demonstrators, by the name of the environment they demonstrate."""


def demonstrator_name(cfg: Config) -> str:
    """`cfg.demonstrator`, else the environment's registered name; ConfigError for an
    environment named by import path, which has no built-in to fall back on."""
    if cfg.demonstrator:
        return cfg.demonstrator
    if is_import_path(cfg.env):
        raise ConfigError(
            f"field 'demonstrator': environment {cfg.env!r} has no built-in demonstrator; name one "
            f"(e.g. {DEMONSTRATOR.example}) or train on a file with sft_data"
        )
    return cfg.env


def demonstrator_for(cfg: Config) -> Demonstrator:
    """The demonstrator SFT replays (see the module docstring)."""
    name = demonstrator_name(cfg)
    try:
        return resolve_callable(DEMONSTRATOR, name, DEMONSTRATORS)  # type: ignore[return-value]
    except ExtensionError as error:
        raise ConfigError(f"field 'demonstrator': {error}; or train on a file with sft_data") from None
