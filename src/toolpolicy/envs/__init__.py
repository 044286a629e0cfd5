"""Environments: task data, a turn hook and scoring inputs.

`ENVS` holds the built-in environments by config name (each also declared as an entry
point of group `toolpolicy.envs` in pyproject.toml); `USERS` the built-in user
simulators. A config may name its own by import path (see toolpolicy.registry).
"""

import inspect
from collections.abc import Callable

from toolpolicy.envs.agentdojo.env import AgentDojoEnv
from toolpolicy.envs.base import Env
from toolpolicy.envs.bfcl import BfclEnv, BfclMultiTurnEnv
from toolpolicy.envs.calc import CalcEnv
from toolpolicy.envs.hotel import HotelEnv, ScriptedUser
from toolpolicy.envs.zoom import ZoomEnv
from toolpolicy.registry import ENVIRONMENT, USER, resolve_callable

ENVS: dict[str, type] = {
    "calc": CalcEnv, "hotel": HotelEnv, "bfcl_multi_turn": BfclMultiTurnEnv, "bfcl": BfclEnv, "agentdojo": AgentDojoEnv,
    "zoom": ZoomEnv,
}
USERS: dict[str, Callable] = {"scripted": ScriptedUser}
"""User simulators: a factory `(task) -> User` for environments that take `user=`."""


def env_factory(name: str) -> Callable[..., Env]:
    """The class (or factory) of environment `name`: built-in, entry point or import path."""
    return resolve_callable(ENVIRONMENT, name, ENVS)  # type: ignore[return-value]


def user_factory(name: str) -> Callable:
    """The user simulator `name`: a factory `(task) -> User`."""
    return resolve_callable(USER, name, USERS)  # type: ignore[return-value]


def takes_user(factory: Callable[..., Env]) -> bool:
    """Whether the environment accepts a user simulator (a `user` keyword)."""
    try:
        return "user" in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return False


def make_env(name: str, **options: object) -> Env:
    """A fresh environment `name`, with `options` (e.g. user=) passed to its factory."""
    return env_factory(name)(**options)


__all__ = [
    "ENVS", "USERS", "BfclEnv", "BfclMultiTurnEnv", "CalcEnv", "Env", "HotelEnv", "ZoomEnv", "env_factory", "make_env", "takes_user", "user_factory",
]
