"""Environments: task data, a turn hook and scoring inputs. `ENVS` maps config names to classes."""

from toolpolicy.envs.base import Env
from toolpolicy.envs.bfcl import BfclMultiTurnEnv
from toolpolicy.envs.calc import CalcEnv
from toolpolicy.envs.hotel import HotelEnv

ENVS: dict[str, type] = {"calc": CalcEnv, "hotel": HotelEnv, "bfcl_multi_turn": BfclMultiTurnEnv}


def make_env(name: str) -> Env:
    """The environment called `name`; a clear error lists the known ones."""
    if name not in ENVS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVS))}")
    return ENVS[name]()


__all__ = ["ENVS", "BfclMultiTurnEnv", "CalcEnv", "Env", "HotelEnv", "make_env"]
