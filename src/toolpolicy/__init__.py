"""toolpolicy: train tool-using LLM agents with RL and govern what they may do with their tools."""

__version__ = "0.1.0"

_API = ("Config", "ConfigError", "bfcl_v4", "evaluate", "format_summary", "load_config", "replaced", "sft", "train")
"""The Python API (toolpolicy.api), importable from here: `import toolpolicy as tp; tp.sft(cfg)`."""


def __getattr__(name: str):
    """The API's names, imported on first use so that `import toolpolicy` stays light."""
    if name in _API:
        from toolpolicy import api

        return getattr(api, name)
    raise AttributeError(f"module 'toolpolicy' has no attribute {name!r}")
