"""Reading the YAML files users write (workloads, noise, scenarios) with one-line errors.

Every problem becomes a ``ConfigError`` whose first line names the file, the field and what to do,
so the CLI can print it and exit 2 without a traceback.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fabricpace._errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def data_dir(kind: str) -> Path:
    """Folder of shipped files of one kind (workloads, noise, scenarios)."""
    return Path(str(resources.files("fabricpace") / "data" / kind))


def presets(kind: str) -> list[str]:
    folder = data_dir(kind)
    if not folder.is_dir():
        return []
    names = {p.stem for p in folder.glob("*.yaml")} | {p.name for p in folder.iterdir() if p.is_dir()}
    return sorted(n for n in names if not n.startswith(("_", ".")))


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse a YAML mapping; unreadable or non-mapping files are ConfigErrors naming the file."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror}); check the path") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level, got {type(raw).__name__}")
    return raw


def validate(model: type[M], raw: dict[str, Any], *, source: str) -> M:
    """Validate ``raw`` against ``model``; the first error becomes a one-line ConfigError."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; check the spelling (see docs/simulator.md)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        raise ConfigError(f"{source}: field '{field}': {msg}") from exc


def resolve(name_or_path: str | Path, kind: str) -> tuple[Path, bool]:
    """A preset name or a file path -> (path, is_preset). Unknown names list the presets."""
    text = str(name_or_path)
    candidate = Path(text)
    if candidate.exists():
        return candidate, False
    shipped = data_dir(kind) / f"{text}.yaml"
    if "/" not in text and shipped.is_file():
        return shipped, True
    shipped_dir = data_dir(kind) / text
    if "/" not in text and shipped_dir.is_dir():
        return shipped_dir, True
    looks_like_file = text.endswith((".yaml", ".yml")) or "/" in text
    what = "file not found" if looks_like_file else f"unknown {kind[:-1]} preset"
    raise ConfigError(
        f"{text}: {what}; use a YAML file or one of the presets: {', '.join(presets(kind)) or '(none)'}"
    )
