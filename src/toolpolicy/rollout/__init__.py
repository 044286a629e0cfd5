"""Rollouts: the Trajectory type, the multi-turn engine and generation backends."""

from toolpolicy.rollout.backends import Backend, Generation, GenRequest, HFBackend, ScriptedBackend
from toolpolicy.rollout.engine import EpisodeLimits, RolloutEngine, allow_all_policy, observe
from toolpolicy.rollout.recorded import recorded_trajectory
from toolpolicy.rollout.trajectory import Trajectory

__all__ = [
    "Backend",
    "GenRequest",
    "Generation",
    "HFBackend",
    "EpisodeLimits",
    "RolloutEngine",
    "ScriptedBackend",
    "Trajectory",
    "allow_all_policy",
    "observe",
    "recorded_trajectory",
]
