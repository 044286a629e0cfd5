"""How a variant in a table declares the constants a config sets.

A row of POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS or CORRECTIONS is the variant's function
when it has no constant, and otherwise a frozen dataclass of its constants that is called as
that function. Each field is one constant: typed (bounds as annotated_types metadata, which
the config checks hold a value to), documented by the docstring under it, and named as the
config's key (`clip_low` is `algorithm.clip_low`). Variants that share a constant (the clip
bounds of both ratio levels) share its declaration, a base class. `configured` builds a row
from the config's constants; nothing here knows the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from typing import Annotated, Any

from annotated_types import Ge, Gt

NonNegative = Annotated[float, Ge(0)]
AboveOne = Annotated[float, Gt(1)]
Length = Annotated[int, Ge(1)]


def configured(row: Any, constants: Mapping[str, Any]) -> Any:
    """`row` ready to call: a dataclass row built from the constants of `constants` it declares
    (one it lacks keeps its default; the others are other variants'); a function as it is."""
    if not (isinstance(row, type) and is_dataclass(row)):
        return row
    return row(**{field.name: constants[field.name] for field in fields(row) if field.name in constants})
