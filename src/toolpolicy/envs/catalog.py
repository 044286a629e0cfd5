"""The built-in environments, one row each: what a config's `env.name` finds, and the rest
of the project reads from.

A row is the environment's class (its options are its keyword parameters, documented in
its docstring and typed by their annotations; its policy file is its `policy_file`), the
demonstrator that writes its SFT dialogues (None: SFT needs `sft.data` or a named one).
`toolpolicy.envs.ENVS` and `toolpolicy.envs.DEMONSTRATORS` are derived from it; pyproject.toml declares the same rows as entry points (the
plugin mechanism), which tests/test_catalog.py holds equal to this table.

Adding a built-in environment: its folder (class, demonstrator, policy.yaml) and a row
here, plus its two entry points in pyproject.toml.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolpolicy.envs import bfcl, calc, hotel, zoom
from toolpolicy.envs.agentdojo.env import AgentDojoEnv
from toolpolicy.envs.base import Env
from toolpolicy.envs.bfcl import demonstrator as bfcl_demonstrator
from toolpolicy.envs.bfcl import env as bfcl_multi_turn
from toolpolicy.envs.hotel import expert as hotel_expert
from toolpolicy.envs.zoom import env as zoom_env
from toolpolicy.types import Message

Demonstrator = Callable[..., list[Message]]
"""`(task, rng, env, **options) -> [assistant Message]`: see `toolpolicy.checks.demonstrator_for`."""


@dataclass(frozen=True)
class BuiltIn:
    """One built-in environment."""

    env: type[Env]
    """Its class: called with its options (and `user=` for one with a simulated user)."""
    demonstrator: Demonstrator | None = None
    """What writes its SFT dialogues when `demonstrator.name` is empty; None: it has none."""

    @property
    def policy_file(self) -> Path | None:
        """The policy its gate enforces when the config names none (None: allow all)."""
        return Path(self.env.policy_file) if self.env.policy_file else None


BUILT_IN: dict[str, BuiltIn] = {
    "calc": BuiltIn(calc.CalcEnv, calc.demonstrate),
    "hotel": BuiltIn(hotel.HotelEnv, hotel_expert.demonstrate),
    "bfcl_multi_turn": BuiltIn(bfcl.BfclMultiTurnEnv, bfcl_multi_turn.demonstrate),
    "bfcl": BuiltIn(bfcl.BfclEnv, bfcl_demonstrator.demonstrate),
    "agentdojo": BuiltIn(AgentDojoEnv),
    "zoom": BuiltIn(zoom.ZoomEnv, zoom_env.demonstrate),
}
"""The built-in environments by config name."""
