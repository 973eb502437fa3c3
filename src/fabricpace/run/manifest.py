"""manifest.json of a run directory: what produced the run, at what scale, and whether it closed cleanly."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fabricpace._errors import RunDirError
from fabricpace.run.schema import SCHEMA_VERSION

MANIFEST = "manifest.json"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("fabricpace")
    except Exception:  # not installed (running from a source tree)
        return "0+unknown"


@dataclass(kw_only=True)
class Manifest:
    """The manifest of one run. ``source`` is observer | sim | lab | local | import:<fmt>."""

    source: str
    world_size: int
    nodes: int
    gpus_per_node: int
    schema: str = SCHEMA_VERSION
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    fabricpace_version: str = field(default_factory=_version)
    workload: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] | str = field(default_factory=dict)
    pacing: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def run_dir_gone(
    run_dir: str | os.PathLike[str], *, replaced: bool = False, seen: bool = False
) -> RunDirError:
    """The error of a write into a run directory that is no longer there (never re-created).
    ``seen``: the writer had it (a ``RunRoot`` it started), so it was certainly removed."""
    if replaced:
        what = "was replaced (or turned into a file) while the run was writing it"
    elif seen:
        what = "is gone (removed while the run was writing it)"
    else:
        what = "does not exist (removed while the run was writing it, or never created)"
    return RunDirError(
        f"{run_dir}: the run directory {what}; it is not re-created, rows from now on are not written "
        "(the rows still there, if any, are incomplete)"
    )


def write_manifest(run_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write manifest.json atomically (temp file + rename) into ``run_dir``, which must exist: a run
    directory removed while the run wrote it is not re-created (RunDirError), so that no manifest
    saying ``complete: true`` stands beside rows that were lost."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise run_dir_gone(run_dir)
    path = run_dir / MANIFEST
    tmp = path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)
    except FileNotFoundError:  # removed between the check and the write
        if not run_dir.is_dir():
            raise run_dir_gone(run_dir) from None
        raise
    return path


def read_manifest(run_dir: str | os.PathLike[str]) -> Manifest:
    """Read manifest.json; a missing or malformed one is a RunDirError naming the file."""
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise RunDirError(f"{run_dir}: no {MANIFEST}; is this a fabricpace run directory?")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirError(
            f"{path}: unreadable manifest ({exc}); re-create the run or restore the file"
        ) from exc
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA_VERSION:
        raise RunDirError(f"{path}: field 'schema' must be {SCHEMA_VERSION!r}")
    known = {k: raw[k] for k in Manifest.__dataclass_fields__ if k in raw}
    try:
        return Manifest(**known)
    except TypeError as exc:
        raise RunDirError(f"{path}: missing field ({exc}); re-create the run") from exc
