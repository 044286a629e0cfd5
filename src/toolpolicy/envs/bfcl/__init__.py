"""`bfcl_multi_turn`: BFCL v4's multi-turn categories run by toolpolicy's engine (see env.py).

data.py      the entries, function docs and the train/eval split, read from the installed bfcl-eval
backends.py  BFCL's backend classes: fresh instances, its execution results, ground-truth call parsing
env.py       BfclMultiTurnEnv, the per-episode BfclSession with BFCL's checks, the demonstrator
policy.yaml  the rules the gate checks (examples/policies/bfcl_multi_turn.yaml links here)
"""

from toolpolicy.envs.bfcl.data import CATEGORIES, BfclDataError, Entry, load_entries, split_of
from toolpolicy.envs.bfcl.env import POLICY_FILE, BfclMultiTurnEnv, BfclSession

__all__ = [
    "CATEGORIES",
    "POLICY_FILE",
    "BfclDataError",
    "BfclMultiTurnEnv",
    "BfclSession",
    "Entry",
    "load_entries",
    "split_of",
]
