"""A small MCP server (stdio) to put behind `toolpolicy gate serve`: notes in memory.

Written for the MCP Python SDK 2.x (`pip install mcp`, the version toolpolicy installs),
whose server class is `mcp.server.mcpserver.MCPServer`. The 1.x examples' `from
mcp.server.fastmcp import FastMCP` no longer exists there; in 1.x, use FastMCP the same way.

Run it alone (it speaks MCP on stdin/stdout):   python examples/mcp/notes_server.py
Behind the gate (docs/policy.md, "Deployment"):
    toolpolicy gate serve --policy examples/mcp/notes_policy.yaml --audit runs/notes-audit.jsonl \
        -- python examples/mcp/notes_server.py
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes", log_level="WARNING")
notes: dict[str, str] = {
    "todo": "water the plants",
    "deploy": "aws_access_key_id=AKIAABCDEFGHIJKLMNOP region=eu-west-1",  # a secret the gate redacts
}


@server.tool()
def list_notes() -> list[str]:
    """The names of all notes."""
    return sorted(notes)


@server.tool()
def read_note(name: str) -> str:
    """Read one note.

    Args:
        name: The note's name, as list_notes gives it.
    """
    if name not in notes:
        raise ValueError(f"no note named {name!r}")
    return notes[name]


@server.tool()
def write_note(name: str, text: str) -> str:
    """Create or replace a note.

    Args:
        name: The note's name.
        text: What the note says.
    """
    notes[name] = text
    return f"saved {name}"


@server.tool()
def delete_note(name: str) -> str:
    """Delete a note.

    Args:
        name: The note's name.
    """
    notes.pop(name, None)
    return f"deleted {name}"


if __name__ == "__main__":
    server.run("stdio")
