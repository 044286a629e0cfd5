"""toolpolicy: train tool-using LLM agents with RL and govern what they may do with their tools."""

__version__ = "0.1.0"
