"""Proxy layer: the MCP policy proxy (`toolpolicy gate serve`) and its tool definition pins.

It stands between an MCP host and an MCP server, enforcing a policy with the same
gate that runs in training, writing the audit log, holding back tools whose
definitions changed since they were approved, tools that appear mid-session and tools
with confusable names, capping sizes and redacting secrets from results.
"""

from toolpolicy.proxy.pins import Approval, PinsError, PinStore
from toolpolicy.proxy.server import (
    ARGUMENTS_TOO_LARGE,
    DEFINITION_CHANGED,
    NOT_APPROVED,
    SUSPICIOUS_NAME,
    PolicyProxy,
    ProxySettings,
    UpstreamLost,
    serve,
)

__all__ = [
    "ARGUMENTS_TOO_LARGE",
    "DEFINITION_CHANGED",
    "NOT_APPROVED",
    "SUSPICIOUS_NAME",
    "Approval",
    "PinStore",
    "PinsError",
    "PolicyProxy",
    "ProxySettings",
    "UpstreamLost",
    "serve",
]
