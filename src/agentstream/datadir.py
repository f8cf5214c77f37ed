"""The data directory holds every conversation, password hashes and keys: only its owner may
read it. Directories are made 0700 and files 0600 from the start (no window in between),
and an existing one left looser by an older version is tightened."""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["make_private", "open_private", "private_directory"]


def private_directory(path: Path) -> None:
    """Create the directory for its owner only, or tighten it if it exists."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    make_private(path)


def make_private(path: Path) -> None:
    """Take the group's and others' access away from a file or directory, if it exists."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return
    if mode & 0o077:
        path.chmod(mode & 0o700)


def open_private(path: Path, flags: int = os.O_RDWR) -> int:
    """Open (creating it 0600 if need be, in a 0700 directory if need be) a file only its
    owner can read; an existing one is tightened. Returns the descriptor."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, flags | os.O_CREAT, 0o600)
    make_private(path)
    return descriptor
