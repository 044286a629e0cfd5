"""Files written whole or not at all.

An audit log's head, the proxy's ledger, a run's config and start state and its metrics
log are all read back after a kill. Each is replaced atomically: written to a temporary
file of this process beside it, then renamed over it, so a reader finds the old content
or the new, never part of one. The temporary name carries the process id, because every
rank of a torchrun may write the same file.
"""

from __future__ import annotations

import os
from pathlib import Path


def replace_file(path: Path, content: str | bytes, *, private: bool = False, durable: bool = False) -> None:
    """Make `content` the whole of `path` in one step.

    `private`: readable by the owner only (mode 0600), from the first byte on disk.
    `durable`: on disk before this returns (the file and the folder's entry fsynced),
    for what must survive a power cut and not only a killed process.
    """
    data = content.encode("utf-8") if isinstance(content, str) else content
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
        try:
            write_all(descriptor, data)
            if durable:
                os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)  # gone after the replace; a part-written one if interrupted
    if durable and hasattr(os, "O_DIRECTORY"):
        folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def write_all(descriptor: int, data: bytes) -> None:
    """Write every byte of `data` to `descriptor` (os.write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]
