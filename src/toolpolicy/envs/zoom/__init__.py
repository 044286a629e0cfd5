"""`zoom`: read a code in a picture, looking closer where it is drawn too small (envs/zoom/env.py)."""

from toolpolicy.envs.zoom.env import POLICY_FILE, ExpertStyle, ZoomEnv, ZoomOptions, draw_task

__all__ = ["POLICY_FILE", "ExpertStyle", "ZoomEnv", "ZoomOptions", "draw_task"]
