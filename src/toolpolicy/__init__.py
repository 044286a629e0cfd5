"""toolpolicy: train tool-using LLM agents with RL and govern what they may do with their tools."""

import os

__version__ = "0.1.0"

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
"""MKL's matrix products, in strict conditional-numerical-reproducibility mode: on some CPUs
(an Intel Xeon with AVX512 and AMX) their last bits otherwise depend on how the operands
happen to be aligned in memory, which differs between a process that ran on and one that
resumed, so a resumed run drifted from the straight one by an ulp a step. Set before MKL's
first call (it reads the variable then); measured at no cost in speed on that CPU. A value
the user exported is kept."""

_API = ("Config", "ConfigError", "bfcl_v4", "evaluate", "export", "format_summary", "load_config", "replaced", "sft", "train")
"""The Python API (toolpolicy.api), importable from here: `import toolpolicy as tp; tp.sft(cfg)`."""


def __getattr__(name: str):
    """The API's names, imported on first use so that `import toolpolicy` stays light."""
    if name in _API:
        from toolpolicy import api

        return getattr(api, name)
    raise AttributeError(f"module 'toolpolicy' has no attribute {name!r}")
