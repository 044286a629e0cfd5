"""`hotel`: a booking desk on a real SQLite database (see env.py for the whole picture).

database.py  schema, seed data, per-episode copies, canonical hash
tools.py     the desk's tools, bound to one episode's copy, recording facts for the gate
policy.yaml  the rules the gate checks (examples/policies/hotel.yaml links here)
tasks.py     tasks with compliant plans, reference actions and goal hashes
user.py      the simulated guest (User protocol, ScriptedUser)
expert.py    the imperfect demonstrator for SFT
env.py       HotelEnv and the per-episode HotelSession
"""

from toolpolicy.envs.hotel.env import POLICY_FILE, POLICY_MARKDOWN, HotelEnv, HotelOptions, HotelSession
from toolpolicy.envs.hotel.expert import ExpertStyle, expert_turns
from toolpolicy.envs.hotel.user import ScriptedUser, User, scenario_text

__all__ = [
    "POLICY_FILE",
    "POLICY_MARKDOWN",
    "ExpertStyle",
    "HotelEnv",
    "HotelOptions",
    "HotelSession",
    "ScriptedUser",
    "User",
    "expert_turns",
    "scenario_text",
]
