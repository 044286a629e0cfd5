"""Tools layer: typed functions become tools with derived schemas; a ToolSet runs decoded calls."""

from toolpolicy.tools.calculator import calculator
from toolpolicy.tools.decorator import Tool, ToolError, tool
from toolpolicy.tools.sandbox import PythonSandbox, SandboxLimits
from toolpolicy.tools.toolset import ToolSet

__all__ = ["PythonSandbox", "SandboxLimits", "Tool", "ToolError", "ToolSet", "calculator", "tool"]
