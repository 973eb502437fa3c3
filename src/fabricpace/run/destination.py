"""The one check every verb that creates a run or study folder makes before it writes anything.

fabricpace never overwrites what a user has: a destination that is a file, a folder with anything in
it, or a link (even a broken one, which ``Path.exists`` calls absent and ``mkdir`` then trips over) is
refused with one line that names it and says what to do.
"""

from __future__ import annotations

import os
from pathlib import Path

from fabricpace._errors import RunDirError


def check_new_dir(out: str | os.PathLike[str], *, option: str = "--out", what: str = "folder") -> Path:
    """``out`` as a Path when it is absent or an empty folder; else RunDirError (one line, exit 2)."""
    path = Path(out)
    label = f"{option} {path}" if option else str(path)
    if path.is_symlink() and not path.exists():
        raise RunDirError(f"{label}: is a broken symbolic link; remove it or choose a new {what}")
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{label}: is a file, not a folder; choose a new {what} (nothing was written)")
    if path.is_dir() and any(path.iterdir()):
        raise RunDirError(
            f"{label}: already exists and is not empty; choose a new {what} (nothing was written)"
        )
    return path
