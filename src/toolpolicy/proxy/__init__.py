"""Proxy layer: the MCP policy proxy (`toolpolicy gate serve`) and its tool definition pins.

It stands between an MCP host and an MCP server, enforcing a policy with the same
gate that runs in training, writing the audit log, and denying calls to tools whose
definitions changed since they were approved.
"""

from toolpolicy.proxy.pins import Approval, PinsError, PinStore
from toolpolicy.proxy.server import DEFINITION_CHANGED, PolicyProxy, UpstreamLost, serve

__all__ = ["DEFINITION_CHANGED", "Approval", "PinStore", "PinsError", "PolicyProxy", "UpstreamLost", "serve"]
