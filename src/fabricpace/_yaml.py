"""Reading the YAML files users write, with one-line errors (shared by every config loader).

Every problem becomes a ``ConfigError`` whose first line names the file (and line or field) and what
to do, so the CLI can print it and exit 2 without a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fabricpace._errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def parse_yaml(text: str, *, source: str) -> dict[str, Any]:
    """Parse YAML text that must hold a mapping; ``source`` names it in errors."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise ConfigError(f"{source}: expected a mapping of fields at the top level, got {kind}")
    return raw


def read_yaml(path: Path) -> dict[str, Any]:
    """Read and parse a YAML mapping; unreadable or non-mapping files are ConfigErrors naming the file."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror}); check the path") from exc
    return parse_yaml(text, source=str(path))


def validate(model: type[M], raw: dict[str, Any], *, source: str, docs: str) -> M:
    """Validate ``raw`` against ``model``; the first error becomes a one-line ConfigError."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; check the spelling (see {docs})"
        elif err["type"] == "missing":
            msg = "required field is missing"
        raise ConfigError(f"{source}: field '{field}': {msg}") from exc
