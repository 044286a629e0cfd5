"""Extensions by name: environments, reward functions, demonstrators and user simulators.

A config names an extension in one of two ways:

- an import path `module:attribute` (`mypkg.envs:Adder`, `mypkg.rewards:exact.score`),
  imported as written, so code on the PYTHONPATH needs no installing;
- a plain name (`calc`), looked up among the entry points an installed package declares
  in the kind's group (`toolpolicy.envs`, `toolpolicy.rewards`, `toolpolicy.demonstrators`,
  `toolpolicy.users`), then among the project's built-ins.

toolpolicy declares its own built-ins as entry points too, the way a plugin would. The
built-in table in the code is what still finds them when the installed metadata is older
than the declarations (an editable install made before an entry point was added), so a
checkout never depends on when it was last installed. Two installed packages that give
one name different objects are an error, never a silent pick.

Only the standard library is imported here: every layer may name its extensions.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points


class ExtensionError(ValueError):
    """A name that resolves to nothing usable; the message says what was tried."""


@dataclass(frozen=True)
class Kind:
    """One kind of extension: its entry-point group and what a reader calls it."""

    group: str
    noun: str
    example: str
    """An import path shown in errors, as a model of what to write."""


ENVIRONMENT = Kind("toolpolicy.envs", "environment", "mypkg.envs:MyEnv")
REWARD = Kind("toolpolicy.rewards", "reward function", "mypkg.rewards:my_reward")
DEMONSTRATOR = Kind("toolpolicy.demonstrators", "demonstrator", "mypkg.experts:demonstrate")
USER = Kind("toolpolicy.users", "user simulator", "mypkg.users:MyUser")


def is_import_path(name: str) -> bool:
    """`module:attribute` rather than a registered name."""
    return ":" in name


def short_name(name: str) -> str:
    """What reports call an extension: a registered name as it is, an import path by its
    last attribute.

    >>> short_name("mypkg.rewards:exact_sum"), short_name("m:Scorer.total"), short_name("calc")
    ('exact_sum', 'total', 'calc')
    """
    return name.rsplit(":", 1)[1].rsplit(".", 1)[-1] if is_import_path(name) else name


def resolve(kind: Kind, name: str, builtins: Mapping[str, object]) -> object:
    """The object `name` stands for: an import path imported, else the entry point of
    that name in `kind.group`, else the built-in. ExtensionError says what was tried."""
    if is_import_path(name):
        return from_import_path(name)
    declared = declared_in(kind.group).get(name)
    if declared:
        return _load_entry_point(kind, name, declared)
    if name in builtins:
        return builtins[name]
    installed = ", ".join(sorted(declared_in(kind.group))) or "none"
    raise ExtensionError(
        f"{name!r}: no {kind.noun} of that name (tried entry points of group {kind.group}: {installed}; "
        f"built-ins: {', '.join(sorted(builtins))}); name your own by import path, e.g. {kind.example}"
    )


def resolve_callable(kind: Kind, name: str, builtins: Mapping[str, object]) -> object:
    """`resolve`, and the result must be callable (a class, a function, a factory)."""
    found = resolve(kind, name, builtins)
    if not callable(found):
        raise ExtensionError(f"{name!r}: is a {type(found).__name__}, not a callable {kind.noun}")
    return found


def known_names(kind: Kind, builtins: Mapping[str, object]) -> list[str]:
    """Every plain name of the kind: installed entry points and built-ins."""
    return sorted(set(declared_in(kind.group)) | set(builtins))


def from_import_path(path: str) -> object:
    """Import `module:attribute.attribute...`; an ExtensionError says which part failed."""
    module_name, _, attributes = path.partition(":")
    if not module_name or not attributes:
        raise ExtensionError(f"{path!r}: an import path is module:attribute, e.g. mypkg.envs:MyEnv")
    try:
        found: object = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and (module_name + ".").startswith(error.name + "."):  # the module or its package
            raise ExtensionError(f"{path!r}: module {module_name} not found (tried import path; is its folder on PYTHONPATH?)") from None
        raise ExtensionError(f"{path!r}: importing {module_name} failed: {type(error).__name__}: {error} (tried import path)") from None
    except Exception as error:
        raise ExtensionError(f"{path!r}: importing {module_name} failed: {type(error).__name__}: {error} (tried import path)") from None
    for attribute in attributes.split("."):
        if not hasattr(found, attribute):
            raise ExtensionError(f"{path!r}: {module_name} has no attribute {attributes} (tried import path)")
        found = getattr(found, attribute)
    return found


@cache
def declared_in(group: str) -> dict[str, tuple[EntryPoint, ...]]:
    """The entry points installed packages declare in `group`, by name; one name may have
    several declarations (two distributions, or one seen twice), kept for `_load_entry_point`
    to compare. Read once per process: installing a package needs a new process anyway."""
    out: dict[str, tuple[EntryPoint, ...]] = {}
    for point in entry_points(group=group):
        out[point.name] = out.get(point.name, ()) + (point,)
    return out


def _load_entry_point(kind: Kind, name: str, points: tuple[EntryPoint, ...]) -> object:
    targets = sorted({point.value for point in points})
    if len(targets) > 1:
        raise ExtensionError(
            f"{name!r}: installed packages give the {kind.noun} different objects in group {kind.group} "
            f"({', '.join(targets)}); name the one you mean by its import path"
        )
    try:
        return points[0].load()
    except Exception as error:
        raise ExtensionError(
            f"{name!r}: loading entry point {targets[0]} of group {kind.group} failed: {type(error).__name__}: {error}"
        ) from None
