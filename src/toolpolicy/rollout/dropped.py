"""Episodes dropped for an infrastructure error (docs/architecture.md, contract 4), named and counted out loud.

An episode whose tool raised an exception other than ToolError, whose tool's service
failed, whose audit log failed or whose endpoint did not answer ends with `infra_error`
set. It is left out of every mean, of the update and of pass^k, never scored 0. Left
out must not mean unseen: RL and eval print one line per step or run saying how many
episodes they dropped and why (`dropped_line`), RL logs the count per tool
(`dropped_metrics`) and stops when more than half of a step's episodes are dropped.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from toolpolicy.types import Episode, ToolResult

MAX_CAUSE_CHARS = 300
"""Characters of a failed tool's text an infra_error keeps."""
MAX_CAUSES_SHOWN = 3
"""Distinct causes `dropped_line` quotes; the rest are counted."""
FAILED_TOOL = re.compile(r"tool '([^']+)'")
"""How every infra_error of a tool starts (`tool_failure`), naming it."""


def tool_failure(tool: str, result: ToolResult) -> str:
    """The infra_error of an episode that a tool's machine fault ended, starting "tool 'NAME'".
    A tool that raised already says so, naming the exception and the fix (ToolSet.call);
    any other fault (a sandbox or MCP server that failed, a timeout) gets its kind.

    >>> tool_failure("add", ToolResult("the MCP server closed the connection.", "infra"))
    "tool 'add' failed (infra): the MCP server closed the connection."
    """
    if result.error == "exception":
        return result.content
    return f"tool {tool!r} failed ({result.error}): {result.content[:MAX_CAUSE_CHARS]}"


def failed_tool(infra_error: str) -> str | None:
    """The tool an infra_error names, or None when the fault was not a tool's."""
    found = FAILED_TOOL.match(infra_error)
    return found.group(1) if found else None


def dropped_causes(episodes: Sequence[Episode]) -> Counter[str]:
    """Each distinct infra_error of `episodes`, with how many episodes it dropped."""
    return Counter(e.infra_error for e in episodes if e.infra_error is not None)


def dropped_line(episodes: Sequence[Episode]) -> str | None:
    """One line saying how many of `episodes` were dropped and why, or None if none was.

    e.g. "dropped 1 of 6 episodes (infrastructure errors: not scored, not trained on):
    tool 'convert' raised ValueError: unit 'parsec' (raise toolpolicy.tools.ToolError to
    show the model the message)"; a cause that dropped several says how many ("2x ...").
    """
    causes = dropped_causes(episodes)
    if not causes:
        return None
    shown = [cause if n == 1 else f"{n}x {cause}" for cause, n in causes.most_common(MAX_CAUSES_SHOWN)]
    if len(causes) > MAX_CAUSES_SHOWN:
        shown.append(f"and {len(causes) - MAX_CAUSES_SHOWN} other causes")
    dropped = sum(causes.values())
    return f"dropped {dropped} of {len(episodes)} episodes (infrastructure errors: not scored, not trained on): " + "; ".join(shown)


def dropped_metrics(episodes: Sequence[Episode]) -> dict[str, int]:
    """Dropped episodes per failed tool, as infra_errors/<tool> (the total is infra_errors)."""
    tools = Counter(failed_tool(e.infra_error) for e in episodes if e.infra_error is not None)
    return {f"infra_errors/{tool}": tools[tool] for tool in sorted(filter(None, tools))}
