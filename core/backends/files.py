"""What a path names, in words, for messages about a file that is not what it should be."""
from __future__ import annotations

import stat
from pathlib import Path

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a file"))


def kind_of(path: Path) -> str:
    """'a folder', 'a named pipe (FIFO)', 'a character device', ... for what ``path`` names (links followed)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")
