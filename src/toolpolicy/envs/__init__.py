"""Environments: task data, a turn hook and scoring inputs.

`ENVS` holds the built-in environments by config name and `DEMONSTRATORS` their
demonstrators, both read from the one table of built-ins, `toolpolicy.envs.catalog`
(each also declared as an entry point in pyproject.toml); `USERS` the built-in user
simulators. A config may name its own by import path (see toolpolicy.registry).

A built-in environment's options are a frozen dataclass beside its class (CalcOptions: each
field typed and documented by the docstring under it), which its constructor takes as
`options`; a plug-in may take its options as keyword parameters instead. `make_env` takes
them as keywords either way.
"""

import dataclasses
import inspect
import typing
from collections.abc import Callable

from toolpolicy.envs.base import Env, as_env
from toolpolicy.envs.bfcl import BfclEnv, BfclMultiTurnEnv
from toolpolicy.envs.calc import CalcEnv
from toolpolicy.envs.catalog import BUILT_IN, Demonstrator
from toolpolicy.envs.hotel import HotelEnv, ScriptedUser
from toolpolicy.envs.zoom import ZoomEnv
from toolpolicy.registry import ENVIRONMENT, USER, resolve_callable

ENVS: dict[str, type] = {name: row.env for name, row in BUILT_IN.items()}
DEMONSTRATORS: dict[str, Demonstrator] = {name: row.demonstrator for name, row in BUILT_IN.items() if row.demonstrator}
"""The built-in demonstrators, by the name of the environment they demonstrate."""
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


def options_class(factory: Callable) -> type | None:
    """The dataclass of a factory's options: the type of its `options` parameter (a built-in
    environment's, e.g. CalcOptions); None for one that takes its options as keywords."""
    try:
        if "options" not in inspect.signature(factory).parameters:
            return None
        hint = typing.get_type_hints(factory.__init__ if inspect.isclass(factory) else factory).get("options")
    except Exception:  # no signature to read, or an annotation that does not resolve
        return None
    return hint if isinstance(hint, type) and dataclasses.is_dataclass(hint) else None


def make_env(name: str, **options: object) -> Env:
    """A fresh environment `name` with `options` (e.g. composed=40; user= for one that takes a
    user simulator): an environment with an options class gets them in it (one written
    without the `Env` base is adopted, `as_env`)."""
    factory = env_factory(name)
    holder = options_class(factory)
    if holder is not None:  # its options in their class, the rest (user=) beside them
        names = {field.name for field in dataclasses.fields(holder)}
        own = {key: value for key, value in options.items() if key in names}
        options = {key: value for key, value in options.items() if key not in names} | {"options": holder(**own)}
    return as_env(factory(**options))


__all__ = [
    "DEMONSTRATORS", "ENVS", "USERS", "BfclEnv", "BfclMultiTurnEnv", "CalcEnv", "Demonstrator", "Env", "HotelEnv", "ZoomEnv",
    "as_env", "env_factory", "make_env", "options_class", "takes_user", "user_factory",
]
