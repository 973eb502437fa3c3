"""Where report and export write: a new file, never over one the user already has.

The project's one rule for output files (as ``place --out``, ``collective --save-calibration``,
``import -o`` and ``simulate/study --out``): an existing path is refused with a one-line error before
any work is done, and the finished file is published with a hard link, which fails rather than
replaces when a file of that name appeared while the report was being built.
"""

from __future__ import annotations

import os
from pathlib import Path

from fabricpace._errors import InputError


def check_new_file(out: str | os.PathLike[str], example: str) -> Path:
    """``out`` as a Path, or InputError when it is a folder, its folder is missing or it exists."""
    path = Path(out)
    if path.is_dir():
        raise InputError(f"{path}: is a directory; pass a file name such as {example}")
    if not path.parent.exists():
        raise InputError(f"{path.parent}: folder does not exist; create it first")
    if path.exists() or path.is_symlink():
        raise InputError(f"{path}: exists; choose a new file name (fabricpace never overwrites a file)")
    return path


def publish(tmp: Path, path: Path) -> None:
    """Move the finished ``tmp`` to ``path`` without replacing a file that appeared meanwhile."""
    try:
        os.link(tmp, path)
    except FileExistsError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(
            f"{path}: exists (created while this ran); choose a new file name (nothing was overwritten)"
        ) from exc
    except OSError:  # no hard links on this filesystem: the check before the work has to do
        if path.exists():
            raise InputError(f"{path}: exists; choose a new file name (nothing was overwritten)") from None
        os.replace(tmp, path)
        return
    tmp.unlink()
