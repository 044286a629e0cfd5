"""BFCL v4 as environments: `bfcl_multi_turn` (its multi-turn categories, see env.py) and
`bfcl` (its single-turn categories, see single_turn.py), read from the installed bfcl-eval.

data.py         the multi-turn entries, function docs and the train/eval split
backends.py     BFCL's backend classes: fresh instances, its execution results, ground-truth call parsing
env.py          BfclMultiTurnEnv, the per-episode BfclSession with BFCL's checks, the demonstrator
policy.yaml     the rules the gate checks (examples/policies/bfcl_multi_turn.yaml links here)
single_data.py  the single-turn entries and their functions as BFCL shows them (eval --bfcl v4 reads them too)
single_turn.py  BfclEnv: one scored assistant turn per entry, the leak-free train/eval split
"""

from toolpolicy.envs.bfcl.data import CATEGORIES, BfclDataError, Entry, load_entries, split_of
from toolpolicy.envs.bfcl.env import POLICY_FILE, BfclMultiTurnEnv, BfclMultiTurnOptions, BfclSession
from toolpolicy.envs.bfcl.single_turn import BfclEnv, BfclOptions

__all__ = [
    "CATEGORIES",
    "POLICY_FILE",
    "BfclDataError",
    "BfclEnv",
    "BfclMultiTurnEnv",
    "BfclMultiTurnOptions",
    "BfclOptions",
    "BfclSession",
    "Entry",
    "load_entries",
    "split_of",
]
